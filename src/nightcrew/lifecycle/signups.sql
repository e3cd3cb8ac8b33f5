-- Daily lane, job 3: reap unconfirmed signups (spec 000).

-- name: reap_unconfirmed_users
SELECT deleted, skipped
  FROM public.reap_unconfirmed_users(make_interval(days => %(retention_days)s), %(now)s);
