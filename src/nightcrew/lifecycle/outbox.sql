-- public.feed_invalidation_outbox: durable feed-invalidation intents, written in the same
-- transaction as the change that needs them. Each intent is driven by a feed_invalidate
-- effect (nightcrew.effects), recorded in the same statement, delivered over the confirmable
-- ?wait=1 lane.

-- name: record
WITH intents AS (
    INSERT INTO public.feed_invalidation_outbox (podcast_id, reason, created_at)
    SELECT unnest(%(podcast_ids)s::uuid[]), %(reason)s, %(now)s
    RETURNING id, podcast_id
)
INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at, expires_at)
SELECT 'feed_invalidate', 'feed_invalidate:' || id,
       jsonb_build_object('podcast_id', podcast_id, 'outbox_id', id),
       %(now)s, %(now)s, %(expires_at)s
  FROM intents
RETURNING *;

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
