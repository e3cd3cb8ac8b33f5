-- The minute lane's self-healing sweeps (spec 000 "Fast lane" + the media_jobs watchdog).
--
-- Every sweep CLAIMS its rows with one statement: a CTE picks candidates FOR UPDATE SKIP LOCKED,
-- and the UPDATE moves them out of the predicate (a bumped updated_at, a pushed
-- next_attempt_at, a terminal status). A second replica ticking at the same instant skips the
-- locked rows, or, if the first already committed, re-evaluates the predicate on the new row
-- version and no longer matches. Nothing is sent twice.
--
-- `now` is always a parameter (the Clock); every scan starts from a partial index that holds
-- only live rows, so an idle tick costs the same at a thousand rows as at a million.
--
-- Every threshold is strict ("older than"): a row bumped by a tick at T is not due again at
-- exactly T + 60 s, the next tick, which is what the resend cooldown is for.


-- name: rescue_stalled_processing_items
-- Processing claims older than the threshold: the worker is assumed dead. Back to pending,
-- updated_at = now (so the cooldown holds off the pending sweep this tick), and resent.
WITH candidates AS (
    SELECT ii.id, ii.updated_at AS stale_since
      FROM public.podcast_imports pi
      JOIN public.import_items ii ON ii.import_id = pi.id
     WHERE pi.status = 'running'
       AND ii.status = 'processing'
       AND ii.updated_at < %(now)s - make_interval(secs => %(processing_threshold_seconds)s)
     ORDER BY ii.updated_at, ii.id
     LIMIT %(limit)s
       FOR UPDATE OF ii SKIP LOCKED
)
UPDATE public.import_items ii
   SET status = 'pending', updated_at = %(now)s
  FROM candidates c, public.podcast_imports pi
 WHERE ii.id = c.id
   AND pi.id = ii.import_id
   AND ii.status = 'processing'
RETURNING ii.id AS import_item_id, ii.import_id, pi.podcast_id, ii.attempts, c.stale_since,
          c.stale_since AS claimed_from;


-- name: claim_stalled_pending_items
-- Pending rows whose queue message evidently never arrived, by the per-attempt table:
--   attempts = 0, dispatch_end_at set  -> dispatch_end_at + grace has passed
--   attempts = 0, dispatch_end_at NULL -> legacy: updated_at older than the fallback
--   attempts 1..4                      -> updated_at older than thresholds[attempts]
--   attempts >= 5                      -> updated_at older than the safety cap
-- and, always, updated_at outside the resend cooldown.
WITH candidates AS (
    SELECT ii.id, ii.updated_at AS claimed_from,
           CASE WHEN ii.attempts = 0 AND pi.dispatch_end_at IS NOT NULL
                THEN pi.dispatch_end_at ELSE ii.updated_at END AS stale_since
      FROM public.podcast_imports pi
      JOIN public.import_items ii ON ii.import_id = pi.id
     WHERE pi.status = 'running'
       AND ii.status = 'pending'
       AND ii.updated_at < %(now)s - make_interval(secs => %(cooldown_seconds)s)
       AND CASE
             WHEN ii.attempts = 0 AND pi.dispatch_end_at IS NOT NULL
               THEN pi.dispatch_end_at
                    < %(now)s - make_interval(secs => %(dispatch_grace_seconds)s)
             WHEN ii.attempts = 0
               THEN ii.updated_at < %(now)s - make_interval(secs => %(legacy_seconds)s)
             WHEN ii.attempts BETWEEN 1 AND cardinality(%(attempt_thresholds)s::int[])
               THEN ii.updated_at < %(now)s - make_interval(
                        secs => (%(attempt_thresholds)s::int[])[ii.attempts])
             ELSE ii.updated_at < %(now)s - make_interval(secs => %(cap_seconds)s)
           END
     ORDER BY stale_since, ii.id
     LIMIT %(limit)s
       FOR UPDATE OF ii SKIP LOCKED
)
UPDATE public.import_items ii
   SET updated_at = %(now)s
  FROM candidates c, public.podcast_imports pi
 WHERE ii.id = c.id
   AND pi.id = ii.import_id
   AND ii.status = 'pending'
RETURNING ii.id AS import_item_id, ii.import_id, pi.podcast_id, ii.attempts, c.stale_since,
          c.claimed_from;


-- name: unclaim_import_items
-- Sends that failed: each claim's bump undone (updated_at back to what the claim found), so
-- the next tick finds the row due again rather than a whole threshold later. Only where the
-- bump is still this claim's (updated_at = now, still pending): a consumer that moved the row
-- since keeps its own.
UPDATE public.import_items ii
   SET updated_at = u.claimed_from
  FROM unnest(%(ids)s::uuid[], %(claimed_from)s::timestamptz[]) AS u (id, claimed_from)
 WHERE ii.id = u.id
   AND ii.updated_at = %(now)s
   AND ii.status = 'pending';


-- name: claim_stalled_external_links
-- Externally hosted episodes whose external-episode-link message is overdue. The claim pushes
-- next_attempt_at forward by the cooldown and keeps the attempt, so the consumer's backoff
-- progression is preserved. NULL next_attempt_at (schema drift) is rescued too.
WITH candidates AS (
    SELECT e.id, e.external_link_attempt, e.external_link_next_attempt_at,
           coalesce(e.published_at, e.scheduled_for) AS target_published_at
      FROM public.episodes e
      JOIN public.podcasts p ON p.id = e.podcast_id
     WHERE e.external_link_status = 'pending'
       AND coalesce(e.external_link_next_attempt_at, '-infinity'::timestamptz)
           < %(now)s - make_interval(secs => %(grace_seconds)s)
       AND p.hosting_type = 'external'
     ORDER BY coalesce(e.external_link_next_attempt_at, '-infinity'::timestamptz), e.id
     LIMIT %(limit)s
       FOR UPDATE OF e SKIP LOCKED
)
UPDATE public.episodes e
   SET external_link_next_attempt_at = %(now)s + make_interval(secs => %(cooldown_seconds)s)
  FROM candidates c
 WHERE e.id = c.id
   AND e.external_link_status = 'pending'
RETURNING e.id AS episode_id, e.podcast_id, c.external_link_attempt AS attempt,
          c.external_link_next_attempt_at AS previous_next_attempt_at, c.target_published_at;


-- name: unclaim_external_links
-- Sends that failed: next_attempt_at back to what the claim found (NULL included), so the next
-- tick finds the link overdue again; only where the claim's push is still in place.
UPDATE public.episodes e
   SET external_link_next_attempt_at = u.previous
  FROM unnest(%(ids)s::uuid[], %(previous)s::timestamptz[]) AS u (id, previous)
 WHERE e.id = u.id
   AND e.external_link_next_attempt_at = %(claimed_until)s
   AND e.external_link_status = 'pending';


-- name: cancel_stuck_hosting_migration_previews
WITH candidates AS (
    SELECT id
      FROM public.podcast_imports
     WHERE is_hosting_migration
       AND status = 'preview'
       AND started_at IS NULL
       AND created_at < %(now)s - make_interval(secs => %(threshold_seconds)s)
     ORDER BY created_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE public.podcast_imports pi
   SET status = 'canceled', updated_at = %(now)s
  FROM candidates c
 WHERE pi.id = c.id
   AND pi.status = 'preview'
   AND pi.started_at IS NULL
RETURNING pi.id AS import_id, pi.podcast_id, pi.created_at;


-- name: fail_wedged_media_jobs
WITH candidates AS (
    SELECT id, status
      FROM public.media_jobs
     WHERE status IN ('pending', 'running')
       AND updated_at < %(now)s - make_interval(secs => %(threshold_seconds)s)
     ORDER BY updated_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE public.media_jobs m
   SET status = 'failed', error = %(error)s, updated_at = %(now)s
  FROM candidates c
 WHERE m.id = c.id
   AND m.status IN ('pending', 'running')
RETURNING m.id AS job_id, m.episode_id, m.type, c.status AS previous_status;


-- name: notify_media_job_results
SELECT public.notify_media_job_result(job_id) FROM unnest(%(job_ids)s::uuid[]) AS job_id;
