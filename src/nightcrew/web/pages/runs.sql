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
SELECT l.lane, last.id AS last_id, last.started_at AS last_started_at,
       -- as the list shows it (runs_page)
       CASE WHEN last.status = 'completed' AND (last.report ->> 'skipped') = 'true'
            THEN 'skipped' ELSE last.status END AS last_status,
       ok.started_at AS last_completed_at
  FROM lanes l
  CROSS JOIN LATERAL (
      SELECT r.id, r.status, r.started_at, r.report
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
-- The filters marker below is replaced by fixed fragments only (web/pages/runs.py), never by request text.
SELECT r.id, r.lane, r.trigger, r.slot, r.started_at, r.finished_at, r.attempts, r.requested_by,
       -- a completed run whose report says it was skipped (a shard another worker held)
       CASE WHEN r.status = 'completed' AND (r.report ->> 'skipped') = 'true' THEN 'skipped'
            ELSE r.status END AS status,
       r.report ->> 'error' AS error,
       -- a lane's report stored before it spelled durationMs as every report does says duration_ms
       coalesce(r.report ->> 'durationMs', r.report ->> 'duration_ms') AS duration_ms,
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
SELECT id, lane, trigger, slot, started_at, finished_at, heartbeat_at, attempts, requested_by,
       -- as the list shows it (runs_page)
       CASE WHEN status = 'completed' AND (report ->> 'skipped') = 'true' THEN 'skipped'
            ELSE status END AS status,
       report AS raw
  FROM nightcrew.runs WHERE id = %(id)s;

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
