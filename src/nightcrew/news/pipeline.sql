-- The pipeline's state in PostgreSQL: the outbox, the pass, re-sending what was admitted
-- (pipeline.py). Admitting is candidates.sql's.

-- name: resend_due
-- A worker's housekeeping (every shard's) or a pass (its shard's): admitted candidates held for
-- a backoff or a lease held elsewhere, whose wait is over, queued again with a fresh message
-- (oldest first, a batch at a time; rows another worker is re-sending are skipped).
WITH picked AS (
    SELECT url FROM news.candidates
     WHERE state = 'held' AND admitted_at IS NOT NULL
       AND (not_before IS NULL OR not_before <= %(now)s)
       AND (%(shard)s::text IS NULL OR shard = %(shard)s)
     ORDER BY created_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE news.candidates c
       SET state = 'queued', reason = 'sent again', not_before = NULL, updated_at = %(now)s
      FROM picked
     WHERE c.url = picked.url
    RETURNING c.url, c.shard, c.stage
)
INSERT INTO news.outbox (stage, body, created_at)
SELECT stage, jsonb_build_object('url', url, 'shard', shard), %(now)s FROM moved
RETURNING id, message_id, stage, body;

-- name: unfetched
-- The shard's sources whose fetch message is owed or in flight: what a pass waits for.
SELECT count(*) AS n FROM news.sources WHERE shard = %(shard)s AND fetch_queued_at IS NOT NULL;

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
