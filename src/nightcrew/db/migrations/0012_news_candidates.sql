-- nightcrew:scope nightcrew
--
-- Fetched candidates wait here until they are written (issue 10): a run that defers work —
-- backpressure, MAX_AI_REVIEWS, a lost lease, a model that failed for now — leaves them
-- `held` with the reason, and the next run takes them first, although the feed itself will
-- answer 304. A candidate whose write is impossible (the database refuses the row) is
-- `rejected` with the reason, so it is neither retried forever nor fetched again.
--
-- sources.body_hash: the SHA-256 of the last body parsed, for servers that send neither ETag
-- nor Last-Modified: the same bytes again are not parsed again.

CREATE TABLE news.candidates (
    id           bigint GENERATED ALWAYS AS IDENTITY,
    url          text PRIMARY KEY,
    source_id    bigint NOT NULL REFERENCES news.sources (id) ON DELETE CASCADE,
    shard        text NOT NULL,
    title        text NOT NULL,
    summary      text NOT NULL,
    image_url    text,
    published_at timestamptz,
    state        text NOT NULL DEFAULT 'held' CHECK (state IN ('held', 'rejected')),
    reason       text NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE INDEX idx_news_candidates_held ON news.candidates (shard, created_at, id)
    WHERE state = 'held';

ALTER TABLE news.sources ADD COLUMN body_hash text;
