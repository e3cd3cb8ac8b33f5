-- Run history (nightcrew.runs). `now` comes from the Clock like every other decision.

-- name: abandon_stale
-- A running run of this lane whose heartbeat stopped: its process died (SIGKILL, a lost
-- machine) or lost the database for longer than the grace period.
UPDATE nightcrew.runs
   SET status = 'abandoned', finished_at = %(now)s,
       report = coalesce(report, '{}'::jsonb)
                || jsonb_build_object('abandoned', 'no heartbeat since '
                                      || coalesce(heartbeat_at, started_at)::text)
 WHERE lane = %(lane)s AND status = 'running'
   AND coalesce(heartbeat_at, started_at) < %(now)s - make_interval(secs => %(grace_seconds)s)
RETURNING id, slot;

-- name: claim_scheduled_slot
-- The cross-replica claim: exactly one INSERT per (lane, slot) succeeds — or one UPDATE, when
-- the slot's run was abandoned or failed for want of a database (it is run again).
-- Not while an operator's "run now" of the lane runs (requested_by set; the caller holds the
-- lane's lock, so the two cannot start together): that run is the slot's run, and the slot is
-- left unclaimed.
INSERT INTO nightcrew.runs AS r (lane, trigger, slot, started_at, heartbeat_at, status)
SELECT %(lane)s, 'scheduled', %(slot)s, %(now)s, %(now)s, 'running'
 WHERE NOT EXISTS (SELECT 1 FROM nightcrew.runs m
                    WHERE m.lane = %(lane)s AND m.status = 'running' AND m.trigger = 'manual'
                      AND m.requested_by IS NOT NULL)
ON CONFLICT ON CONSTRAINT runs_one_per_slot DO UPDATE
   SET started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
       status = 'running', finished_at = NULL,
       report = jsonb_build_object('previous', r.report), attempts = r.attempts + 1
 WHERE r.status = 'abandoned' OR (r.status = 'failed' AND r.report ->> 'retry' = 'true')
RETURNING id, attempts AS attempt;

-- name: lane_lock
-- Serialises the start of a lane's runs (scheduled claims and operators' manual runs) until
-- the caller's transaction ends: each then sees what the other started.
SELECT pg_advisory_xact_lock(hashtextextended('nightcrew.runs:' || %(lane)s, 0));

-- name: start_manual_run
-- An operator's run (requested_by set) starts only when no run of its lane is running; an
-- unattributed manual run (a test, a script) starts regardless, as it always has.
INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, heartbeat_at, status, requested_by)
SELECT %(lane)s, 'manual', NULL, %(now)s, %(now)s, 'running', %(requested_by)s
 WHERE %(requested_by)s::text IS NULL
    OR NOT EXISTS (SELECT 1 FROM nightcrew.runs r
                    WHERE r.lane = %(lane)s AND r.status = 'running')
RETURNING id;

-- name: running_run
SELECT id, trigger, slot, started_at, requested_by
  FROM nightcrew.runs
 WHERE lane = %(lane)s AND status = 'running'
 ORDER BY started_at DESC, id DESC
 LIMIT 1;

-- name: heartbeat
UPDATE nightcrew.runs SET heartbeat_at = %(now)s
 WHERE id = %(id)s AND status = 'running' AND attempts = %(attempt)s;

-- name: finish_run
-- Only this claim's run: a run abandoned and re-claimed meanwhile is its successor's to finish.
-- A re-run keeps what its earlier attempt left (report.previous).
UPDATE nightcrew.runs
   SET status = %(status)s, finished_at = %(now)s,
       report = CASE WHEN report ? 'previous'
                     THEN %(report)s || jsonb_build_object('previous', report -> 'previous')
                     ELSE %(report)s END
 WHERE id = %(id)s AND attempts = %(attempt)s;

-- name: slot_owed
-- Whether a scheduled slot still has to run: no run claimed it, or its run would be claimed
-- again (abandoned, or failed for want of a database) — as claim_scheduled_slot decides.
SELECT NOT EXISTS (
         SELECT 1 FROM nightcrew.runs r
          WHERE r.lane = %(lane)s AND r.slot = %(slot)s
            -- coalesce: a failed row without a retry flag (written before the flag existed,
            -- or by hand) is not claimed again, so it is not owed either (NULL would say owed)
            AND NOT coalesce(r.status = 'abandoned'
                             OR (r.status = 'failed' AND r.report ->> 'retry' = 'true'), false)
       ) AS owed;
