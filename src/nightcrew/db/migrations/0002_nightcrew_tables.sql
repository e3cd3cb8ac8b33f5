-- nightcrew:scope nightcrew
--
-- nightcrew's own tables: the in-database queue and the run history.

CREATE SCHEMA IF NOT EXISTS nightcrew;

-- The default queue backend (QUEUE_URL=postgres). Consumers read visible rows in id order.
CREATE TABLE nightcrew.queue_messages (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text NOT NULL,
    body       jsonb NOT NULL,
    visible_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_queue_messages_visible ON nightcrew.queue_messages (queue, visible_at, id);

-- One row per lane run. A scheduled run carries the cron slot it fires for; the unique
-- (lane, slot) pair is the claim that lets any number of replicas tick the same schedule
-- while exactly one of them runs each slot. Manual runs have no slot. Dry runs change nothing,
-- so they leave no row either.
CREATE TABLE nightcrew.runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lane        text NOT NULL,
    trigger     text NOT NULL CHECK (trigger IN ('manual', 'scheduled')),
    slot        timestamptz,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    status      text NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    report      jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_one_per_slot UNIQUE (lane, slot),
    CONSTRAINT runs_scheduled_have_slot CHECK ((trigger = 'scheduled') = (slot IS NOT NULL))
);
CREATE INDEX idx_runs_lane_started ON nightcrew.runs (lane, started_at DESC);
