-- The no-thumbnail retry (hydrate.py).

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
