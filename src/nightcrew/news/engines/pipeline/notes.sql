-- What the pipeline's stage workers note for the passes' reports, and the workers' results
-- a pass reports as theirs (notes.py).

-- name: previous_report
-- Where a pass's window of the workers' results starts: where the shard's previous report
-- (not a skipped one, which read nothing) stopped — a pass's when it read the workers'
-- results (workers.until), an inline run's when it ended (its start and its duration, for its
-- own writes are its own) — so no result is reported twice, and none is missed.
SELECT coalesce((report -> 'workers' ->> 'until')::timestamptz,
                started_at + make_interval(
                    secs => coalesce((report ->> 'durationMs')::float8, 0) / 1000)) AS at
  FROM news.worker_reports
 WHERE shard = %(shard)s AND started_at < %(now)s
   AND (report ->> 'skipped') IS DISTINCT FROM 'true'
 ORDER BY started_at DESC, id DESC
 LIMIT 1;

-- name: shard_stages
-- A pass's report: the shard's candidates by stage and state.
SELECT stage, state, count(*) AS n FROM news.candidates
 WHERE shard = %(shard)s AND state IN ('held', 'queued', 'dead')
 GROUP BY stage, state;

-- name: pass_results
-- The workers' results for the shard in the window (since, now]: articles written, and the
-- reviews written with them (every verdict, the offline rules' too, as the inline run counts),
-- of which those translated with their review (a translation the backlog made later is
-- `translated_late`, and noted when it is made).
SELECT (SELECT count(*) FROM news.articles a
         WHERE a.shard = %(shard)s AND a.created_at > %(since)s
           AND a.created_at <= %(now)s) AS written,
       count(r.article_id) AS reviewed,
       count(r.article_id) FILTER (WHERE r.accepted) AS accepted,
       count(r.article_id) FILTER (WHERE NOT r.accepted) AS rejected,
       count(r.article_id) FILTER (WHERE r.translation IS NOT NULL
                                     AND NOT r.translated_late) AS translated
  FROM news.reviews r JOIN news.articles a ON a.id = r.article_id
 WHERE a.shard = %(shard)s AND r.created_at > %(since)s AND r.created_at <= %(now)s;

-- name: pass_review_waits
-- The shard's candidates waiting for another review attempt (the model failed for now), and
-- those parked in the window because another worker holds their review lease (stages.py's
-- park reason).
SELECT count(*) FILTER (WHERE attempts > 0) AS review_retries,
       count(*) FILTER (WHERE state = 'held'
                          AND reason LIKE 'its review lease is held elsewhere%%'
                          AND updated_at > %(since)s AND updated_at <= %(now)s) AS lock_skipped
  FROM news.candidates
 WHERE shard = %(shard)s AND stage = 'review' AND state IN ('held', 'queued');

-- name: fetch_errors_since
-- A pass's fetchErrors: the shard's feeds whose last fetch failed since the previous report
-- stopped reading (its own fetches', and a fetch that failed after that report read).
SELECT name AS source, last_error AS error FROM news.sources
 WHERE shard = %(shard)s AND last_error IS NOT NULL
   AND last_fetched_at > %(since)s AND last_fetched_at <= %(now)s
 ORDER BY name, id;

-- name: pass_write_errors
-- The shard's candidates rejected in the window: refused by the database for their own data
-- (or given up with their dead letter's error), each with the reason.
SELECT url, reason AS error FROM news.candidates
 WHERE shard = %(shard)s AND state = 'rejected'
   AND updated_at > %(since)s AND updated_at <= %(now)s
 ORDER BY updated_at, id;

-- name: pass_notes
-- What the stage workers noted: items dropped (by source and reason), fetches put off behind
-- another worker's lease — the shard's own notes TAKEN (deleted as they
-- are read, whenever a worker stamped them: a fetch stamps its start, and may commit after a
-- pass has read; two passes at once each take different ones, never the same twice) — and the
-- Redis failures in the window (shard NULL: seen by a worker that serves every shard, read by
-- every shard's pass, forgotten after a day). A pass that dies after this and before saving
-- its report loses those counts, never doubles them.
WITH taken AS (
    DELETE FROM news.report_notes WHERE shard = %(shard)s
    RETURNING kind, source, reason, n
), shared AS (
    SELECT kind, source, reason, n FROM news.report_notes
     WHERE shard IS NULL AND at > %(since)s AND at <= %(now)s
)
SELECT kind, source, reason, sum(n) AS n
  FROM (SELECT * FROM taken UNION ALL SELECT * FROM shared) AS notes
 GROUP BY kind, source, reason
 ORDER BY kind, source, reason;

-- name: note
INSERT INTO news.report_notes (shard, kind, source, reason, n, at)
VALUES (%(shard)s, %(kind)s, %(source)s, %(reason)s, %(n)s, %(now)s);

-- name: note_many
INSERT INTO news.report_notes (shard, kind, source, reason, n, at)
SELECT %(shard)s, %(kind)s, %(source)s, u.reason, u.n, %(now)s
  FROM unnest(%(reasons)b::text[], %(counts)b::int[]) AS u (reason, n);

-- name: forget_notes
-- The shard's own notes were taken by pass_notes; Redis failures go after a day.
DELETE FROM news.report_notes
 WHERE shard IS NULL AND at < %(now)s::timestamptz - interval '1 day';
