-- nightcrew:scope reference
--
-- The storage cap trigger counts through nightcrew.account_stored_bytes (migration 0018)
-- instead of a sum of its own, so the cap, the over-cap report and the overage escalation
-- cannot drift apart. Behaviour is 0004's: every podcast of the account counts
-- (pending_deletion included), the row being written is left out of "the others" and its new
-- size added, growth is serialised per account.

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

    -- One grower per account at a time; the count below then sees every committed byte.
    PERFORM pg_advisory_xact_lock(hashtextextended('storage_cap:' || v_account::text, 0));

    SELECT coalesce(sum(s.bytes), 0)
      INTO v_others
      FROM nightcrew.account_stored_bytes(true, NEW.id) s
     WHERE s.account_id = v_account;

    IF v_others + v_new > v_cap * 1000000000 THEN
        RAISE EXCEPTION 'storage cap exceeded for billing account %: % bytes > cap % GB',
                        v_account, v_others + v_new, v_cap
              USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;
