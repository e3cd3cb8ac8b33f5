-- The pipeline's stages (stages.py).

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

-- name: park
-- Its lease is held elsewhere (a worker busy with it, or one that died holding it — a stage
-- lease outlives its worker by NEWS_STAGE_LEASE_SECONDS at most): held, so the housekeeping
-- (or a pass) sends it again once the lease is free. Its attempts count on: they are here.
-- A review parked so is noted for the next pass's report (redisAiReviewLockSkippedCount).
WITH parked AS (
    UPDATE news.candidates
       SET state = 'held', reason = %(reason)s, updated_at = %(now)s,
           not_before = %(now)s + make_interval(secs => %(wait)s)
     WHERE url = %(url)s AND stage = %(stage)s AND state = 'queued'
    RETURNING shard, stage
)
INSERT INTO news.report_notes (shard, kind, n, at)
SELECT shard, 'review_lock_skipped', 1, %(now)s FROM parked WHERE stage = 'review';

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
-- to admit it again — as an inline run defers it to the next run — its attempt counted. Also
-- when a copy of its message parked it meanwhile (held, under the same fence).
UPDATE news.candidates
   SET state = 'held', admitted_at = NULL, reason = %(reason)s, attempts = attempts + 1,
       last_error = 'the model failed for now', stage_attempts = 0, stage_taken_at = NULL,
       not_before = NULL, updated_at = %(now)s
 WHERE url = %(url)s AND stage = 'review' AND fence = %(fence)s AND state IN ('queued', 'held')
RETURNING url;

-- name: drop
DELETE FROM news.candidates WHERE url = %(url)s;

-- name: mark_dead
-- Only at the letter's own stage: a copy of an older stage's message must not kill a
-- candidate that has moved on.
UPDATE news.candidates
   SET state = 'dead', last_error = %(error)s, stage_taken_at = NULL, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND state IN ('queued', 'held');

-- name: reject
-- The write stage: the database refused the article for its own data. Noted for the next
-- pass's report (the workers' writeErrors).
WITH rejected AS (
    UPDATE news.candidates
       SET state = 'rejected', reason = %(reason)s, stage_taken_at = NULL, updated_at = %(now)s
     WHERE url = %(url)s
    RETURNING url, shard
)
INSERT INTO news.report_notes (shard, kind, source, reason, n, at)
SELECT shard, 'write_refused', url, %(reason)s, 1, %(now)s FROM rejected;
