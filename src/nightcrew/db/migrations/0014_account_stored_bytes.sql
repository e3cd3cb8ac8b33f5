-- nightcrew:scope nightcrew
--
-- "Stored bytes per account" in one place (issue 12). Count-both: enclosure + master
-- (audio_file_size_bytes + original_audio_file_size_bytes), as the storage cap trigger counts.
-- Spec 000 wants two populations and says so on purpose:
-- * the over-cap report mirrors the storage cap trigger: every podcast of the account;
-- * the overage escalation excludes pending_deletion podcasts ("scheduling the excess feed for
--   deletion is the resolution and counting it would drive an empty-sanction suspension").
-- So one rule with one switch: include_pending_deletion.
--
-- The bodies name the platform's tables, which a `--skip-reference` install may not have yet:
-- they are checked when first called, not here.
SET LOCAL check_function_bodies = off;

CREATE FUNCTION nightcrew.account_stored_bytes(include_pending_deletion boolean)
RETURNS TABLE (account_id uuid, bytes numeric)
LANGUAGE sql STABLE AS $$
    SELECT p.billing_account_id,
           sum(coalesce(e.audio_file_size_bytes, 0) + coalesce(e.original_audio_file_size_bytes, 0))
      FROM public.podcasts p
      JOIN public.episodes e ON e.podcast_id = p.id
     WHERE p.billing_account_id IS NOT NULL
       AND (include_pending_deletion OR p.status <> 'pending_deletion')
     GROUP BY p.billing_account_id
$$;

CREATE FUNCTION nightcrew.account_stored_bytes_of(account uuid, include_pending_deletion boolean)
RETURNS numeric
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(coalesce(e.audio_file_size_bytes, 0)
                        + coalesce(e.original_audio_file_size_bytes, 0)), 0)
      FROM public.podcasts p
      JOIN public.episodes e ON e.podcast_id = p.id
     WHERE p.billing_account_id = account
       AND (include_pending_deletion OR p.status <> 'pending_deletion')
$$;
