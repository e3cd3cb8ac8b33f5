-- The news run's statements (spec 001).

-- name: processed_urls
SELECT url FROM news.articles WHERE url = ANY(%(urls)s::text[]);

-- name: article_count
SELECT news.article_count() AS n;

-- name: claim_fence
-- The fencing check: this holder's fence must be at least the newest any writer has used.
INSERT INTO news.shard_fences AS f (shard, fence) VALUES (%(shard)s, %(fence)s)
ON CONFLICT (shard) DO UPDATE SET fence = excluded.fence WHERE f.fence <= excluded.fence
RETURNING fence;

-- name: insert_article
INSERT INTO news.articles (url, source_id, shard, title, summary, image_url, published_at,
                           status, fence, created_at)
VALUES (%(url)s, %(source_id)s, %(shard)s, %(title)s, %(summary)s, %(image_url)s,
        %(published_at)s, %(status)s, %(fence)s, %(now)s)
ON CONFLICT (url) DO NOTHING
RETURNING id;

-- name: insert_review
INSERT INTO news.reviews (article_id, reviewer, accepted, reasons, summary, translation,
                          created_at)
VALUES (%(article_id)s, %(reviewer)s, %(accepted)s, %(reasons)s, %(summary)s, %(translation)s,
        %(now)s);

-- name: retry_candidates
-- Accepted articles still without a thumbnail, old enough to try their page again.
SELECT id, url FROM news.articles
 WHERE image_url IS NULL AND status = 'accepted' AND shard = %(shard)s
   AND created_at < %(now)s - make_interval(secs => %(retry_age_seconds)s)
 ORDER BY created_at LIMIT %(limit)s;

-- name: set_image
UPDATE news.articles SET image_url = %(image_url)s WHERE id = %(id)s AND image_url IS NULL;

-- name: snapshot
SELECT url, title, summary, image_url, published_at, created_at
  FROM news.articles
 WHERE shard = %(shard)s AND status = 'accepted'
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: save_report
INSERT INTO news.worker_reports (shard, trigger, started_at, report)
VALUES (%(shard)s, %(trigger)s, %(now)s, %(report)s)
RETURNING id;

-- name: latest_reports
SELECT DISTINCT ON (shard) shard, trigger, started_at, report
  FROM news.worker_reports
 ORDER BY shard, started_at DESC, id DESC;
