-- public.feed_invalidation_outbox: durable feed-invalidation intents, written in the same
-- transaction as the change that needs them, delivered over the confirmable ?wait=1 lane.

-- name: record
INSERT INTO public.feed_invalidation_outbox (podcast_id, reason, created_at)
SELECT unnest(%(podcast_ids)s::uuid[]), %(reason)s, %(now)s
RETURNING id, podcast_id;

-- name: delivered
UPDATE public.feed_invalidation_outbox
   SET delivered_at = %(now)s, attempts = attempts + 1, last_error = NULL
 WHERE id = ANY(%(ids)s::uuid[]) AND delivered_at IS NULL;

-- name: failed
UPDATE public.feed_invalidation_outbox
   SET attempts = attempts + 1, last_error = %(error)s
 WHERE id = ANY(%(ids)s::uuid[]) AND delivered_at IS NULL;
