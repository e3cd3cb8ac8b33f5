-- The hosted-content overage escalation (spec 000 "Hosted-content overage escalation sweep").
-- Occupancy = active/paused podcasts of any hosting type (pending_deletion excluded); storage =
-- the escalation's byte rule, nightcrew.escalation_storage_bytes() (audio_file_size_bytes over
-- non-pending_deletion podcasts; migration 0021); caps from the platform's own
-- public.effective_cap(account, resource), live (NULL = unlimited).

-- name: scan
-- Only accounts that can need work — over either cap, armed, or stamped — of one slice of the
-- accounts (slice of slices, by the account id's last byte; the sweep runs the slices at once
-- on as many connections). Usage is measured set-based here; each account that uses a
-- resource is then confirmed against the platform's effective_cap(), which "resolves live —
-- overrides and credit pools included": a PL/pgSQL call of ~10 µs, two per account, the bulk
-- of the scan's cost and the part the slices share out. A resource an account does not use
-- (no occupying podcast, no stored byte) is not asked: a cap is never below zero, so nothing
-- is over it. MATERIALIZED keeps each cap one call: inlined, the filter below would repeat the
-- call for every mention.
WITH occupancy AS (
    SELECT p.billing_account_id AS account_id,
           count(*) FILTER (WHERE p.status IN ('active', 'paused')) AS podcasts,
           bool_or(p.overage_suspended_at IS NOT NULL) AS stamped
      FROM public.podcasts p
     WHERE p.billing_account_id IS NOT NULL
       AND mod(get_byte(uuid_send(p.billing_account_id), 15), %(slices)s) = %(slice)s
     GROUP BY p.billing_account_id
), storage AS (
    SELECT s.account_id, s.bytes
      FROM nightcrew.escalation_storage_bytes() s
     WHERE mod(get_byte(uuid_send(s.account_id), 15), %(slices)s) = %(slice)s
), measured AS MATERIALIZED (
    SELECT b.id, b.content_overage_since, b.content_overage_deadline,
           b.content_overage_nag_stage, b.content_overage_last_nag_at,
           coalesce(o.podcasts, 0) AS podcasts, coalesce(s.bytes, 0) AS bytes,
           coalesce(o.stamped, false) AS stamped
      FROM public.billing_accounts b
      LEFT JOIN occupancy o ON o.account_id = b.id
      LEFT JOIN storage s ON s.account_id = b.id
     WHERE (o.account_id IS NOT NULL OR b.content_overage_since IS NOT NULL)
       AND mod(get_byte(uuid_send(b.id), 15), %(slices)s) = %(slice)s
), capped AS MATERIALIZED (
    SELECT m.*,
           CASE WHEN m.podcasts > 0
                THEN public.effective_cap(m.id, 'podcasts_per_account') END AS podcast_cap,
           CASE WHEN m.bytes > 0
                THEN public.effective_cap(m.id, 'storage_gb_per_account') END AS storage_cap_gb
      FROM measured m
)
SELECT *
  FROM capped
 WHERE content_overage_since IS NOT NULL
    OR stamped
    OR (podcast_cap IS NOT NULL AND podcasts > podcast_cap)
    OR (storage_cap_gb IS NOT NULL AND bytes > storage_cap_gb * 1000000000);

-- name: measure_account
-- The same measurements as the scan, for one account, taken right before acting on it (and by
-- the webhook's entry point). A test keeps the two in agreement.
WITH measured AS MATERIALIZED (
    SELECT b.id, b.content_overage_since, b.content_overage_deadline,
           b.content_overage_nag_stage, b.content_overage_last_nag_at,
           (SELECT count(*) FROM public.podcasts p
             WHERE p.billing_account_id = b.id AND p.status IN ('active', 'paused')) AS podcasts,
           coalesce((SELECT s.bytes FROM nightcrew.escalation_storage_bytes() s
                      WHERE s.account_id = b.id), 0) AS bytes,
           EXISTS (SELECT 1 FROM public.podcasts p
                    WHERE p.billing_account_id = b.id AND p.overage_suspended_at IS NOT NULL)
               AS stamped
      FROM public.billing_accounts b
     WHERE b.id = %(account_id)s
)
SELECT m.*,
       CASE WHEN m.podcasts > 0
            THEN public.effective_cap(m.id, 'podcasts_per_account') END AS podcast_cap,
       CASE WHEN m.bytes > 0
            THEN public.effective_cap(m.id, 'storage_gb_per_account') END AS storage_cap_gb
  FROM measured m;

-- name: arm
-- First detection wins: an armed clock is never re-armed or extended.
UPDATE public.billing_accounts
   SET content_overage_since = %(now)s,
       content_overage_deadline = %(now)s + make_interval(days => %(grace_days)s),
       content_overage_nag_stage = -1,
       content_overage_last_nag_at = NULL
 WHERE id = %(id)s AND content_overage_since IS NULL
RETURNING content_overage_since, content_overage_deadline, content_overage_nag_stage,
          content_overage_last_nag_at;

-- name: read_clock
SELECT content_overage_since, content_overage_deadline, content_overage_nag_stage,
       content_overage_last_nag_at
  FROM public.billing_accounts WHERE id = %(id)s;

-- name: lock_clock
-- Stamps and restores re-check the clock under the account's row lock: the other entry point
-- may have moved it since this caller read it.
SELECT content_overage_since, content_overage_nag_stage
  FROM public.billing_accounts WHERE id = %(id)s FOR UPDATE;

-- name: occupying_podcasts
-- Oldest first (tie-break id): the first `cap` keep serving on a count-only overage.
SELECT id, slug, title, overage_suspended_at
  FROM public.podcasts
 WHERE billing_account_id = %(id)s AND status IN ('active', 'paused')
 ORDER BY created_at, id;

-- name: stamp
UPDATE public.podcasts
   SET overage_suspended_at = %(now)s, updated_at = %(now)s
 WHERE id = ANY(%(ids)s::uuid[]) AND overage_suspended_at IS NULL
RETURNING id, slug;

-- name: unstamp_except
-- Clear every stamp of the account that is not in the (re-derived) sanction set; never
-- touches is_active or status.
UPDATE public.podcasts
   SET overage_suspended_at = NULL, updated_at = %(now)s
 WHERE billing_account_id = %(id)s
   AND overage_suspended_at IS NOT NULL
   AND NOT (id = ANY(%(keep)s::uuid[]))
RETURNING id, slug;

-- name: newest_stamp
-- The restore of an account stamped but not armed: its restored email's `{since}` (overage.py).
SELECT max(overage_suspended_at) AS newest
  FROM public.podcasts
 WHERE billing_account_id = %(id)s AND overage_suspended_at IS NOT NULL;

-- name: disarm
UPDATE public.billing_accounts
   SET content_overage_since = NULL, content_overage_deadline = NULL,
       content_overage_nag_stage = NULL, content_overage_last_nag_at = NULL
 WHERE id = %(id)s AND content_overage_since IS NOT DISTINCT FROM %(since)s;

