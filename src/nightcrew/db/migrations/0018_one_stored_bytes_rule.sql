-- nightcrew:scope nightcrew
--
-- "Stored bytes per account" written once (issue 12). Migration 0014 wrote the rule twice (the
-- set for every account, the sum for one) and the storage cap trigger wrote it a third time.
-- From here nightcrew.account_stored_bytes is the rule, and everything else asks it:
-- * the bytes of an episode are enclosure + master (audio_file_size_bytes +
--   original_audio_file_size_bytes, count-both), summed over every podcast of the account;
-- * include_pending_deletion: true for the over-cap report and the storage cap trigger (spec
--   000: the report "mirrors the storage cap trigger"), false for the overage escalation
--   (scheduling the excess feed for deletion is the resolution; counting it would suspend an
--   account for bytes it already gave up);
-- * except_episode: the episode a write is about to change, left out — the storage cap
--   trigger adds that row's new size to what every other episode holds.
-- account_stored_bytes_of is a lookup into it. Migration 0019 points the reference schema's
-- storage cap trigger at it.
--
-- The body names the platform's tables, which a `--skip-reference` install may not have yet:
-- it is checked when first called, not here.
SET LOCAL check_function_bodies = off;

-- A new parameter is a new signature: the old one goes (SQL-bodied callers hold no dependency).
DROP FUNCTION nightcrew.account_stored_bytes(boolean);

CREATE FUNCTION nightcrew.account_stored_bytes(
    include_pending_deletion boolean, except_episode uuid DEFAULT NULL
) RETURNS TABLE (account_id uuid, bytes numeric)
LANGUAGE sql STABLE AS $$
    SELECT p.billing_account_id,
           sum(coalesce(e.audio_file_size_bytes, 0) + coalesce(e.original_audio_file_size_bytes, 0))
      FROM public.podcasts p
      JOIN public.episodes e ON e.podcast_id = p.id
     WHERE p.billing_account_id IS NOT NULL
       AND (include_pending_deletion OR p.status <> 'pending_deletion')
       AND (except_episode IS NULL OR e.id <> except_episode)
     GROUP BY p.billing_account_id
$$;

-- The planner inlines the set function and pushes the account filter below its GROUP BY: one
-- account's episodes are read, not every account's.
CREATE OR REPLACE FUNCTION nightcrew.account_stored_bytes_of(
    account uuid, include_pending_deletion boolean
) RETURNS numeric
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT s.bytes FROM nightcrew.account_stored_bytes(include_pending_deletion) s
          WHERE s.account_id = account),
        0)
$$;
