-- name: deletions_unfinished
-- Leftovers: storage or the feed invalidation still owed (the partial index).
SELECT podcast_id::text AS podcast_id, slug, deleted_at, storage_cleaned_at, invalidated_at, objects_deleted,
       bytes_deleted, objects_left, attempts, last_error, updated_at
  FROM nightcrew.podcast_deletions
 WHERE storage_cleaned_at IS NULL OR invalidated_at IS NULL
 ORDER BY deleted_at, podcast_deletions.podcast_id
 LIMIT %(limit)s;

-- name: deletions_page
SELECT podcast_id::text AS podcast_id, slug, deleted_at, storage_cleaned_at, invalidated_at, objects_deleted,
       bytes_deleted, objects_left, attempts, last_error, updated_at
  FROM nightcrew.podcast_deletions
 WHERE (deleted_at, podcast_deletions.podcast_id) < (%(before_at)s, %(before_id)s)
 ORDER BY deleted_at DESC, podcast_deletions.podcast_id DESC
 LIMIT %(limit)s;

-- name: deletions_recent_totals
SELECT count(*) AS podcasts, coalesce(sum(objects_deleted), 0) AS objects,
       coalesce(sum(bytes_deleted), 0) AS bytes
  FROM nightcrew.podcast_deletions
 WHERE deleted_at >= %(since)s;

-- name: deletions_unfinished_count
SELECT count(*) AS n FROM nightcrew.podcast_deletions
 WHERE storage_cleaned_at IS NULL OR invalidated_at IS NULL;
