-- Run history (nightcrew.runs). `now` comes from the Clock like every other decision.

-- name: claim_scheduled_slot
-- The cross-replica claim: exactly one INSERT per (lane, slot) succeeds.
INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, status)
VALUES (%(lane)s, 'scheduled', %(slot)s, %(now)s, 'running')
ON CONFLICT ON CONSTRAINT runs_one_per_slot DO NOTHING
RETURNING id;

-- name: start_manual_run
INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, status)
VALUES (%(lane)s, 'manual', NULL, %(now)s, 'running')
RETURNING id;

-- name: finish_run
UPDATE nightcrew.runs
   SET status = %(status)s, finished_at = %(now)s, report = %(report)s
 WHERE id = %(id)s;

-- name: recent_runs
SELECT id, lane, trigger, slot, started_at, finished_at, status, report
  FROM nightcrew.runs
 WHERE lane = %(lane)s
 ORDER BY started_at DESC, id DESC
 LIMIT %(limit)s;
