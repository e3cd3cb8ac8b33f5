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

