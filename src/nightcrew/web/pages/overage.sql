-- name: overage_clocks
-- Accounts on the clock, soonest deadline first, measured as the escalation measures them.
SELECT b.id, b.content_overage_since AS since, b.content_overage_deadline AS deadline,
       b.content_overage_nag_stage AS stage, b.content_overage_last_nag_at AS last_nag_at,
       coalesce(up.email, u.email) AS owner_email,
       (SELECT count(*) FROM public.podcasts p
         WHERE p.billing_account_id = b.id AND p.status IN ('active', 'paused')) AS podcasts,
       coalesce((SELECT s.bytes FROM nightcrew.escalation_storage_bytes() s
                  WHERE s.account_id = b.id), 0) AS bytes,
       public.effective_cap(b.id, 'podcasts_per_account') AS podcast_cap,
       public.effective_cap(b.id, 'storage_gb_per_account') AS storage_cap_gb
  FROM public.billing_accounts b
  LEFT JOIN public.user_profiles up ON up.id = b.owner_user_id
  LEFT JOIN auth.users u ON u.id = b.owner_user_id
 WHERE b.content_overage_since IS NOT NULL
 ORDER BY b.content_overage_deadline, b.id
 LIMIT %(limit)s;

-- name: suspended_feeds
SELECT billing_account_id AS account_id, id, slug, title, overage_suspended_at
  FROM public.podcasts
 WHERE billing_account_id = ANY(%(accounts)s::uuid[]) AND overage_suspended_at IS NOT NULL
 ORDER BY billing_account_id, overage_suspended_at, slug;

-- name: overage_restored
-- Restorations the daily lane recorded (report.jobs.runOverageEscalation.restored).
SELECT r.id AS run_id, r.started_at, x.value ->> 'account_id' AS account_id,
       x.value ->> 'since' AS since, x.value -> 'podcasts' AS podcasts
  FROM nightcrew.runs r
 CROSS JOIN LATERAL jsonb_array_elements(
     CASE WHEN jsonb_typeof(r.report -> 'jobs' -> 'runOverageEscalation' -> 'restored') = 'array'
          THEN r.report -> 'jobs' -> 'runOverageEscalation' -> 'restored'
          ELSE '[]'::jsonb END) x
 WHERE r.lane = 'daily' AND r.started_at >= %(since)s AND r.started_at < %(until)s
 ORDER BY r.started_at DESC, r.id DESC
 LIMIT %(limit)s;

-- name: overage_clock_count
SELECT count(*) AS n FROM public.billing_accounts WHERE content_overage_since IS NOT NULL;
