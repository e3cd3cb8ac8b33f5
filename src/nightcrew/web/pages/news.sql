-- name: news_shards
SELECT DISTINCT shard FROM news.sources ORDER BY shard;

-- name: news_series
-- The last reports of each shard, oldest first within it, for the queued/deferred chart.
SELECT s.shard, w.started_at,
       nightcrew.report_number(w.report, 'queuedCount') AS queued,
       nightcrew.report_number(w.report, 'deferredCount') AS deferred,
       -- a pipeline pass writes nothing itself: its workers' results since the last report
       nightcrew.report_number(coalesce(w.report -> 'workers', w.report), 'processedCount')
           AS processed
  FROM unnest(%(shards)s::text[]) AS s (shard)
 CROSS JOIN LATERAL (
     SELECT started_at, report FROM news.worker_reports w
      WHERE w.shard = s.shard
      ORDER BY w.started_at DESC, w.id DESC LIMIT %(points)s) w
 ORDER BY s.shard, w.started_at;

-- name: news_parked
SELECT id, name, feed_url, shard, consecutive_failures, last_error, parked_at
  FROM news.sources
 WHERE parked_at IS NOT NULL
 ORDER BY parked_at DESC, id DESC
 LIMIT %(limit)s;

-- name: news_address_refused
-- Sources whose last fetch was refused for the feed's address (not parked yet): the page says
-- which setting allows them.
SELECT id, name, feed_url, shard, consecutive_failures, last_error, next_check_at
  FROM news.sources
 WHERE parked_at IS NULL AND enabled
   AND last_error ~ '(is not a public address|is an internal name|resolves to a non-public address)'
 ORDER BY id
 LIMIT %(limit)s;

-- name: news_recent_runs
-- Each shard's recent reports, newest first (the first is the page's latest): what the runs
-- did, not only the last one.
SELECT s.shard, w.trigger, w.started_at, w.report
  FROM unnest(%(shards)s::text[]) AS s (shard)
 CROSS JOIN LATERAL (
     SELECT id, trigger, started_at, report FROM news.worker_reports w
      WHERE w.shard = s.shard
      ORDER BY w.started_at DESC, w.id DESC LIMIT %(limit)s) w
 ORDER BY s.shard, w.started_at DESC, w.id DESC;

-- name: news_source_counts
SELECT count(*) AS sources,
       count(*) FILTER (WHERE enabled AND parked_at IS NULL) AS active,
       count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked
  FROM news.sources;
