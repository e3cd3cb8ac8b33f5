-- Billing resume after a paused podcast is reactivated (spec 000
-- resumeOwnerBillingAfterReactivation): owner → billing account → subscription.

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

-- name: billing_account
SELECT id, billing_model, stripe_customer_id, stripe_subscription_id
  FROM public.billing_accounts WHERE id = %(account_id)s;

-- name: cache_subscription_id
UPDATE public.billing_accounts
   SET stripe_subscription_id = %(subscription_id)s
 WHERE id = %(account_id)s
   AND stripe_subscription_id IS NULL;
