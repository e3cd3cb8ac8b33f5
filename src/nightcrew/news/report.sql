-- Spec 001's run reports, both engines' (report.py).

-- name: save_report
INSERT INTO news.worker_reports (shard, trigger, started_at, report)
VALUES (%(shard)s, %(trigger)s, %(now)s, %(report)s);

-- name: latest_reports
SELECT DISTINCT ON (shard) shard, trigger, started_at, report
  FROM news.worker_reports
 ORDER BY shard, started_at DESC, id DESC;
