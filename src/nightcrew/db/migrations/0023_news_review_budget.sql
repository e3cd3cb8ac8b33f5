-- nightcrew:scope nightcrew
--
-- Spec 001's cost bound and backpressure in the pipeline, per shard (issue 23).
--
-- news.review_budgets: MAX_AI_REVIEWS applies per shard per pass in the pipeline as it does per
-- run inline. Each pass of a shard opens a new window (pass_at, spent = 0); the review stage
-- spends one unit per model review it starts (offline-rule verdicts cost nothing and spend
-- none), and a candidate taken when the window's budget is spent is held for a later pass.
--
-- candidates.budget_held_at: when the review budget held the candidate back (NULL: it did
-- not). No housekeeping release sends such a candidate; the next pass of its shard lets the
-- oldest of them go, as many as its budget.
--
-- idx_news_candidates_shard_stage: admission counts a stage's load for one shard, so a busy
-- shard never holds another's work.

CREATE TABLE news.review_budgets (
    shard   text PRIMARY KEY,
    pass_at timestamptz NOT NULL,
    spent   integer NOT NULL DEFAULT 0 CHECK (spent >= 0)
);

ALTER TABLE news.candidates ADD COLUMN budget_held_at timestamptz;

CREATE INDEX idx_news_candidates_shard_stage ON news.candidates (shard, stage, state)
    WHERE state IN ('held', 'queued');
