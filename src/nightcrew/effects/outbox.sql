-- nightcrew.effects: the outbox of every effect that leaves the database.

-- name: record
-- Inside the caller's transaction. One effect per (kind, key): a second caller owing the same
-- effect (the other entry point, a re-run) gets the existing row instead of a second send.
INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at, expires_at)
VALUES (%(kind)s, %(key)s, %(payload)s, %(now)s, %(due)s, %(expires_at)s)
ON CONFLICT ON CONSTRAINT effects_one_per_key DO NOTHING
RETURNING *;

-- name: release
-- Held effects (recorded with a later due time: a hard delete's feed invalidation waits for
-- its storage cleanup) made due now; the age they may reach is counted from now. One in
-- flight or settled is left as it is.
UPDATE nightcrew.effects
   SET next_attempt_at = %(now)s, expires_at = %(now)s + (expires_at - next_attempt_at)
 WHERE id = ANY(%(ids)s::bigint[])
   AND delivered_at IS NULL AND dead_at IS NULL AND claimed_until IS NULL
   AND next_attempt_at > %(now)s
RETURNING *;

-- name: by_key
SELECT * FROM nightcrew.effects WHERE kind = %(kind)s AND key = %(key)s;

-- name: claim_due
-- Due effects, oldest due first. The claim pushes next_attempt_at past the delivery's time
-- limit (the in-flight lease): no other drain, on any replica, takes them meanwhile; a
-- process killed mid-delivery leaves them due again when the lease runs out.
UPDATE nightcrew.effects e
   SET attempts = e.attempts + 1, last_attempt_at = %(now)s,
       next_attempt_at = %(lease_until)s, claimed_until = %(lease_until)s
 WHERE e.id IN (SELECT id FROM nightcrew.effects
                 WHERE delivered_at IS NULL AND dead_at IS NULL
                   AND next_attempt_at <= %(now)s
                   AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
                 ORDER BY next_attempt_at, id
                 LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED)
RETURNING e.*;

-- name: claim_ids
-- The first attempt, right after the commit that recorded them (same lease as claim_due):
-- whichever of this caller and a concurrent drain claims first delivers.
UPDATE nightcrew.effects e
   SET attempts = e.attempts + 1, last_attempt_at = %(now)s,
       next_attempt_at = %(lease_until)s, claimed_until = %(lease_until)s
 WHERE e.id IN (SELECT id FROM nightcrew.effects
                 WHERE id = ANY(%(ids)s::bigint[])
                   AND delivered_at IS NULL AND dead_at IS NULL
                   AND next_attempt_at <= %(now)s
                   FOR UPDATE SKIP LOCKED)
RETURNING e.*;

-- name: settle
-- Every outcome of a batch in one statement. 'released' gives a claim back untried (the drain
-- ran out of time before starting it).
UPDATE nightcrew.effects e
   SET delivered_at = CASE WHEN u.outcome = 'delivered' THEN %(now)s END,
       dead_at = CASE WHEN u.outcome IN ('permanent', 'expired') THEN %(now)s END,
       dead_reason = CASE WHEN u.outcome IN ('permanent', 'expired') THEN u.outcome END,
       next_attempt_at = coalesce(u.next_at, e.next_attempt_at),
       attempts = CASE WHEN u.outcome = 'released' OR u.unsent THEN e.attempts - 1
                       ELSE e.attempts END,
       claimed_until = NULL,
       last_error = CASE WHEN u.outcome = 'released' THEN e.last_error ELSE u.error END
  FROM unnest(%(ids)s::bigint[], %(outcomes)s::text[], %(next_at)s::timestamptz[],
              %(errors)s::text[], %(claims)s::timestamptz[], %(unsent)s::boolean[])
           AS u (id, outcome, next_at, error, claimed_until, unsent)
 WHERE e.id = u.id AND e.delivered_at IS NULL AND e.dead_at IS NULL
   -- only the claim that made the attempt settles it (a claimant that stalled past its lease
   -- finds the effect claimed by another, and leaves it to that one)
   AND e.claimed_until IS NOT DISTINCT FROM u.claimed_until;

-- name: counts
-- Pending and dead per kind: the undelivered partial index, never the delivered history.
SELECT kind,
       count(*) FILTER (WHERE dead_at IS NULL) AS pending,
       count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead
  FROM nightcrew.effects
 WHERE delivered_at IS NULL
 GROUP BY kind;

-- name: list
SELECT id, kind, key, payload, created_at, next_attempt_at, expires_at, attempts,
       last_attempt_at, claimed_until, last_error, delivered_at, dead_at, dead_reason
  FROM nightcrew.effects
 WHERE delivered_at IS NULL
   AND (%(dead)s::boolean IS NULL OR (dead_at IS NOT NULL) = %(dead)s)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s)
 ORDER BY id
 LIMIT %(limit)s;

-- name: get
SELECT * FROM nightcrew.effects WHERE id = %(id)s;

-- name: retry
-- Re-drive undelivered effects now, with a fresh maximum age. A delivered one is left alone,
-- and so is one whose attempt is in flight (it would be a second delivery at once); --dead
-- skips the superseded (an email about a state that no longer holds), an explicit ID does not.
-- At most %(limit)s of them (NULL: all), the oldest first: a page's bulk retry is bounded and
-- pages through the rest with the next request.
UPDATE nightcrew.effects e
   SET dead_at = NULL, dead_reason = NULL, next_attempt_at = %(now)s,
       expires_at = %(now)s + (e.expires_at - e.created_at)
  FROM (SELECT id FROM nightcrew.effects
         WHERE delivered_at IS NULL
           AND (claimed_until IS NULL OR claimed_until <= %(now)s)
           AND (id = ANY(%(ids)s::bigint[])
                OR (%(all_dead)s AND dead_at IS NOT NULL AND dead_reason <> 'superseded'
                    AND (%(kind)s::text IS NULL OR kind = %(kind)s)))
         ORDER BY id
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED) picked
 WHERE e.id = picked.id
RETURNING e.*;

-- name: count_retryable_dead
-- What a bulk retry of ``kind`` (NULL: every kind) would re-drive: its confirmation step.
SELECT count(*) AS n FROM nightcrew.effects
 WHERE delivered_at IS NULL AND dead_at IS NOT NULL AND dead_reason <> 'superseded'
   AND (%(kind)s::text IS NULL OR kind = %(kind)s);

-- name: supersede
-- Undelivered effects that a later state change made wrong to deliver (a nag after a restore,
-- a `podcast.suspended` after a `podcast.restored`): given up, unless an attempt is in flight.
UPDATE nightcrew.effects
   SET dead_at = coalesce(dead_at, %(now)s), dead_reason = 'superseded', last_error = %(reason)s
 WHERE kind = %(kind)s
   AND delivered_at IS NULL
   AND (claimed_until IS NULL OR claimed_until <= %(now)s)
   AND (key = ANY(%(keys)s::text[]) OR key LIKE ANY(%(patterns)s::text[]))
RETURNING id, key;

-- name: drop
DELETE FROM nightcrew.effects
 WHERE id = %(id)s AND delivered_at IS NULL
   AND (claimed_until IS NULL OR claimed_until <= %(now)s)
RETURNING id, kind, key, payload, attempts, last_error, dead_at;

-- name: purge_delivered
-- Retention: delivered rows older than the cut-off, a bounded batch per call.
DELETE FROM nightcrew.effects
 WHERE id IN (SELECT id FROM nightcrew.effects
               WHERE delivered_at IS NOT NULL AND delivered_at < %(before)s
               ORDER BY delivered_at
               LIMIT %(limit)s);
