-- The dashboard's reads. Read-only, each one index scan bounded by a LIMIT (migration 0016);
-- `now` comes from the Clock. Lists are keyset-paginated: (started_at, id) < the cursor.

-- name: latest_per_lane
-- Every lane of the run history by a loose index scan (one index probe per lane, not a scan of
-- a million rows), with its newest run and its newest completed one.
WITH RECURSIVE lanes (lane) AS (
    (SELECT lane FROM nightcrew.runs ORDER BY lane LIMIT 1)
    UNION ALL
    SELECT (SELECT r.lane FROM nightcrew.runs r WHERE r.lane > l.lane ORDER BY r.lane LIMIT 1)
      FROM lanes l
     WHERE l.lane IS NOT NULL
)
SELECT l.lane, last.id, last.status, last.started_at, last.finished_at,
       (last.report ->> 'skipped') = 'true' AS skipped,
       ok.started_at AS last_completed_at
  FROM lanes l
  CROSS JOIN LATERAL (
      SELECT r.id, r.status, r.started_at, r.finished_at, r.report
        FROM nightcrew.runs r WHERE r.lane = l.lane
       ORDER BY r.started_at DESC, r.id DESC LIMIT 1) last
  LEFT JOIN LATERAL (
      SELECT r.started_at
        FROM nightcrew.runs r
       WHERE r.lane = l.lane AND r.status = 'completed'
         AND (r.report ->> 'skipped') IS DISTINCT FROM 'true'
       ORDER BY r.started_at DESC, r.id DESC LIMIT 1) ok ON true
 WHERE l.lane IS NOT NULL
 ORDER BY l.lane;

-- name: runs_page
-- The filters marker below is replaced by fixed fragments only (web/data.py), never by request text.
SELECT r.id, r.lane, r.trigger, r.slot, r.started_at, r.finished_at, r.status, r.attempts,
       r.requested_by,
       (r.report ->> 'skipped') = 'true' AS skipped,
       r.report ->> 'error' AS error,
       coalesce(r.report ->> 'duration_ms', r.report ->> 'durationMs') AS duration_ms,
       CASE WHEN jsonb_typeof(r.report -> 'errors') = 'array'
            THEN jsonb_array_length(r.report -> 'errors') ELSE 0 END AS failures,
       (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
          FROM jsonb_each(CASE WHEN jsonb_typeof(r.report) = 'object' THEN r.report
                               ELSE '{}'::jsonb END) e
         WHERE jsonb_typeof(e.value) = 'number' AND e.value <> '0'::jsonb
           AND e.key !~* '(limit|duration|_ms$|run_id|attempt)') AS headline
  FROM nightcrew.runs r
 WHERE r.started_at >= %(since)s
   -- one row bound (the older of the cursor and the day's end): the backward index scan
   -- starts right there, not at the newest run
   AND (r.started_at, r.id) < (%(before_at)s, %(before_id)s)
   /*filters*/
 ORDER BY r.started_at DESC, r.id DESC
 LIMIT %(limit)s;

-- name: run
SELECT id, lane, trigger, slot, started_at, finished_at, heartbeat_at, status, attempts, report,
       requested_by
  FROM nightcrew.runs WHERE id = %(id)s;

-- name: deletions_unfinished
-- Leftovers: storage or the feed invalidation still owed (the partial index).
SELECT podcast_id, slug, deleted_at, storage_cleaned_at, invalidated_at, objects_deleted,
       bytes_deleted, objects_left, attempts, last_error, updated_at
  FROM nightcrew.podcast_deletions
 WHERE storage_cleaned_at IS NULL OR invalidated_at IS NULL
 ORDER BY deleted_at, podcast_id
 LIMIT %(limit)s;

-- name: deletions_page
SELECT podcast_id, slug, deleted_at, storage_cleaned_at, invalidated_at, objects_deleted,
       bytes_deleted, objects_left, attempts, last_error, updated_at
  FROM nightcrew.podcast_deletions
 WHERE (deleted_at, podcast_id) < (%(before_at)s, %(before_id)s)
 ORDER BY deleted_at DESC, podcast_id DESC
 LIMIT %(limit)s;

-- name: deletions_unfinished_count
SELECT count(*) AS n FROM nightcrew.podcast_deletions
 WHERE storage_cleaned_at IS NULL OR invalidated_at IS NULL;

-- name: overage_clock_count
SELECT count(*) AS n FROM public.billing_accounts WHERE content_overage_since IS NOT NULL;

-- name: deletions_recent_totals
SELECT count(*) AS podcasts, coalesce(sum(objects_deleted), 0) AS objects,
       coalesce(sum(bytes_deleted), 0) AS bytes
  FROM nightcrew.podcast_deletions
 WHERE deleted_at >= %(since)s;

-- name: overage_clocks
-- Accounts on the clock, soonest deadline first, measured as the escalation measures them.
SELECT b.id, b.content_overage_since AS since, b.content_overage_deadline AS deadline,
       b.content_overage_nag_stage AS stage, b.content_overage_last_nag_at AS last_nag_at,
       coalesce(up.email, u.email) AS owner_email,
       (SELECT count(*) FROM public.podcasts p
         WHERE p.billing_account_id = b.id AND p.status IN ('active', 'paused')) AS podcasts,
       coalesce((SELECT s.bytes FROM nightcrew.escalation_storage_bytes() s
                  WHERE s.account_id = b.id), 0) AS bytes,
       public.effective_cap(b.id, 'podcasts_per_account') AS podcast_cap,
       public.effective_cap(b.id, 'storage_gb_per_account') AS storage_cap_gb
  FROM public.billing_accounts b
  LEFT JOIN public.user_profiles up ON up.id = b.owner_user_id
  LEFT JOIN auth.users u ON u.id = b.owner_user_id
 WHERE b.content_overage_since IS NOT NULL
 ORDER BY b.content_overage_deadline, b.id
 LIMIT %(limit)s;

-- name: suspended_feeds
SELECT billing_account_id AS account_id, id, slug, title, overage_suspended_at
  FROM public.podcasts
 WHERE billing_account_id = ANY(%(accounts)s::uuid[]) AND overage_suspended_at IS NOT NULL
 ORDER BY billing_account_id, overage_suspended_at, slug;

-- name: overage_restored
-- Restorations the daily lane recorded (report.jobs.runOverageEscalation.restored).
SELECT r.id AS run_id, r.started_at, x.value ->> 'account_id' AS account_id,
       x.value ->> 'since' AS since, x.value -> 'podcasts' AS podcasts
  FROM nightcrew.runs r
 CROSS JOIN LATERAL jsonb_array_elements(
     CASE WHEN jsonb_typeof(r.report -> 'jobs' -> 'runOverageEscalation' -> 'restored') = 'array'
          THEN r.report -> 'jobs' -> 'runOverageEscalation' -> 'restored'
          ELSE '[]'::jsonb END) x
 WHERE r.lane = 'daily' AND r.started_at >= %(since)s AND r.started_at < %(until)s
 ORDER BY r.started_at DESC, r.id DESC
 LIMIT %(limit)s;

-- name: watchdog_hours
-- What the minute lane rescued, per hour (UTC) of the window.
SELECT to_timestamp(floor(extract(epoch FROM r.started_at) / 3600) * 3600) AS hour,
       count(*) AS runs,
       sum(nightcrew.report_number(r.report, 'items_requeued')) AS items_requeued,
       sum(nightcrew.report_number(r.report, 'items_rescued')) AS items_rescued,
       sum(nightcrew.report_number(r.report, 'links_requeued')) AS links_requeued,
       sum(nightcrew.report_number(r.report, 'previews_canceled')) AS previews_canceled,
       sum(nightcrew.report_number(r.report, 'media_jobs_flagged')) AS media_jobs_flagged,
       sum(nightcrew.report_number(r.report, 'effects_retried')) AS effects_retried
  FROM nightcrew.runs r
 WHERE r.lane = 'minute' AND r.started_at >= %(since)s AND r.started_at < %(until)s
 GROUP BY 1
 ORDER BY 1;

-- name: watchdog_rescues
-- The minute runs of the window that did something, newest first.
SELECT r.id, r.started_at, r.status,
       nightcrew.report_number(r.report, 'items_requeued') AS items_requeued,
       nightcrew.report_number(r.report, 'links_requeued') AS links_requeued,
       nightcrew.report_number(r.report, 'previews_canceled') AS previews_canceled,
       nightcrew.report_number(r.report, 'media_jobs_flagged') AS media_jobs_flagged
  FROM nightcrew.runs r
 WHERE r.lane = 'minute' AND r.started_at >= %(since)s AND r.started_at < %(until)s
   AND (nightcrew.report_number(r.report, 'items_requeued')
        + nightcrew.report_number(r.report, 'links_requeued')
        + nightcrew.report_number(r.report, 'previews_canceled')
        + nightcrew.report_number(r.report, 'media_jobs_flagged')) > 0
 ORDER BY r.started_at DESC, r.id DESC
 LIMIT %(limit)s;

-- name: effects_failing
SELECT id, kind, key, attempts, last_attempt_at, next_attempt_at, last_error
  FROM nightcrew.effects
 WHERE delivered_at IS NULL AND dead_at IS NULL AND last_error IS NOT NULL
 ORDER BY last_attempt_at DESC, id DESC
 LIMIT %(limit)s;

-- name: effects_dead
SELECT id, kind, key, attempts, dead_at, dead_reason, last_error
  FROM nightcrew.effects
 WHERE dead_at IS NOT NULL
 ORDER BY dead_at DESC, id DESC
 LIMIT %(limit)s;

-- name: news_candidates
SELECT stage, state, count(*) AS n
  FROM news.candidates
 WHERE state IN ('held', 'queued', 'dead')
 GROUP BY stage, state
 ORDER BY stage, state;

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

-- name: news_source_counts
SELECT count(*) AS sources,
       count(*) FILTER (WHERE enabled AND parked_at IS NULL) AS active,
       count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked
  FROM news.sources;

-- name: news_latest
SELECT s.shard, w.trigger, w.started_at, w.report
  FROM unnest(%(shards)s::text[]) AS s (shard)
 CROSS JOIN LATERAL (
     SELECT trigger, started_at, report FROM news.worker_reports w
      WHERE w.shard = s.shard
      ORDER BY w.started_at DESC, w.id DESC LIMIT 1) w
 ORDER BY s.shard;

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
-- Each shard's recent reports, newest first: what the runs did, not only the last one.
SELECT s.shard, w.trigger, w.started_at, w.report
  FROM unnest(%(shards)s::text[]) AS s (shard)
 CROSS JOIN LATERAL (
     SELECT trigger, started_at, report FROM news.worker_reports w
      WHERE w.shard = s.shard
      ORDER BY w.started_at DESC, w.id DESC LIMIT %(limit)s) w
 ORDER BY s.shard, w.started_at DESC;

-- name: effects_due
-- Owed and never failed yet: waiting for their first attempt (the partial due index).
SELECT id, kind, key, attempts, next_attempt_at
  FROM nightcrew.effects
 WHERE delivered_at IS NULL AND dead_at IS NULL AND last_error IS NULL
 ORDER BY next_attempt_at, id
 LIMIT %(limit)s;

-- name: run_names
-- What a run's report calls by id, named as the CLI and the demo name it: a podcast by its
-- title, an import preview and a media job by their podcast's / episode's title.
SELECT p.id::text AS id, 'podcast' AS kind, p.title AS title
  FROM public.podcasts p WHERE p.id = ANY(%(ids)s::uuid[])
UNION ALL
SELECT i.id::text, 'import', p.title
  FROM public.podcast_imports i JOIN public.podcasts p ON p.id = i.podcast_id
 WHERE i.id = ANY(%(ids)s::uuid[])
UNION ALL
SELECT j.id::text, 'media_job', e.title
  FROM public.media_jobs j JOIN public.episodes e ON e.id = j.episode_id
 WHERE j.id = ANY(%(ids)s::uuid[]);
