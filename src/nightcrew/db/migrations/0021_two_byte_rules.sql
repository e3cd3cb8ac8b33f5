-- nightcrew:scope nightcrew
--
-- Spec 000 counts an account's stored bytes two ways, on purpose, and each rule is written
-- once here (issue 22):
-- * nightcrew.overcap_report_bytes() — the over-cap report (reconciler job 4): "per billing
--   account, SUM(audio_file_size_bytes + original_audio_file_size_bytes) (count-both: enclosure
--   + master, mirroring the storage cap trigger)", every podcast of the account;
-- * nightcrew.escalation_storage_bytes() — the overage escalation's scan: "storage =
--   SUM(episodes.audio_file_size_bytes) over non-pending_deletion podcasts". Masters do not
--   count, so an account holding FLAC masters is never armed, warned or suspended for them.
-- One account's figure is `SELECT bytes FROM <rule>() WHERE account_id = $1`: the planner
-- inlines the function and pushes the filter below its GROUP BY, so only that account's
-- episodes are read.
--
-- They replace migration 0014/0018's account_stored_bytes(include_pending_deletion), which
-- counted masters for both. The bodies name the platform's tables, which a `--skip-reference`
-- install may not have yet: they are checked when first called, not here.
SET LOCAL check_function_bodies = off;

-- Reference migration 0019 pointed the reference schema's cap trigger at the function dropped
-- below; 0020 gave it back its own count. A database that has 0019 but skipped 0020 would be
-- left with a trigger that fails every episode write: refuse, saying what to do.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = 'public' AND p.proname = 'enforce_storage_account_cap'
                  AND p.prosrc LIKE '%nightcrew.account_stored_bytes%') THEN
        RAISE EXCEPTION 'public.enforce_storage_account_cap() still counts through '
                        'nightcrew.account_stored_bytes (reference migration 0019 of a '
                        'development database): run `nightcrew db migrate` without '
                        '--skip-reference to apply 0020 first; on a platform database, give '
                        'the cap trigger back the platform''s own function';
    END IF;
END
$$;

DROP FUNCTION nightcrew.account_stored_bytes_of(uuid, boolean);
DROP FUNCTION nightcrew.account_stored_bytes(boolean, uuid);

CREATE FUNCTION nightcrew.overcap_report_bytes()
RETURNS TABLE (account_id uuid, bytes numeric)
LANGUAGE sql STABLE AS $$
    SELECT p.billing_account_id,
           sum(coalesce(e.audio_file_size_bytes, 0) + coalesce(e.original_audio_file_size_bytes, 0))
      FROM public.podcasts p
      JOIN public.episodes e ON e.podcast_id = p.id
     WHERE p.billing_account_id IS NOT NULL
     GROUP BY p.billing_account_id
$$;

CREATE FUNCTION nightcrew.escalation_storage_bytes()
RETURNS TABLE (account_id uuid, bytes numeric)
LANGUAGE sql STABLE AS $$
    SELECT p.billing_account_id, sum(coalesce(e.audio_file_size_bytes, 0))
      FROM public.podcasts p
      JOIN public.episodes e ON e.podcast_id = p.id
     WHERE p.billing_account_id IS NOT NULL
       AND p.status <> 'pending_deletion'
     GROUP BY p.billing_account_id
$$;
