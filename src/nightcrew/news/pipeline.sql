-- The pipeline's state in PostgreSQL: the outbox, the pass, releasing held candidates
-- (issue 13). Admission is admission.sql's; holding a fetch's items, items.sql's.

-- name: held_in_stage
-- Held candidates of a stage (of one shard, or of all) that may go again now.
SELECT count(*) AS n FROM news.candidates
 WHERE (%(shard)s::text IS NULL OR shard = %(shard)s) AND stage = %(stage)s AND state = 'held'
   AND (not_before IS NULL OR not_before <= %(now)s);

-- name: release_held
-- The pass (one shard) or a worker's housekeeping (every shard): held candidates of one stage,
-- oldest first, as many as the stage has room for.
WITH picked AS (
    SELECT url FROM news.candidates
     WHERE (%(shard)s::text IS NULL OR shard = %(shard)s) AND stage = %(stage)s
       AND state = 'held' AND (not_before IS NULL OR not_before <= %(now)s)
     ORDER BY created_at, id
     LIMIT %(room)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE news.candidates c
       SET state = 'queued', reason = 'released', not_before = NULL, updated_at = %(now)s
      FROM picked
     WHERE c.url = picked.url
    RETURNING c.url, c.shard, c.stage
)
INSERT INTO news.outbox (stage, body, created_at)
SELECT stage, jsonb_build_object('url', url, 'shard', shard), %(now)s FROM moved
RETURNING id, message_id, stage, body;

-- name: resend_stale
-- Queued so long ago that its message must be gone (a purged queue, a broker that lost it):
-- sent again. Stages are idempotent, so a message that was only slow costs a no-op.
WITH stale AS (
    UPDATE news.candidates c SET updated_at = %(now)s
     WHERE c.shard = %(shard)s AND c.state = 'queued'
       AND c.updated_at < %(now)s - make_interval(secs => %(resend_after)s)
    RETURNING c.url, c.shard, c.stage
)
INSERT INTO news.outbox (stage, body, created_at)
SELECT stage, jsonb_build_object('url', url, 'shard', shard), %(now)s FROM stale
RETURNING id, message_id, stage, body;

-- name: enqueue_due_sources
-- The pass: every due source of the shard not already waiting for its fetch (or waiting so
-- long that its message must be gone) gets one fetch message.
WITH due AS (
    UPDATE news.sources SET fetch_queued_at = %(now)s
     WHERE shard = %(shard)s AND enabled AND parked_at IS NULL
       AND (next_check_at IS NULL OR next_check_at <= %(now)s)
       AND (fetch_queued_at IS NULL
            OR fetch_queued_at < %(now)s - make_interval(secs => %(resend_after)s))
    RETURNING id, shard
)
INSERT INTO news.outbox (stage, body, created_at)
SELECT 'fetch', jsonb_build_object('source_id', id, 'shard', shard), %(now)s FROM due
RETURNING id, message_id, stage, body;

-- name: enqueue
-- One candidate's message to its stage (a stage handing it on, a replay).
INSERT INTO news.outbox (stage, body, created_at)
VALUES (%(stage)s, jsonb_build_object('url', %(url)s::text, 'shard', %(shard)s::text), %(now)s)
RETURNING id, message_id, stage, body;

-- name: enqueue_fetch
INSERT INTO news.outbox (stage, body, created_at)
VALUES ('fetch', jsonb_build_object('source_id', %(source_id)s::bigint, 'shard',
        %(shard)s::text), %(now)s)
RETURNING id, message_id, stage, body;

-- name: delete_sent
DELETE FROM news.outbox WHERE id = ANY(%(ids)b::bigint[]);

-- name: unsent
-- What a crash (or a broker that was away) left in the outbox, for the relay.
SELECT id, message_id, stage, body FROM news.outbox
 WHERE created_at < %(before)s
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: shard_stages
-- The pass's report: the shard's candidates by stage and state.
SELECT stage, state, count(*) AS n FROM news.candidates
 WHERE shard = %(shard)s AND state IN ('held', 'queued', 'dead')
 GROUP BY stage, state;

-- name: stage_metrics
-- /metrics: every stage's queued (depth + in flight), held, dead, and its oldest queued age.
SELECT stage,
       count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'held') AS held,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       min(updated_at) FILTER (WHERE state = 'queued') AS oldest
  FROM news.candidates
 WHERE state IN ('held', 'queued', 'dead')
 GROUP BY stage
UNION ALL
SELECT 'fetch', count(*), 0, 0, min(fetch_queued_at)
  FROM news.sources WHERE fetch_queued_at IS NOT NULL;

-- name: stage_counters
SELECT stage, processed, failed, dead_lettered FROM news.stage_counters;

-- name: add_counters
INSERT INTO news.stage_counters AS s (stage, processed, failed, dead_lettered)
SELECT * FROM unnest(%(stages)b::text[], %(processed)b::bigint[], %(failed)b::bigint[],
                     %(dead)b::bigint[])
ON CONFLICT (stage) DO UPDATE
   SET processed = s.processed + excluded.processed,
       failed = s.failed + excluded.failed,
       dead_lettered = s.dead_lettered + excluded.dead_lettered;

-- name: previous_report
-- Where this pass's window of the workers' results starts: the shard's previous report (a
-- pass's or an inline run's).
SELECT max(started_at) AS at FROM news.worker_reports
 WHERE shard = %(shard)s AND started_at < %(now)s;

-- name: shard_results_since
-- The workers' results for the shard since the previous report: articles written, and their
-- reviews (every verdict counts, the offline rules' too, as in the inline run's report).
SELECT (SELECT count(*) FROM news.articles a
         WHERE a.shard = %(shard)s AND a.created_at > %(since)s
           AND a.created_at <= %(now)s) AS written,
       count(r.article_id) AS reviewed,
       count(r.article_id) FILTER (WHERE r.accepted) AS accepted,
       count(r.article_id) FILTER (WHERE NOT r.accepted) AS rejected
  FROM news.reviews r JOIN news.articles a ON a.id = r.article_id
 WHERE a.shard = %(shard)s AND r.created_at > %(since)s AND r.created_at <= %(now)s;

-- name: shard_review_waits
-- The shard's candidates waiting for another review attempt (the model failed for now), and
-- those parked because another worker holds their review lease (stages.py's park reason).
SELECT count(*) FILTER (WHERE attempts > 0) AS retried,
       count(*) FILTER (WHERE state = 'held'
                          AND reason LIKE 'its review lease is held elsewhere%%') AS lock_skipped
  FROM news.candidates
 WHERE shard = %(shard)s AND stage = 'review' AND state IN ('held', 'queued');
