-- nightcrew:scope nightcrew
--
-- Runs that die are recognised (issue 11): a running run refreshes heartbeat_at every few
-- seconds; a `running` row whose heartbeat is older than the grace period is marked
-- `abandoned` by the next run of its lane. A scheduled slot whose run was abandoned, or failed
-- because the database went away (report.retry = true), may be claimed again: `attempts`
-- counts the claims.

ALTER TABLE nightcrew.runs ADD COLUMN heartbeat_at timestamptz;
ALTER TABLE nightcrew.runs ADD COLUMN attempts integer NOT NULL DEFAULT 1;
ALTER TABLE nightcrew.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE nightcrew.runs ADD CONSTRAINT runs_status_check
    CHECK (status IN ('running', 'completed', 'failed', 'abandoned'));
CREATE INDEX idx_runs_running ON nightcrew.runs (lane) WHERE status = 'running';
