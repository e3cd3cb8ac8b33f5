-- Daily lane, job 1: auto-reactivate expired pauses (spec 000 "Auto-Reactivate Expired Pauses").

-- name: due_paused_podcasts
SELECT id, slug, title, pause_expires_at
  FROM public.podcasts
 WHERE status = 'paused'
   AND pause_expires_at <= %(now)s
 ORDER BY pause_expires_at, id;

-- name: reactivate_podcast
-- The claim: only a row that is still paused and still expired moves, so two replicas (or a
-- user resuming by hand a second earlier) never reactivate, or resume billing, twice.
UPDATE public.podcasts
   SET status = 'active',
       paused_at = NULL,
       pause_expires_at = NULL,
       last_pause_ended_at = %(now)s,
       updated_at = %(now)s
 WHERE id = %(id)s
   AND status = 'paused'
   AND pause_expires_at <= %(now)s
RETURNING id, slug;
