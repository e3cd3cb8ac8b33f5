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

-- name: owner_billing_account
-- The podcast owner via podcast_members + user_profiles, then their billing account.
SELECT ba.id, ba.billing_model, ba.stripe_customer_id, ba.stripe_subscription_id
  FROM public.podcast_members pm
  JOIN public.user_profiles up ON up.id = pm.user_id
  JOIN public.billing_accounts ba ON ba.id = up.billing_account_id
 WHERE pm.podcast_id = %(podcast_id)s
   AND pm.role = 'owner'
 ORDER BY pm.created_at, pm.user_id
 LIMIT 1;

-- name: cache_subscription_id
UPDATE public.billing_accounts
   SET stripe_subscription_id = %(subscription_id)s
 WHERE id = %(account_id)s
   AND stripe_subscription_id IS NULL;
