-- public.feed_invalidation_outbox: durable feed-invalidation intents, written in the same
-- transaction as the change that needs them. Each intent is driven by a feed_invalidate
-- effect (nightcrew.effects), recorded in the same transaction, delivered over the
-- confirmable ?wait=1 lane.

-- name: record
INSERT INTO public.feed_invalidation_outbox (podcast_id, reason, created_at)
SELECT unnest(%(podcast_ids)s::uuid[]), %(reason)s, %(now)s
RETURNING id;

-- name: pending_for_podcast
-- What one confirmed invalidation of this podcast settles: every intent owed before the call.
SELECT id FROM public.feed_invalidation_outbox
 WHERE podcast_id = %(podcast_id)s AND delivered_at IS NULL;

-- name: delivered
UPDATE public.feed_invalidation_outbox
   SET delivered_at = %(now)s, attempts = attempts + 1, last_error = NULL
 WHERE id = ANY(%(ids)s::uuid[]) AND delivered_at IS NULL;

-- name: failed
UPDATE public.feed_invalidation_outbox
   SET attempts = attempts + 1, last_error = %(error)s
 WHERE id = ANY(%(ids)s::uuid[]) AND delivered_at IS NULL;

-- name: count_pending
-- How many intents are still owed (the partial index of undelivered rows, never the history).
SELECT count(*) AS n FROM public.feed_invalidation_outbox WHERE delivered_at IS NULL;
