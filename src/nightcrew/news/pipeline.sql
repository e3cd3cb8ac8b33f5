-- The pipeline's state in PostgreSQL: the outbox, the pass, releasing held candidates
-- (issue 13). Admission is admission.sql's; holding a fetch's items, items.sql's.

-- name: held_groups
-- Held candidates that may go again now (of one shard, or of all), by shard and stage: each
-- shard's stage has its own room. A candidate the review budget held back (budget_held_at)
-- is not among them until a pass of its shard lets it go (unhold_over_budget).
SELECT shard, stage, count(*) AS n FROM news.candidates
 WHERE (%(shard)s::text IS NULL OR shard = %(shard)s) AND state = 'held'
   AND (not_before IS NULL OR not_before <= %(now)s) AND budget_held_at IS NULL
 GROUP BY shard, stage;

-- name: release_held
-- The pass or a worker's housekeeping: one shard's held candidates of one stage, oldest first,
-- as many as the shard's stage has room for.
WITH picked AS (
    SELECT url FROM news.candidates
     WHERE shard = %(shard)s AND stage = %(stage)s
       AND state = 'held' AND (not_before IS NULL OR not_before <= %(now)s)
       AND budget_held_at IS NULL
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

-- name: open_review_budget
-- A pass opens its shard's review budget window: MAX_AI_REVIEWS model reviews from now until
-- the shard's next pass.
INSERT INTO news.review_budgets (shard, pass_at, spent) VALUES (%(shard)s, %(now)s, 0)
ON CONFLICT (shard) DO UPDATE SET pass_at = excluded.pass_at, spent = 0;

-- name: unhold_over_budget
-- The pass: the oldest candidates the review budget held back, at most this pass's budget
-- (NULL: all of them — no model spends it now), may be released again.
WITH picked AS (
    SELECT url FROM news.candidates
     WHERE shard = %(shard)s AND stage = 'review' AND state = 'held'
       AND budget_held_at IS NOT NULL
     ORDER BY created_at, id
     LIMIT %(budget)s
       FOR UPDATE SKIP LOCKED
)
UPDATE news.candidates c SET budget_held_at = NULL, updated_at = %(now)s
  FROM picked
 WHERE c.url = picked.url
RETURNING c.url;

-- name: over_budget_waiting
SELECT count(*) AS n FROM news.candidates
 WHERE shard = %(shard)s AND stage = 'review' AND state = 'held' AND budget_held_at IS NOT NULL;

-- name: spend_review
-- The review stage, before a model review: one unit of the shard's budget for this pass, if
-- any is left (no row: spent). A shard no pass has opened a window for gets one now.
INSERT INTO news.review_budgets AS b (shard, pass_at, spent)
SELECT %(shard)s, %(now)s, 1 WHERE %(budget)s > 0
ON CONFLICT (shard) DO UPDATE SET spent = b.spent + 1 WHERE b.spent < %(budget)s
RETURNING spent;

-- name: hold_over_budget
-- The budget is spent: the candidate the review stage took waits, held, for a later pass
-- (budget_held_at: no worker's housekeeping releases it before that pass lets it go).
UPDATE news.candidates
   SET state = 'held', reason = %(reason)s, not_before = NULL, budget_held_at = %(now)s,
       updated_at = %(now)s
 WHERE url = %(url)s AND stage = 'review' AND fence = %(fence)s AND state = 'queued'
RETURNING url;
