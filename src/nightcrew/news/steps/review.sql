-- Review (review.py).

-- name: written_among
-- Which of a batch (the inline run's) or of one candidate (the review stage's) were written
-- since they were looked up.
SELECT url FROM news.articles WHERE url = ANY(%(urls)b::text[]);

-- name: translation_backlog
SELECT r.article_id, r.summary
  FROM news.reviews r JOIN news.articles a ON a.id = r.article_id
 WHERE a.shard = %(shard)s AND r.accepted AND r.summary IS NOT NULL AND r.translation IS NULL
 ORDER BY r.created_at, r.article_id
 LIMIT %(limit)s;

-- name: set_translation
UPDATE news.reviews SET translation = %(translation)s
 WHERE article_id = %(article_id)s AND translation IS NULL;
