-- The pipeline's outbox: messages owed to the broker (message_outbox.py).

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
-- each body a message's JSON, as messages.WorkOn writes it
INSERT INTO news.outbox (stage, body, created_at)
SELECT stage, jsonb_build_object('url', url, 'shard', shard), %(now)s FROM moved
RETURNING id, message_id, stage, body;

-- name: enqueue
-- One message to its stage (a stage handing a candidate on, a replay): its body is the
-- message record's JSON (messages.py).
INSERT INTO news.outbox (stage, body, created_at)
VALUES (%(stage)s, %(body)s, %(now)s)
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
