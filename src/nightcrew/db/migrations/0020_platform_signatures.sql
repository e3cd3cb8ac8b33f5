-- nightcrew:scope reference
--
-- The platform's functions exactly as spec 000 names them, and nothing of nightcrew's in the
-- platform's schemas (issue 22). Migrations 0001, 0005 and 0019 had drifted: an extra
-- `p_now` argument on effective_cap() and reap_unconfirmed_users(), a set-returning
-- public.account_caps() that no platform has, and a storage cap trigger that counted through
-- schema nightcrew. A development database now answers the same calls a production one does:
-- * public.reap_unconfirmed_users(retention interval) — cut-off now() - retention;
-- * public.effective_cap(account uuid, resource text) — per account, PL/pgSQL, live at now();
-- * public.notify_media_job_result(job_id uuid) — unchanged since 0001;
-- * trigger_enforce_storage_account_cap — the platform's own count (0004's body again).
-- nightcrew never passes a time to them: its --now moves only its own clock (README,
-- "Time travel").

DROP FUNCTION public.effective_cap(uuid, text, timestamptz);
DROP FUNCTION public.account_caps(timestamptz);

-- The live cap of one account for one resource, NULL = unlimited: an unexpired override wins
-- outright (its NULL means unlimited); otherwise the plan's limit (missing or NULL =
-- unlimited) plus every unexpired credit pool.
CREATE FUNCTION public.effective_cap(account uuid, resource text) RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_override record;
    v_plan     text;
    v_limit    numeric;
    v_credits  numeric;
BEGIN
    SELECT o.limit_value INTO v_override
      FROM public.cap_overrides o
     WHERE o.billing_account_id = account
       AND o.resource = effective_cap.resource
       AND (o.expires_at IS NULL OR o.expires_at > now());
    IF FOUND THEN
        RETURN v_override.limit_value;
    END IF;

    SELECT b.plan INTO v_plan FROM public.billing_accounts b WHERE b.id = account;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    SELECT l.limit_value INTO v_limit
      FROM public.plan_limits l
     WHERE l.plan = v_plan AND l.resource = effective_cap.resource;
    IF NOT FOUND OR v_limit IS NULL THEN
        RETURN NULL;
    END IF;

    SELECT coalesce(sum(c.amount), 0) INTO v_credits
      FROM public.credit_pools c
     WHERE c.billing_account_id = account
       AND c.resource = effective_cap.resource
       AND (c.expires_at IS NULL OR c.expires_at > now());
    RETURN v_limit + v_credits;
END
$$;

DROP FUNCTION public.reap_unconfirmed_users(interval, timestamptz);

-- De-provision and delete every unconfirmed, never-invited user older than the retention.
-- Each user is deleted in its own subtransaction: a row still held by a NO ACTION foreign key
-- (e.g. it owns a billing account) is skipped with a WARNING and counted, never fails the batch.
CREATE FUNCTION public.reap_unconfirmed_users(retention interval)
RETURNS TABLE (deleted integer, skipped integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_user record;
BEGIN
    deleted := 0;
    skipped := 0;
    FOR v_user IN
        SELECT u.id FROM auth.users u
         WHERE u.email_confirmed_at IS NULL
           AND u.invited_at IS NULL
           AND u.created_at <= now() - retention
         ORDER BY u.created_at
           FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            DELETE FROM auth.users WHERE id = v_user.id;
            deleted := deleted + 1;
        EXCEPTION WHEN foreign_key_violation THEN
            RAISE WARNING 'reap_unconfirmed_users: user % is still referenced, skipped: %',
                          v_user.id, SQLERRM;
            skipped := skipped + 1;
        END;
    END LOOP;
    RETURN NEXT;
END
$$;

-- Storage cap: an episode write that GROWS an account's audio + original bytes past its cap
-- raises 23514. Shrinking (or keeping) the bytes never trips it, so quarantine and corrections
-- always go through. Every podcast of the account counts; growth is serialised per account.
CREATE OR REPLACE FUNCTION public.enforce_storage_account_cap() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_account uuid;
    v_new     bigint := coalesce(NEW.audio_file_size_bytes, 0)
                        + coalesce(NEW.original_audio_file_size_bytes, 0);
    v_old     bigint := 0;
    v_others  numeric;
    v_cap     numeric;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.podcast_id = NEW.podcast_id THEN
        v_old := coalesce(OLD.audio_file_size_bytes, 0)
                 + coalesce(OLD.original_audio_file_size_bytes, 0);
    END IF;
    IF v_new <= v_old THEN
        RETURN NEW;
    END IF;

    SELECT p.billing_account_id INTO v_account FROM public.podcasts p WHERE p.id = NEW.podcast_id;
    IF v_account IS NULL THEN
        RETURN NEW;
    END IF;
    v_cap := public.effective_cap(v_account, 'storage_gb_per_account');
    IF v_cap IS NULL THEN
        RETURN NEW;
    END IF;

    -- One grower per account at a time; the SUM below then sees every committed byte.
    PERFORM pg_advisory_xact_lock(hashtextextended('storage_cap:' || v_account::text, 0));

    SELECT coalesce(sum(coalesce(e.audio_file_size_bytes, 0)
                        + coalesce(e.original_audio_file_size_bytes, 0)), 0)
      INTO v_others
      FROM public.episodes e
      JOIN public.podcasts p ON p.id = e.podcast_id
     WHERE p.billing_account_id = v_account
       AND e.id <> NEW.id;

    IF v_others + v_new > v_cap * 1000000000 THEN
        RAISE EXCEPTION 'storage cap exceeded for billing account %: % bytes > cap % GB',
                        v_account, v_others + v_new, v_cap
              USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;
