-- A message's attempt at its candidate (attempts.py).

-- name: take
-- A stage worker takes a candidate: a new fence, which its result must be saved under, and one
-- more attempt counted — here, in PostgreSQL, so a take whose worker dies counts like one that
-- fails. ``decision``:
-- * take: taken (``died``: the previous take never finished — its worker died);
-- * exhausted: NEWS_MAX_DELIVERIES attempts spent, none finished: not taken (dead-lettered);
-- * busy: a take of the last ``busy_for`` seconds is still under way (the write stage, which
--   has no lease): not taken.
-- ``token`` is the handling message's: taking it again with the same token while that take is
-- open (a database outage lost the answer, a stopped worker's copy) resumes the same attempt —
-- not counted twice, not taken for a death.
WITH prior AS (
    SELECT url, fence, stage_attempts, stage_taken_at, stage_taken_by, last_error
      FROM news.candidates
     WHERE url = %(url)s AND stage = %(stage)s AND state = 'queued'
       FOR UPDATE
), decided AS (
    SELECT p.url AS prior_url, p.stage_attempts AS prior_attempts,
           p.stage_taken_at AS prior_taken_at,
           p.stage_taken_at IS NOT NULL AND p.stage_taken_by = %(token)s AS resumed,
           p.stage_taken_at IS NOT NULL AND p.stage_taken_by IS DISTINCT FROM %(token)s AS died,
           CASE WHEN p.stage_taken_at IS NOT NULL
                     AND p.stage_taken_by IS DISTINCT FROM %(token)s THEN %(died_error)s
                ELSE p.last_error END AS prior_error,
           CASE WHEN p.stage_taken_at IS NOT NULL AND p.stage_taken_by = %(token)s THEN 'take'
                WHEN p.stage_attempts >= %(max)s THEN 'exhausted'
                WHEN %(busy_for)s > 0
                     AND p.stage_taken_at > %(now)s - make_interval(secs => %(busy_for)s)
                     THEN 'busy'
                ELSE 'take' END AS decision
      FROM prior p
), taken AS (
    UPDATE news.candidates c
       SET fence = c.fence + 1,
           stage_attempts = c.stage_attempts + CASE WHEN d.resumed THEN 0 ELSE 1 END,
           stage_taken_at = %(now)s, stage_taken_by = %(token)s,
           last_error = CASE WHEN d.died THEN %(died_error)s ELSE c.last_error END,
           updated_at = %(now)s
      FROM decided d
     WHERE c.url = d.prior_url AND d.decision = 'take'
    RETURNING c.url, c.source_id, c.shard, c.title, c.summary, c.image_url, c.published_at,
              c.reason, c.attempts, c.stage, c.verdict, c.translation, c.fence, c.stage_attempts
)
SELECT d.decision, d.died, d.prior_attempts, d.prior_taken_at, d.prior_error,
       t.*, t.shard AS source_shard
  FROM decided d LEFT JOIN taken t ON true;

-- name: finished
-- An attempt that ended without moving the candidate on (deferred, say): it is not unfinished.
UPDATE news.candidates SET stage_attempts = 0, stage_taken_at = NULL
 WHERE url = %(url)s AND stage = %(stage)s AND fence = %(fence)s;

-- name: untake
-- A take given back unfinished through no fault of the candidate's — its worker stopping, its
-- lease lost — does not count: queued again (a stopping worker's copy of the message follows)
-- or held until ``not_before`` (the lease is someone else's until then).
UPDATE news.candidates
   SET stage_attempts = greatest(stage_attempts - 1, 0), stage_taken_at = NULL,
       state = %(state)s, reason = coalesce(%(reason)s, reason), not_before = %(not_before)s,
       updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND fence = %(fence)s AND state = 'queued'
RETURNING url;

-- name: retry_later
-- A take that failed for now (a deadlock, a timeout, resources short): held until the backoff
-- has passed — the housekeeping releases it with a fresh message then — its attempt counted.
UPDATE news.candidates
   SET state = 'held', reason = %(reason)s, last_error = %(error)s, stage_taken_at = NULL,
       not_before = %(not_before)s, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND fence = %(fence)s AND state = 'queued'
RETURNING url;
