-- The pipeline's figures for /metrics (metrics.py).

-- name: stage_metrics
-- /metrics: every stage's queued (depth + in flight), held, dead, and its oldest queued age.
SELECT stage,
       count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'held') AS held,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       min(updated_at) FILTER (WHERE state = 'queued') AS oldest
  FROM news.candidates
 WHERE state IN ('held', 'queued', 'dead')
 GROUP BY stage
UNION ALL
SELECT 'fetch', count(*), 0, 0, min(fetch_queued_at)
  FROM news.sources WHERE fetch_queued_at IS NOT NULL;

-- name: stage_counters
SELECT stage, processed, failed, dead_lettered FROM news.stage_counters;

-- name: add_counters
INSERT INTO news.stage_counters AS s (stage, processed, failed, dead_lettered)
SELECT * FROM unnest(%(stages)b::text[], %(processed)b::bigint[], %(failed)b::bigint[],
                     %(dead)b::bigint[])
ON CONFLICT (stage) DO UPDATE
   SET processed = s.processed + excluded.processed,
       failed = s.failed + excluded.failed,
       dead_lettered = s.dead_lettered + excluded.dead_lettered;
