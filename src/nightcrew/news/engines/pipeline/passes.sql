-- The pass (passes.py).

-- name: unfetched
-- Of the sources a pass sent to the fetch stage, those whose fetch is not done yet.
SELECT count(*) AS n FROM news.sources
 WHERE id = ANY(%(ids)b::bigint[]) AND fetch_queued_at IS NOT NULL;

-- name: resend_stale
-- Queued so long ago that its message must be gone (a purged queue, a broker that lost it):
-- sent again. Stages are idempotent, so a message that was only slow costs a no-op.
WITH stale AS (
    UPDATE news.candidates c SET updated_at = %(now)s
     WHERE c.shard = %(shard)s AND c.state = 'queued'
       AND c.updated_at < %(now)s - make_interval(secs => %(resend_after)s)
    RETURNING c.url, c.shard, c.stage
)
-- each body a message's JSON, as messages.WorkOn writes it
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
-- each body a message's JSON, as messages.FetchSource writes it
INSERT INTO news.outbox (stage, body, created_at)
SELECT 'fetch', jsonb_build_object('source_id', id, 'shard', shard), %(now)s FROM due
RETURNING id, message_id, stage, body;
