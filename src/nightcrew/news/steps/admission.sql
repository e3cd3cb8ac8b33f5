-- Spec 001's backpressure: the article count (admission.py).

-- name: article_count
SELECT news.article_count() AS n;
