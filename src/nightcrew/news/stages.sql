-- The pipeline's stage workers (issue 13).

-- name: source_for_fetch
SELECT id, name, feed_url, shard, etag, last_modified, body_hash, consecutive_failures,
       enabled, parked_at, fetch_queued_at, watermark_at, watermark_urls
  FROM news.sources WHERE id = %(id)s;

-- name: fetched
-- The fetch message is done: its source's watermark moves on. No row: another consumer of a
-- duplicate message recorded this fetch first (then this one's items are dropped).
UPDATE news.sources
   SET fetch_queued_at = NULL, watermark_at = %(watermark_at)s,
       watermark_urls = %(watermark_urls)s
 WHERE id = %(id)s AND fetch_queued_at IS NOT NULL
RETURNING id;

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
-- A stage worker takes a candidate: a new fence, which its result must be saved under.
UPDATE news.candidates
   SET fence = fence + 1, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND state = 'queued'
RETURNING url, source_id, shard, title, summary, image_url, published_at, reason, attempts,
          stage, verdict, translation, fence;

-- name: park
-- Its lease is held elsewhere (a worker busy with it, or one that died holding it): held, so a
-- later pass sends it again once the lease is free.
UPDATE news.candidates
   SET state = 'held', reason = %(reason)s, updated_at = %(now)s,
       not_before = %(now)s + make_interval(secs => %(wait)s)
 WHERE url = %(url)s AND stage = %(stage)s AND state = 'queued';

-- name: advance
-- A stage's result, saved only under the fence its worker drew.
UPDATE news.candidates
   SET stage = %(next)s, state = %(state)s, reason = %(reason)s,
       image_url = coalesce(%(image_url)s, image_url),
       verdict = %(verdict)s, translation = %(translation)s,
       attempts = attempts + %(attempted)s, last_error = %(error)s, updated_at = %(now)s,
       not_before = CASE WHEN %(state)s = 'held' AND %(attempted)s > 0
                         THEN %(now)s + make_interval(secs => least(
                                  %(retry_base)s * 2 ^ (attempts + %(attempted)s - 1), 3600))
                    END
 WHERE url = %(url)s AND stage = %(stage)s AND fence = %(fence)s AND state IN ('queued', 'held')
RETURNING url;

-- name: drop
DELETE FROM news.candidates WHERE url = %(url)s;

-- name: mark_dead
-- Only at the letter's own stage: a copy of an older stage's message must not kill a
-- candidate that has moved on.
UPDATE news.candidates SET state = 'dead', last_error = %(error)s, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND state IN ('queued', 'held');

-- name: reject
UPDATE news.candidates SET state = 'rejected', reason = %(reason)s, updated_at = %(now)s
 WHERE url = %(url)s;
