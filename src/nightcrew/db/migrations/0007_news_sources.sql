-- nightcrew:scope nightcrew
--
-- The news worker's feed sources (schema `news`, owned by nightcrew). A source that fails
-- PARK_AFTER_FAILURES times in a row is parked (parked_at) and skipped until re-enabled.

CREATE SCHEMA IF NOT EXISTS news;

CREATE TABLE news.sources (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                 text NOT NULL,
    feed_url             text NOT NULL UNIQUE,
    shard                text NOT NULL DEFAULT 'default',
    enabled              boolean NOT NULL DEFAULT true,
    etag                 text,
    last_modified        text,
    consecutive_failures integer NOT NULL DEFAULT 0,
    last_error           text,
    last_fetched_at      timestamptz,
    next_check_at        timestamptz,
    parked_at            timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_news_sources_due ON news.sources (shard, next_check_at)
    WHERE enabled AND parked_at IS NULL;
