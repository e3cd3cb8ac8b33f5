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

-- name: adopt_feed_outbox
-- Undelivered feed_invalidation_outbox intents that no live effect drives, oldest first, at
-- most `limit`: the ones a caller just recorded (`ids`, in its transaction), or any (NULL:
-- written by the platform itself, or before this table existed). An intent without an effect
-- gets one: `feed_invalidate:<outbox id>`, one per intent (effects_one_per_key).
--
-- `revive` (the reconciler's apply runs): an intent is attempted whatever became of its earlier
-- effect. Spec 000's drain runs on every apply run and leaves a failed intent pending to be
-- retried, so an effect that died (a 401 during a secret rotation: 'permanent'; a week-long
-- outage: 'expired'; or settled in any other way while the intent is still owed) is not where
-- the intent ends, one waiting out its backoff is made due now, and one past its maximum age
-- but not yet settled (its last retry fell in a gap of the minute lane) gets a fresh one —
-- else the drain would settle it expired without a call. The effect is revived in
-- place, not superseded by a second one: the intent keeps exactly one effect, under the key
-- the first-attempt path, the drain's per-podcast grouping and `effects list` already know;
-- its attempts keep counting; and the death it came back from stays on the record in its
-- payload (`revived`: how many times, `last_death`: when, why, after how many attempts, the
-- error) once the next attempt has overwritten last_error. The intent's own attempts and
-- last_error (public.feed_invalidation_outbox) keep its delivery history as the spec asks.
-- Without `revive` (the minute lane's adoption, a caller's own new intents) a dead effect
-- stays dead and a live one keeps its backoff: a feed worker answering 401 answers it again
-- a minute later, so reviving every minute would be a hot loop of failed calls and warnings;
-- the daily apply run brings it back once a day (`effects retry` sooner, by hand).
WITH owed AS (
    SELECT f.id, f.podcast_id, f.created_at, e.id AS effect_id
      FROM public.feed_invalidation_outbox f
      LEFT JOIN nightcrew.effects e
             ON e.kind = 'feed_invalidate' AND e.key = 'feed_invalidate:' || f.id
     WHERE f.delivered_at IS NULL
       AND (%(ids)s::uuid[] IS NULL OR f.id = ANY(%(ids)s::uuid[]))
       AND (e.id IS NULL
            OR (%(revive)s
                AND e.delivered_at IS NULL
                AND (e.dead_at IS NOT NULL OR e.next_attempt_at > %(now)s
                     OR e.expires_at <= %(now)s)
                AND (e.claimed_until IS NULL OR e.claimed_until <= %(now)s)))
     ORDER BY f.created_at
     LIMIT %(limit)s
), revived AS (
    UPDATE nightcrew.effects e
       SET payload = CASE WHEN e.dead_at IS NULL THEN e.payload
                          ELSE e.payload || jsonb_build_object(
                                   'revived', coalesce((e.payload ->> 'revived')::int, 0) + 1,
                                   'last_death', jsonb_build_object(
                                       'dead_at', e.dead_at, 'dead_reason', e.dead_reason,
                                       'attempts', e.attempts, 'error', e.last_error)) END,
           dead_at = NULL, dead_reason = NULL,
           next_attempt_at = %(now)s, expires_at = %(expires_at)s
      FROM owed o
     WHERE e.id = o.effect_id
       -- re-checked on the row as it is now: a drain may have claimed or settled it since (a
       -- delivered effect is never revived: its delivery settled the intent too)
       AND e.delivered_at IS NULL
       AND (e.dead_at IS NOT NULL OR e.next_attempt_at > %(now)s OR e.expires_at <= %(now)s)
       AND (e.claimed_until IS NULL OR e.claimed_until <= %(now)s)
    RETURNING e.*
), adopted AS (
    INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at, expires_at)
    SELECT 'feed_invalidate', 'feed_invalidate:' || o.id,
           jsonb_build_object('podcast_id', o.podcast_id, 'outbox_id', o.id),
           %(now)s, %(now)s, %(expires_at)s
      FROM owed o
     WHERE o.effect_id IS NULL
     ORDER BY o.created_at
    ON CONFLICT ON CONSTRAINT effects_one_per_key DO NOTHING
    RETURNING *
)
SELECT *, false AS revived FROM adopted
UNION ALL
SELECT *, true AS revived FROM revived;
