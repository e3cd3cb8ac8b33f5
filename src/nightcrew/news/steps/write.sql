-- Writing articles and their reviews (write.py).

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

-- name: drop_written_candidate
-- The pipeline's write stage: its candidate, gone with the article's write (under its fence),
-- and, when the article was written now, the write noted for the next pass's report (the
-- workers' results: reason the status, source 'translated' when translated with its review).
WITH gone AS (
    DELETE FROM news.candidates WHERE url = %(url)s AND fence = %(fence)s RETURNING url, shard
), noted AS (
    INSERT INTO news.report_notes (shard, kind, source, reason, n, at)
    SELECT shard, 'written', %(translated)s, %(status)s, 1, %(now)s FROM gone WHERE %(written)s
)
SELECT url FROM gone;
