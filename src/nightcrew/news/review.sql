-- Review (review.py).

-- name: written_among
-- The inline run: which of a batch were written since its look-up.
SELECT url FROM news.articles WHERE url = ANY(%(urls)b::text[]);

-- name: is_written
-- The pipeline's review stage: whether its candidate was written meanwhile.
SELECT 1 AS written FROM news.articles WHERE url = %(url)s;

-- name: translation_backlog
SELECT r.article_id, r.summary
  FROM news.reviews r JOIN news.articles a ON a.id = r.article_id
 WHERE a.shard = %(shard)s AND r.accepted AND r.summary IS NOT NULL AND r.translation IS NULL
 ORDER BY r.created_at, r.article_id
 LIMIT %(limit)s;

-- name: set_translation
UPDATE news.reviews SET translation = %(translation)s
 WHERE article_id = %(article_id)s AND translation IS NULL;
