-- The news run's statements (spec 001).

-- name: processed_urls
SELECT url FROM news.articles WHERE url = ANY(%(urls)b::text[]);

-- name: article_count
SELECT news.article_count() AS n;

-- name: draw_fence
-- A new holder's fence: one more than any holder of the shard has drawn, whichever lease
-- backend (Redis, or PostgreSQL while Redis is down) granted the lease.
INSERT INTO news.shard_fences AS f (shard, fence) VALUES (%(shard)s, 1)
ON CONFLICT (shard) DO UPDATE SET fence = f.fence + 1
RETURNING fence;

-- name: claim_fence
-- The fencing check: this holder's fence must be at least the newest any writer has used.
INSERT INTO news.shard_fences AS f (shard, fence) VALUES (%(shard)s, %(fence)s)
ON CONFLICT (shard) DO UPDATE SET fence = excluded.fence WHERE f.fence <= excluded.fence
RETURNING fence;

-- name: insert_articles
INSERT INTO news.articles (url, source_id, shard, title, summary, image_url, published_at,
                           status, fence, created_at)
SELECT a.url, a.source_id, %(shard)s, a.title, a.summary, a.image_url, a.published_at,
       a.status, %(fence)s, %(now)s
  FROM unnest(%(urls)b::text[], %(source_ids)b::bigint[], %(titles)b::text[],
              %(summaries)b::text[], %(images)b::text[], %(published)b::timestamptz[],
              %(statuses)b::text[])
       AS a (url, source_id, title, summary, image_url, published_at, status)
ON CONFLICT (url) DO NOTHING
RETURNING id, url;

-- name: insert_reviews
-- The reasons come as one JSON array (one document, not one parameter per review).
INSERT INTO news.reviews (article_id, reviewer, accepted, reasons, summary, translation,
                          created_at)
SELECT r.article_id, r.reviewer, r.accepted, x.reasons, r.summary, r.translation, %(now)s
  FROM unnest(%(article_ids)b::bigint[], %(reviewers)b::text[], %(accepted)b::boolean[],
              %(summaries)b::text[], %(translations)b::text[])
       WITH ORDINALITY AS r (article_id, reviewer, accepted, summary, translation, n)
  JOIN jsonb_array_elements(%(reasons)s::jsonb) WITH ORDINALITY AS x (reasons, n) USING (n);

-- name: retry_candidates
-- Accepted articles still without a thumbnail whose last try (or creation) is older than the
-- retry age, least recently tried first.
SELECT id, url FROM news.articles
 WHERE image_url IS NULL AND status = 'accepted' AND shard = %(shard)s
   AND coalesce(thumbnail_attempted_at, created_at)
       < %(now)s - make_interval(secs => %(retry_age_seconds)s)
 ORDER BY coalesce(thumbnail_attempted_at, created_at), id
 LIMIT %(limit)s;

-- name: mark_thumbnail_attempts
UPDATE news.articles SET thumbnail_attempted_at = %(now)s WHERE id = ANY(%(ids)b::bigint[]);

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

-- name: translation_backlog
SELECT r.article_id, r.summary
  FROM news.reviews r JOIN news.articles a ON a.id = r.article_id
 WHERE a.shard = %(shard)s AND r.accepted AND r.summary IS NOT NULL AND r.translation IS NULL
 ORDER BY r.created_at, r.article_id
 LIMIT %(limit)s;

-- name: set_translation
UPDATE news.reviews SET translation = %(translation)s
 WHERE article_id = %(article_id)s AND translation IS NULL;
