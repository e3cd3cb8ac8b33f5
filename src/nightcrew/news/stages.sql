-- The pipeline's stage workers (issue 13).

-- name: source_for_fetch
SELECT id, name, feed_url, shard, etag, last_modified, body_hash, consecutive_failures,
       enabled, parked_at, fetch_queued_at
  FROM news.sources WHERE id = %(id)s;

-- name: unqueue_source
UPDATE news.sources SET fetch_queued_at = NULL WHERE id = %(id)s;

-- name: refetch_later
-- Its fetch lease is held elsewhere (a worker fetching it, or one that died doing so): the pass
-- sends the source again once the lease has surely run out, if nobody fetched it meanwhile.
UPDATE news.sources
   SET fetch_queued_at = least(fetch_queued_at,
                               %(now)s - make_interval(secs => %(resend_after)s - %(ttl)s))
 WHERE id = %(id)s AND fetch_queued_at IS NOT NULL;

-- name: take
-- A stage worker takes a candidate: a new fence, which its result must be saved under, and one
-- more attempt counted — here, in PostgreSQL, so a take whose worker dies counts like one that
-- fails (issue 23). ``decision``:
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
SELECT d.decision, d.died, d.prior_attempts, d.prior_taken_at, d.prior_error, t.*
  FROM decided d LEFT JOIN taken t ON true;

-- name: park
-- Its lease is held elsewhere (a worker busy with it, or one that died holding it — a stage
-- lease outlives its worker by NEWS_STAGE_LEASE_SECONDS at most): held, so the housekeeping
-- (or a pass) sends it again once the lease is free. Its attempts count on: they are here.
UPDATE news.candidates
   SET state = 'held', reason = %(reason)s, updated_at = %(now)s,
       not_before = %(now)s + make_interval(secs => %(wait)s)
 WHERE url = %(url)s AND stage = %(stage)s AND state = 'queued';

-- name: advance
-- A stage's result, saved only under the fence its worker drew; queued for the next stage.
UPDATE news.candidates
   SET stage = %(next)s, state = 'queued', reason = %(reason)s,
       image_url = coalesce(%(image_url)s, image_url),
       verdict = %(verdict)s, translation = %(translation)s, last_error = NULL,
       stage_attempts = 0, stage_taken_at = NULL,  -- this attempt finished
       not_before = NULL, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND fence = %(fence)s AND state IN ('queued', 'held')
RETURNING url;

-- name: review_later
-- The model failed for now (review.review_again_later): the candidate waits for a later pass
-- to admit it again — as an inline run defers it to the next run — its attempt counted.
UPDATE news.candidates
   SET state = 'held', admitted_at = NULL, reason = %(reason)s, attempts = attempts + 1,
       last_error = 'the model failed for now', stage_attempts = 0, stage_taken_at = NULL,
       not_before = NULL, updated_at = %(now)s
 WHERE url = %(url)s AND stage = 'review' AND fence = %(fence)s AND state = 'queued'
RETURNING url;

-- name: drop
DELETE FROM news.candidates WHERE url = %(url)s;

-- name: mark_dead
-- Only at the letter's own stage: a copy of an older stage's message must not kill a
-- candidate that has moved on.
UPDATE news.candidates
   SET state = 'dead', last_error = %(error)s, stage_taken_at = NULL, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND state IN ('queued', 'held');

-- name: retry_later
-- A take that failed for now (a deadlock, a timeout, resources short): held until the backoff
-- has passed — the housekeeping releases it with a fresh message then — its attempt counted.
UPDATE news.candidates
   SET state = 'held', reason = %(reason)s, last_error = %(error)s, stage_taken_at = NULL,
       not_before = %(not_before)s, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND fence = %(fence)s AND state = 'queued'
RETURNING url;

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

-- name: reject
UPDATE news.candidates
   SET state = 'rejected', reason = %(reason)s, stage_taken_at = NULL, updated_at = %(now)s
 WHERE url = %(url)s;
