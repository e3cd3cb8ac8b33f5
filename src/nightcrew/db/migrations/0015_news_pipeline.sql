-- nightcrew:scope nightcrew
--
-- The news pipeline on RabbitMQ (issue 13). PostgreSQL stays the record of every candidate's
-- state; a broker message only says "work on this now", so a lost, repeated or stale message
-- can neither lose nor repeat an article.
--
-- candidates.stage: the next stage the candidate needs (enrich → review → write).
-- candidates.state: `held` (waiting: backpressure, a model that failed for now, a lease held
-- elsewhere — released by the next pass), `queued` (owed to or in its stage's queue), `dead`
-- (dead-lettered after NEWS_MAX_DELIVERIES; `news dlq replay` queues it again), `rejected`.
-- candidates.fence: drawn up by every stage worker that takes the candidate (and by an inline
-- run adopting it); a stage's result is saved only under the fence it drew, so an older holder
-- (a redelivered message's first consumer) cannot overwrite a newer one.
-- candidates.verdict/translation: the review stage's result, read by the write stage.
-- candidates.not_before: a held candidate is not released before then (a model that failed
-- backs off; one whose lease a dead worker holds waits for it).
--
-- news.outbox: the messages owed to the broker, written in the transaction of the state change
-- that owes them, deleted once the broker confirmed them (the relay republishes what a crash
-- left behind).
--
-- sources.fetch_queued_at: a fetch message is owed or in flight (the pass does not enqueue the
-- source again); sources.watermark_*: the newest entry handed on, so a re-fetch skips what is
-- older without a per-item lookup.

ALTER TABLE news.candidates
    ADD COLUMN stage text NOT NULL DEFAULT 'enrich'
        CHECK (stage IN ('enrich', 'review', 'write')),
    ADD COLUMN fence bigint NOT NULL DEFAULT 0,
    ADD COLUMN verdict jsonb,
    ADD COLUMN translation text,
    ADD COLUMN last_error text,
    ADD COLUMN not_before timestamptz,
    DROP CONSTRAINT candidates_state_check,
    ADD CONSTRAINT candidates_state_check
        CHECK (state IN ('held', 'queued', 'dead', 'rejected'));

CREATE INDEX idx_news_candidates_stage ON news.candidates (stage, state, updated_at)
    WHERE state IN ('held', 'queued');

CREATE TABLE news.outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id uuid NOT NULL DEFAULT gen_random_uuid(),
    stage      text NOT NULL CHECK (stage IN ('fetch', 'enrich', 'review', 'write')),
    body       jsonb NOT NULL,
    created_at timestamptz NOT NULL
);

ALTER TABLE news.sources
    ADD COLUMN fetch_queued_at timestamptz,
    ADD COLUMN watermark_at timestamptz,
    ADD COLUMN watermark_urls text[] NOT NULL DEFAULT '{}';

-- The write stage marks a shard's snapshot stale; the debounced refresher publishes it.
CREATE TABLE news.snapshots (
    shard        text PRIMARY KEY,
    stale_since  timestamptz,
    published_at timestamptz
);

-- What the stage workers did, summed across processes for /metrics.
CREATE TABLE news.stage_counters (
    stage         text PRIMARY KEY,
    processed     bigint NOT NULL DEFAULT 0,
    failed        bigint NOT NULL DEFAULT 0,
    dead_lettered bigint NOT NULL DEFAULT 0
);
