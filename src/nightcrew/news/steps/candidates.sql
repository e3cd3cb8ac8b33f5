-- news.candidates: fetched, not yet written (candidates.py).

-- name: hold
-- Fetched items, minus what is already written; one already held keeps its place, and the
-- first source to list a URL is its source.
INSERT INTO news.candidates AS c (url, source_id, shard, title, summary, image_url,
                                  published_at, reason, created_at, updated_at)
SELECT i.url, i.source_id, %(shard)s, i.title, i.summary, i.image_url, i.published_at,
       'fetched', %(now)s, %(now)s
  FROM unnest(%(urls)b::text[], %(source_ids)b::bigint[], %(titles)b::text[],
              %(summaries)b::text[], %(images)b::text[], %(published)b::timestamptz[])
       WITH ORDINALITY AS i (url, source_id, title, summary, image_url, published_at, n)
 WHERE NOT EXISTS (SELECT 1 FROM news.articles a WHERE a.url = i.url)
 ORDER BY i.n
ON CONFLICT (url) DO NOTHING;

-- name: known
-- Of a run's new URLs, those a hold would skip: held already (any shard, any state) or written.
SELECT u.url
  FROM unnest(%(urls)b::text[]) AS u (url)
 WHERE EXISTS (SELECT 1 FROM news.candidates c WHERE c.url = u.url)
    OR EXISTS (SELECT 1 FROM news.articles a WHERE a.url = u.url);

-- name: forget_written
-- Held candidates that another run (or shard) has written meanwhile.
DELETE FROM news.candidates c
 WHERE c.shard = %(shard)s AND c.state = 'held'
   AND EXISTS (SELECT 1 FROM news.articles a WHERE a.url = c.url);

-- name: adopt_queued
-- An inline run takes over what the pipeline had admitted (queued, held for a backoff, or
-- dead-lettered) for this shard (the operator switched NEWS_PIPELINE back to inline): waiting
-- again, under a new fence, so a stage worker still busy with one of them cannot save its
-- result over the run's.
UPDATE news.candidates
   SET state = 'held', fence = fence + 1, not_before = NULL, admitted_at = NULL,
       updated_at = %(now)s
 WHERE shard = %(shard)s
   AND (state IN ('queued', 'dead') OR (state = 'held' AND admitted_at IS NOT NULL));

-- name: held
-- Oldest first, the candidates waiting for a run or pass to admit them: what earlier runs
-- deferred (the inline run puts what it fetched itself after these, from memory).
SELECT c.url, c.source_id, c.title, c.summary, c.image_url, c.published_at, c.reason,
       c.attempts, c.stage, c.verdict, c.translation,
       s.name AS source_name, s.shard AS source_shard
  FROM news.candidates c JOIN news.sources s ON s.id = c.source_id
 WHERE c.shard = %(shard)s AND c.state = 'held' AND c.admitted_at IS NULL
 ORDER BY c.created_at, c.id
 LIMIT %(limit)s;

-- name: held_by_source
SELECT s.name AS source_name, s.shard AS source_shard, count(*) AS n
  FROM news.candidates c JOIN news.sources s ON s.id = c.source_id
 WHERE c.shard = %(shard)s AND c.state = ANY(%(states)b::text[])
 GROUP BY s.name, s.shard;

-- name: defer_all_but
-- The shard's waiting candidates except those this run (or pass) is taking.
UPDATE news.candidates
   SET reason = %(reason)s, updated_at = %(now)s
 WHERE shard = %(shard)s AND state = 'held' AND admitted_at IS NULL
   AND NOT (url = ANY(%(taken)b::text[]));

-- name: count_held
-- deferredCount: the shard's candidates waiting for a later run or pass to admit them.
SELECT count(*) AS n FROM news.candidates
 WHERE shard = %(shard)s AND state = 'held' AND admitted_at IS NULL;

-- name: admission_load
-- What a pass admitted earlier that is still in flight: queued in a stage, or held for a
-- backoff or a lease held elsewhere. (An inline run finishes what it admits: none.)
SELECT count(*) AS n FROM news.candidates
 WHERE shard = %(shard)s AND admitted_at IS NOT NULL AND state IN ('held', 'queued');

-- name: admit
-- A pass admits these waiting candidates: queued at their stage (one with an image skips
-- enrich), each with its message in the outbox.
WITH moved AS (
    UPDATE news.candidates c
       SET state = 'queued', admitted_at = %(now)s, reason = 'admitted', not_before = NULL,
           stage = CASE WHEN c.stage = 'enrich' AND c.image_url IS NOT NULL THEN 'review'
                        ELSE c.stage END,
           updated_at = %(now)s
     WHERE c.url = ANY(%(urls)b::text[]) AND c.state = 'held' AND c.admitted_at IS NULL
    RETURNING c.url, c.shard, c.stage
)
-- each body a message's JSON, as messages.WorkOn writes it
INSERT INTO news.outbox (stage, body, created_at)
SELECT stage, jsonb_build_object('url', url, 'shard', shard), %(now)s FROM moved
RETURNING id, message_id, stage, body;

-- name: defer
UPDATE news.candidates
   SET reason = %(reason)s, updated_at = %(now)s,
       attempts = attempts + CASE WHEN %(attempted)s THEN 1 ELSE 0 END
 WHERE url = ANY(%(urls)b::text[]) AND state = 'held';

-- name: drop
DELETE FROM news.candidates WHERE url = ANY(%(urls)b::text[]);

-- name: reject
UPDATE news.candidates SET state = 'rejected', reason = %(reason)s, updated_at = %(now)s
 WHERE url = %(url)s;

-- name: keep_verdicts
-- A fenced-out run's paid reviews, kept on the candidates it could not write: ready to write
-- (stage 'write'), so whoever writes them next asks the model nothing again. Only candidates
-- still held and not judged already; the reasons come as one JSON array, in the urls' order.
UPDATE news.candidates c
   SET stage = 'write', verdict = v.verdict, translation = v.translation, updated_at = %(now)s
  FROM (SELECT u.url, u.translation, x.verdict
          FROM unnest(%(urls)b::text[], %(translations)b::text[])
               WITH ORDINALITY AS u (url, translation, n)
          JOIN jsonb_array_elements(%(verdicts)s::jsonb) WITH ORDINALITY AS x (verdict, n)
               USING (n)) v
 WHERE c.url = v.url AND c.state = 'held' AND c.stage <> 'write';
