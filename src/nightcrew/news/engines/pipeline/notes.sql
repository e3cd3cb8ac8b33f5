-- What the pipeline's stage workers note for the passes' reports, and the workers' results
-- a pass reports as theirs (notes.py).

-- name: previous_report
-- Where a pass's window starts: where the shard's previous report (not a skipped one, which
-- read nothing) stopped — a pass's when it read the workers' notes (workers.until), an inline
-- run's when it ended (its start and its duration) — for the fetch failures and the shared
-- Redis notes it reports, and to say what the workers' results cover.
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

-- name: pass_review_waits
-- The shard's candidates waiting for another review attempt (the model failed for now).
SELECT count(*) AS review_retries FROM news.candidates
 WHERE shard = %(shard)s AND stage = 'review' AND state IN ('held', 'queued') AND attempts > 0;

-- name: fetch_errors_since
-- A pass's fetchErrors: the shard's feeds whose last fetch failed since the previous report
-- stopped reading (its own fetches', and a fetch that failed after that report read).
SELECT name AS source, last_error AS error FROM news.sources
 WHERE shard = %(shard)s AND last_error IS NOT NULL
   AND last_fetched_at > %(since)s AND last_fetched_at <= %(now)s
 ORDER BY name, id;

-- name: pass_notes
-- What the stage workers noted for the shard — articles written (reason: the status; source:
-- 'translated' when translated with the review), writes refused (source: the URL, reason: the
-- error), reviews parked behind a review lease held elsewhere, items dropped at fetch (by source
-- and reason), fetches put off behind another worker's lease — TAKEN: deleted as they are
-- read, each in the transaction of the work it counts, so a note committed after this read
-- goes to the next pass, and two passes at once never take the same one: each is reported
-- exactly once. And the Redis failures in the window (shard NULL: seen by a worker that serves
-- every shard, read by every shard's pass, forgotten after a day).
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

-- name: peek_notes
-- The shard's notes as pass_notes would take them, left in place (a test's look at what the
-- workers did since the last pass).
SELECT kind, source, reason, sum(n) AS n FROM news.report_notes
 WHERE shard = %(shard)s
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
