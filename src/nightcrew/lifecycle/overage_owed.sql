-- name: owner_email
SELECT coalesce(up.email, u.email) AS email
  FROM public.billing_accounts b
  LEFT JOIN public.user_profiles up ON up.id = b.owner_user_id
  LEFT JOIN auth.users u ON u.id = b.owner_user_id
 WHERE b.id = %(id)s;

-- name: claim_stage
-- The advance-once guard: exactly one caller's claim matches, whatever raced it.
UPDATE public.billing_accounts
   SET content_overage_nag_stage = %(stage)s, content_overage_last_nag_at = %(now)s
 WHERE id = %(id)s
   AND content_overage_since = %(since)s
   AND content_overage_nag_stage < %(stage)s
RETURNING content_overage_nag_stage;
