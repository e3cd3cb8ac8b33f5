-- nightcrew:scope nightcrew
--
-- Operator actions (issue 25): what an operator did from the dashboard or the command line —
-- re-drove or dropped an effect, replayed or purged a dead letter, enabled a source, ran a lane
-- now — with which ids and from which client, so the pages show who did what. A dropped
-- effect's row is gone: this is where it is remembered.
--
-- runs.requested_by: who asked for a manual run ("dashboard 127.0.0.1", "cli"). Such a run is
-- exclusive: it starts only when no run of its lane is running, and a scheduled slot is not
-- claimed while it runs (runs.sql, under a per-lane advisory lock), so a "run now" never
-- doubles a scheduled run.

CREATE TABLE nightcrew.actions (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    source  text NOT NULL CHECK (source IN ('dashboard', 'cli')),
    action  text NOT NULL,
    target  text NOT NULL,          -- what it was about: an effect kind, a stage, a lane
    ids     text[] NOT NULL DEFAULT '{}',
    client  text,                    -- the client address (dashboard) or the user (cli)
    outcome jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX idx_actions_at ON nightcrew.actions (at, id);
CREATE INDEX idx_actions_target_at ON nightcrew.actions (action, at, id);

ALTER TABLE nightcrew.runs ADD COLUMN requested_by text;
