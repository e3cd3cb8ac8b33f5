-- nightcrew:scope reference
--
-- Two tightenings of the reference schema's guards:
-- * the storage cap serialises growth per account (two concurrent uploads could each pass
--   the check against the other's pre-insert total);
-- * the platform-column guard covers INSERT on episodes too (a user JWT creating an episode
--   with audio columns already set).

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

CREATE OR REPLACE FUNCTION public.guard_platform_owned_columns() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF auth.uid() IS NULL THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'podcasts' THEN
        IF (TG_OP = 'INSERT' AND NEW.overage_suspended_at IS NOT NULL)
           OR (TG_OP = 'UPDATE'
               AND NEW.overage_suspended_at IS DISTINCT FROM OLD.overage_suspended_at) THEN
            RAISE EXCEPTION 'podcasts.overage_suspended_at is platform-owned'
                  USING ERRCODE = '42501';
        END IF;
    ELSIF TG_TABLE_NAME = 'episodes' THEN
        IF (TG_OP = 'INSERT'
            AND (NEW.audio_url IS NOT NULL OR NEW.audio_file_size_bytes IS NOT NULL
                 OR NEW.original_audio_url IS NOT NULL
                 OR NEW.original_audio_file_size_bytes IS NOT NULL))
           OR (TG_OP = 'UPDATE'
               AND (NEW.audio_url IS DISTINCT FROM OLD.audio_url
                    OR NEW.audio_file_size_bytes IS DISTINCT FROM OLD.audio_file_size_bytes
                    OR NEW.original_audio_url IS DISTINCT FROM OLD.original_audio_url
                    OR NEW.original_audio_file_size_bytes
                       IS DISTINCT FROM OLD.original_audio_file_size_bytes)) THEN
            RAISE EXCEPTION 'episode audio columns are platform-owned'
                  USING ERRCODE = '42501';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER trigger_guard_episodes_audio_columns ON public.episodes;
CREATE TRIGGER trigger_guard_episodes_audio_columns
    BEFORE INSERT OR UPDATE ON public.episodes
    FOR EACH ROW EXECUTE FUNCTION public.guard_platform_owned_columns();
