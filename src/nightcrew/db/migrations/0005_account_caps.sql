-- nightcrew:scope reference
--
-- Caps as one set-returning SQL function, so that a sweep over 100,000 accounts computes them
-- set-based in a single query instead of calling a PL/pgSQL function twice per account.
-- effective_cap() becomes a lookup into the same function (PostgreSQL inlines both), so there
-- is exactly one definition of "the live cap": an unexpired override wins outright (its NULL
-- means unlimited); otherwise the plan's limit (missing or NULL = unlimited) plus every
-- unexpired credit pool.

CREATE FUNCTION public.account_caps(p_now timestamptz DEFAULT now())
RETURNS TABLE (account_id uuid, resource text, cap numeric)
LANGUAGE sql STABLE AS $$
    SELECT b.id, r.resource,
           CASE WHEN o.billing_account_id IS NOT NULL THEN o.limit_value
                WHEN l.limit_value IS NULL THEN NULL
                ELSE l.limit_value + coalesce(credits.amount, 0)
           END
      FROM public.billing_accounts b
     CROSS JOIN (VALUES ('storage_gb_per_account'), ('podcasts_per_account')) AS r (resource)
      LEFT JOIN public.cap_overrides o
             ON o.billing_account_id = b.id AND o.resource = r.resource
            AND (o.expires_at IS NULL OR o.expires_at > p_now)
      LEFT JOIN public.plan_limits l ON l.plan = b.plan AND l.resource = r.resource
      LEFT JOIN LATERAL (
             SELECT sum(c.amount) AS amount
               FROM public.credit_pools c
              WHERE c.billing_account_id = b.id AND c.resource = r.resource
                AND (c.expires_at IS NULL OR c.expires_at > p_now)
           ) credits ON l.limit_value IS NOT NULL AND o.billing_account_id IS NULL
$$;

CREATE OR REPLACE FUNCTION public.effective_cap(
    account uuid, resource text, p_now timestamptz DEFAULT now()
) RETURNS numeric
LANGUAGE sql STABLE AS $$
    SELECT c.cap FROM public.account_caps(p_now) c
     WHERE c.account_id = account AND c.resource = effective_cap.resource
$$;
