-- news.sources: what to fetch, and what each fetch left behind.

-- name: add_source
INSERT INTO news.sources (name, feed_url, shard, created_at)
VALUES (%(name)s, %(feed_url)s, %(shard)s, %(now)s)
ON CONFLICT (feed_url) DO NOTHING
RETURNING id, name, feed_url, shard, enabled;

-- name: list_sources
SELECT id, name, feed_url, shard, enabled, consecutive_failures, last_error, last_fetched_at,
       next_check_at, parked_at
  FROM news.sources
 WHERE %(shard)s::text IS NULL OR shard = %(shard)s
 ORDER BY shard, id;

-- name: disable_source
UPDATE news.sources SET enabled = false
 WHERE id::text = %(ref)s OR feed_url = %(ref)s
RETURNING id, name, feed_url, shard;

-- name: enable_source
UPDATE news.sources
   SET enabled = true, parked_at = NULL, consecutive_failures = 0, next_check_at = NULL
 WHERE id::text = %(ref)s OR feed_url = %(ref)s
RETURNING id, name, feed_url, shard;

-- name: due_sources
SELECT id, name, feed_url, shard, etag, last_modified, body_hash, consecutive_failures
  FROM news.sources
 WHERE shard = %(shard)s AND enabled AND parked_at IS NULL
   AND (next_check_at IS NULL OR next_check_at <= %(now)s)
 ORDER BY id;

-- name: record_success
UPDATE news.sources
   SET etag = %(etag)s, last_modified = %(last_modified)s, body_hash = %(body_hash)s,
       consecutive_failures = 0,
       last_error = NULL, last_fetched_at = %(now)s, next_check_at = %(next_check_at)s
 WHERE id = %(id)s;

-- name: record_failure
UPDATE news.sources
   SET consecutive_failures = consecutive_failures + 1,
       last_error = %(error)s,
       last_fetched_at = %(now)s,
       next_check_at = %(next_check_at)s,
       parked_at = CASE WHEN consecutive_failures + 1 >= %(park_after)s THEN %(now)s
                        ELSE parked_at END
 WHERE id = %(id)s
RETURNING consecutive_failures, parked_at;

-- name: record_successes
-- Many sources' successful fetches in one statement (the run's bulk path).
UPDATE news.sources AS s
   SET etag = u.etag, last_modified = u.last_modified, body_hash = u.body_hash,
       consecutive_failures = 0, last_error = NULL, last_fetched_at = %(now)s,
       next_check_at = u.next_check_at
  FROM unnest(%(ids)b::bigint[], %(etags)b::text[], %(last_modified)b::text[],
              %(hashes)b::text[], %(next_check_at)b::timestamptz[])
       AS u (id, etag, last_modified, body_hash, next_check_at)
 WHERE s.id = u.id;

-- name: import_sources
-- A whole import in one statement (2,000 feeds in milliseconds, all or nothing). A feed URL that
-- is already a source stays as it is: the main query reads the table as it was before the
-- statement, so it names that source (id and shard). A row inserted concurrently by another
-- session is neither added here nor seen: both ids come back NULL.
WITH input AS (
    SELECT * FROM unnest(%(lines)s::int[], %(names)s::text[], %(feed_urls)s::text[])
                  AS u (line, name, feed_url)
), added AS (
    INSERT INTO news.sources (name, feed_url, shard, created_at)
    SELECT name, feed_url, %(shard)s, %(now)s FROM input ORDER BY line
    ON CONFLICT (feed_url) DO NOTHING
    RETURNING id, feed_url
)
SELECT input.line, added.id AS added_id, existing.id AS existing_id,
       existing.shard AS existing_shard
  FROM input
  LEFT JOIN added ON added.feed_url = input.feed_url
  LEFT JOIN news.sources AS existing ON existing.feed_url = input.feed_url
 ORDER BY input.line;

-- name: preview_import
-- import_sources's answer without its insert (a dry run): what exists already.
SELECT input.line, NULL::bigint AS added_id, existing.id AS existing_id,
       existing.shard AS existing_shard
  FROM unnest(%(lines)s::int[], %(feed_urls)s::text[]) AS input (line, feed_url)
  LEFT JOIN news.sources AS existing ON existing.feed_url = input.feed_url
 ORDER BY input.line;
