-- Daily lane, job 3: reap unconfirmed signups (spec 000).

-- name: reap_unconfirmed_users
-- The platform's function takes only a retention and cuts off at the database's now() -
-- retention. nightcrew decides as of its own clock (a scheduled run's slot, or --now), so it
-- passes the retention that puts the cut-off at clock - 7 days: 7 days + (now() - clock), the
-- difference in plain seconds (an interval in days would move by an hour across a daylight
-- saving change in the session's time zone). With the real clock the two differ by the run's
-- start-up time; with --now ahead of the database's time the interval shrinks (and goes
-- negative past 7 days ahead).
SELECT deleted, skipped
  FROM public.reap_unconfirmed_users(
           make_interval(days => %(retention_days)s)
           + make_interval(secs => extract(epoch FROM now() - %(now)s::timestamptz)));
