-- Daily lane, job 2: hard-delete podcasts whose deletion date has passed (spec 000).

-- name: due_deletions
SELECT id, slug, title, deletion_scheduled_at, deletion_redirect_url
  FROM public.podcasts
 WHERE status = 'pending_deletion'
   AND deletion_scheduled_at <= %(now)s
 ORDER BY deletion_scheduled_at, id;

-- name: delete_podcast
-- Re-checked under the row lock the DELETE takes: a podcast restored since the scan stays.
-- ON DELETE CASCADE removes members, episodes (their jobs), imports (their items).
DELETE FROM public.podcasts
 WHERE id = %(id)s
   AND status = 'pending_deletion'
   AND deletion_scheduled_at <= %(now)s
RETURNING id, slug;

-- name: record_deletion
INSERT INTO nightcrew.podcast_deletions (podcast_id, slug, deleted_at, updated_at)
VALUES (%(id)s, %(slug)s, %(now)s, %(now)s)
ON CONFLICT (podcast_id) DO NOTHING;

-- name: link_invalidation_effect
UPDATE nightcrew.podcast_deletions
   SET invalidation_effect_id = %(effect_id)s
 WHERE podcast_id = %(id)s;

-- name: unfinished_deletions
-- With the state of the feed-invalidation effect each one owes (delivered by deliverEffects).
SELECT d.podcast_id, d.slug, d.deleted_at, d.storage_cleaned_at, d.objects_deleted,
       d.objects_left, d.invalidated_at, d.attempts, d.last_error, d.invalidation_effect_id,
       e.id IS NOT NULL AS effect_exists,
       e.delivered_at AS effect_delivered_at, e.dead_at AS effect_dead_at,
       e.attempts AS effect_attempts, e.last_error AS effect_error
  FROM nightcrew.podcast_deletions d
  LEFT JOIN nightcrew.effects e ON e.id = d.invalidation_effect_id
 WHERE (d.storage_cleaned_at IS NULL OR d.invalidated_at IS NULL)
   AND NOT (d.podcast_id = ANY(%(exclude)s::uuid[]))
 ORDER BY d.deleted_at, d.podcast_id
 LIMIT %(limit)s;

-- name: record_cleanup
UPDATE nightcrew.podcast_deletions
   SET storage_cleaned_at = CASE WHEN %(storage_done)s THEN coalesce(storage_cleaned_at, %(now)s)
                                 ELSE storage_cleaned_at END,
       objects_left = %(objects_left)s,
       invalidated_at = CASE WHEN %(invalidated_at)s::timestamptz IS NOT NULL
                             THEN coalesce(invalidated_at, %(invalidated_at)s)
                             ELSE invalidated_at END,
       attempts = attempts + 1,
       last_error = %(last_error)s,
       updated_at = %(now)s
 WHERE podcast_id = %(id)s;

-- name: mark_in_flight
-- The page about to be deleted ({key: size}), committed before the store is asked: a crash
-- between the store's answer and count_deleted leaves it for the next cleanup to settle.
UPDATE nightcrew.podcast_deletions
   SET in_flight = %(keys)s
 WHERE podcast_id = %(id)s;

-- name: count_deleted
-- One listing page's deletions, persisted as the store confirms them (not at the end of the
-- podcast's cleanup), and the page no longer in flight, in one statement: the count is exact
-- whenever the process dies.
UPDATE nightcrew.podcast_deletions
   SET objects_deleted = objects_deleted + %(objects)s,
       bytes_deleted = bytes_deleted + %(bytes)s,
       in_flight = NULL
 WHERE podcast_id = %(id)s;

-- name: in_flight
SELECT in_flight FROM nightcrew.podcast_deletions WHERE podcast_id = %(id)s;

-- name: try_lock_cleanup
-- One cleanup of a podcast at a time (a manual daily run overlapping the scheduled one would
-- settle and count the same page twice): a session-level advisory lock, which PostgreSQL
-- releases by itself when the holder's connection dies — a crash never leaves it held.
SELECT pg_try_advisory_lock(hashtextextended('nightcrew.podcast_deletion:' || %(id)s, 0))
       AS locked;

-- name: unlock_cleanup
SELECT pg_advisory_unlock(hashtextextended('nightcrew.podcast_deletion:' || %(id)s, 0));
