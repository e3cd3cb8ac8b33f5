-- nightcrew:scope nightcrew
--
-- The news worker's output: articles (one per normalised URL), their reviews, the fencing
-- counter every write of a shard checks, and the saved run reports.

CREATE TABLE news.articles (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url          text NOT NULL UNIQUE,
    source_id    bigint REFERENCES news.sources (id) ON DELETE SET NULL,
    shard        text NOT NULL,
    title        text NOT NULL,
    summary      text NOT NULL DEFAULT '',
    image_url    text,
    published_at timestamptz,
    status       text NOT NULL CHECK (status IN ('accepted', 'rejected', 'unreviewed')),
    fence        bigint NOT NULL,
    created_at   timestamptz NOT NULL
);
CREATE INDEX idx_news_articles_no_image ON news.articles (created_at)
    WHERE image_url IS NULL AND status = 'accepted';
CREATE INDEX idx_news_articles_shard_recent ON news.articles (shard, created_at DESC)
    WHERE status = 'accepted';

CREATE TABLE news.reviews (
    article_id  bigint NOT NULL REFERENCES news.articles (id) ON DELETE CASCADE,
    reviewer    text NOT NULL,
    accepted    boolean NOT NULL,
    reasons     jsonb NOT NULL DEFAULT '[]',
    summary     text,
    translation text,
    created_at  timestamptz NOT NULL
);

-- Fencing: a write of a shard succeeds only with a fence at least as new as the newest seen.
CREATE TABLE news.shard_fences (
    shard text PRIMARY KEY,
    fence bigint NOT NULL
);

CREATE TABLE news.worker_reports (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    shard      text NOT NULL,
    trigger    text NOT NULL,
    started_at timestamptz NOT NULL,
    report     jsonb NOT NULL
);
CREATE INDEX idx_news_worker_reports_shard ON news.worker_reports (shard, started_at DESC);
