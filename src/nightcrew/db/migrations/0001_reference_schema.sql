-- nightcrew:scope reference
--
-- The podcast platform's reference schema (spec 000's names, exactly). nightcrew creates it so
-- that it runs and is tested against the shapes production has; against a production database
-- `nightcrew db migrate --skip-reference` leaves the platform's tables alone and
-- `nightcrew db check` verifies them instead.
--
-- Only core PostgreSQL features: the embedded server (pgserver) ships no contrib extensions.

CREATE SCHEMA IF NOT EXISTS auth;

CREATE TABLE auth.users (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email              text,
    email_confirmed_at timestamptz,
    invited_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now()
);

-- The reaper's scan: unconfirmed, never-invited users, oldest first.
CREATE INDEX idx_auth_users_unconfirmed ON auth.users (created_at)
    WHERE email_confirmed_at IS NULL AND invited_at IS NULL;

-- The caller's user id from the request JWT; NULL for the service/owner role that nightcrew uses.
CREATE FUNCTION auth.uid() RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('request.jwt.claim.sub', true), '')::uuid
$$;

CREATE TABLE public.billing_accounts (
    id                          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    -- NO ACTION on purpose: an account owner can never be reaped from under the account.
    owner_user_id               uuid REFERENCES auth.users (id),
    billing_model               text NOT NULL DEFAULT 'subscription'
        CHECK (billing_model IN ('subscription', 'enterprise_manual', 'ltd')),
    plan                        text NOT NULL DEFAULT 'free',
    stripe_customer_id          text,
    stripe_subscription_id      text,
    content_overage_since       timestamptz,
    content_overage_deadline    timestamptz,
    content_overage_nag_stage   smallint CHECK (content_overage_nag_stage BETWEEN -1 AND 4),
    content_overage_last_nag_at timestamptz,
    created_at                  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_billing_accounts_owner ON public.billing_accounts (owner_user_id);
CREATE INDEX idx_billing_accounts_overage_armed ON public.billing_accounts (content_overage_since)
    WHERE content_overage_since IS NOT NULL;

CREATE TABLE public.user_profiles (
    id                 uuid PRIMARY KEY REFERENCES auth.users (id) ON DELETE CASCADE,
    email              text,
    billing_account_id uuid REFERENCES public.billing_accounts (id) ON DELETE SET NULL
);
CREATE INDEX idx_user_profiles_billing_account ON public.user_profiles (billing_account_id);

CREATE TABLE public.podcasts (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    billing_account_id    uuid REFERENCES public.billing_accounts (id),
    slug                  text NOT NULL UNIQUE,
    title                 text NOT NULL DEFAULT '',
    status                text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'paused', 'pending_deletion')),
    is_active             boolean NOT NULL DEFAULT true,
    hosting_type          text NOT NULL DEFAULT 'podcasterplus'
        CHECK (hosting_type IN ('podcasterplus', 'external')),
    paused_at             timestamptz,
    pause_expires_at      timestamptz,
    last_pause_ended_at   timestamptz,
    deletion_scheduled_at timestamptz,
    deletion_redirect_url text,
    overage_suspended_at  timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_podcasts_billing_account ON public.podcasts (billing_account_id);
CREATE INDEX idx_podcasts_pause_expiry ON public.podcasts (pause_expires_at)
    WHERE status = 'paused';
CREATE INDEX idx_podcasts_deletion_due ON public.podcasts (deletion_scheduled_at)
    WHERE status = 'pending_deletion';
CREATE INDEX idx_podcasts_overage_suspended ON public.podcasts (billing_account_id)
    WHERE overage_suspended_at IS NOT NULL;

CREATE TABLE public.podcast_members (
    podcast_id uuid NOT NULL REFERENCES public.podcasts (id) ON DELETE CASCADE,
    user_id    uuid NOT NULL REFERENCES auth.users (id) ON DELETE CASCADE,
    role       text NOT NULL DEFAULT 'owner'
        CHECK (role IN ('owner', 'admin', 'editor', 'viewer')),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (podcast_id, user_id)
);
CREATE INDEX idx_podcast_members_user ON public.podcast_members (user_id);
CREATE INDEX idx_podcast_members_owner ON public.podcast_members (podcast_id)
    WHERE role = 'owner';

CREATE TABLE public.episodes (
    id                              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    podcast_id                      uuid NOT NULL REFERENCES public.podcasts (id) ON DELETE CASCADE,
    title                           text NOT NULL DEFAULT '',
    status                          text NOT NULL DEFAULT 'draft'
        CHECK (status IN ('draft', 'scheduled', 'published', 'archived')),
    audio_url                       text,
    audio_file_size_bytes           bigint,
    original_audio_url              text,
    original_audio_file_size_bytes  bigint,
    cover_image_url                 text,
    published_at                    timestamptz,
    scheduled_for                   timestamptz,
    external_link_status            text
        CHECK (external_link_status IN ('pending', 'linked', 'failed')),
    external_link_attempt           integer NOT NULL DEFAULT 0,
    external_link_next_attempt_at   timestamptz,
    external_link_last_attempt_at   timestamptz,
    created_at                      timestamptz NOT NULL DEFAULT now(),
    updated_at                      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_episodes_podcast ON public.episodes (podcast_id);
-- sweepStalledExternalLinks: only pending rows, ordered by when they were due. NULL (schema
-- drift, rescued first) folds into -infinity so "due" is one index range, not an OR.
CREATE INDEX idx_episodes_external_link_pending
    ON public.episodes ((coalesce(external_link_next_attempt_at, '-infinity'::timestamptz)))
    WHERE external_link_status = 'pending';
CREATE INDEX idx_episodes_audio_url ON public.episodes (audio_url) WHERE audio_url IS NOT NULL;
CREATE INDEX idx_episodes_original_audio_url ON public.episodes (original_audio_url)
    WHERE original_audio_url IS NOT NULL;
CREATE INDEX idx_episodes_cover_image_url ON public.episodes (cover_image_url)
    WHERE cover_image_url IS NOT NULL;

CREATE TABLE public.automation_jobs (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    episode_id   uuid NOT NULL REFERENCES public.episodes (id) ON DELETE CASCADE,
    trigger_type text NOT NULL CHECK (trigger_type IN ('time', 'event')),
    status       text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'done', 'canceled')),
    run_at       timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_automation_jobs_pending ON public.automation_jobs (episode_id)
    WHERE status = 'pending';

-- Durable feed-invalidation intents, drained over the confirmable HTTP lane. No foreign key:
-- an intent must outlive the podcast it names.
CREATE TABLE public.feed_invalidation_outbox (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    podcast_id   uuid NOT NULL,
    reason       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text
);
CREATE INDEX idx_feed_invalidation_outbox_pending ON public.feed_invalidation_outbox (created_at)
    WHERE delivered_at IS NULL;

CREATE TABLE public.podcast_imports (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    podcast_id           uuid NOT NULL REFERENCES public.podcasts (id) ON DELETE CASCADE,
    status               text NOT NULL DEFAULT 'preview'
        CHECK (status IN ('preview', 'running', 'completed', 'failed', 'canceled')),
    is_hosting_migration boolean NOT NULL DEFAULT false,
    started_at           timestamptz,
    dispatch_end_at      timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_podcast_imports_podcast ON public.podcast_imports (podcast_id);
-- One active hosting migration per podcast: a wedged preview row blocks every later commit
-- (the reason sweepStuckHostingMigrationPreviews exists).
CREATE UNIQUE INDEX idx_podcast_imports_hosting_migration_active
    ON public.podcast_imports (podcast_id)
    WHERE is_hosting_migration AND status IN ('preview', 'running');
-- sweepStalledImports drives from the (few) running parents.
CREATE INDEX idx_podcast_imports_running ON public.podcast_imports (id)
    WHERE status = 'running';
-- sweepStuckHostingMigrationPreviews.
CREATE INDEX idx_podcast_imports_stuck_preview ON public.podcast_imports (created_at)
    WHERE is_hosting_migration AND status = 'preview' AND started_at IS NULL;

CREATE TABLE public.import_items (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    import_id  uuid NOT NULL REFERENCES public.podcast_imports (id) ON DELETE CASCADE,
    status     text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'processing', 'completed', 'failed')),
    attempts   integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_import_items_import ON public.import_items (import_id);
-- sweepStalledImports: only the non-terminal rows are indexed, so the index stays as small as
-- the live work however large the history grows.
CREATE INDEX idx_import_items_active ON public.import_items (import_id, updated_at)
    WHERE status IN ('pending', 'processing');

CREATE TABLE public.media_jobs (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    episode_id uuid NOT NULL REFERENCES public.episodes (id) ON DELETE CASCADE,
    type       text NOT NULL,
    status     text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    error      text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- One active job per (episode, type): a wedged row blocks every later job of that kind.
CREATE UNIQUE INDEX idx_media_jobs_one_active ON public.media_jobs (episode_id, type)
    WHERE status IN ('pending', 'running');
CREATE INDEX idx_media_jobs_active_updated ON public.media_jobs (updated_at)
    WHERE status IN ('pending', 'running');

-- Caps. limit_value NULL = unlimited. Storage is in GB (10^9 bytes).
CREATE TABLE public.plan_limits (
    plan        text NOT NULL,
    resource    text NOT NULL CHECK (resource IN ('storage_gb_per_account', 'podcasts_per_account')),
    limit_value numeric,
    PRIMARY KEY (plan, resource)
);

CREATE TABLE public.cap_overrides (
    billing_account_id uuid NOT NULL REFERENCES public.billing_accounts (id) ON DELETE CASCADE,
    resource           text NOT NULL
        CHECK (resource IN ('storage_gb_per_account', 'podcasts_per_account')),
    limit_value        numeric,
    expires_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (billing_account_id, resource)
);

CREATE TABLE public.credit_pools (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    billing_account_id uuid NOT NULL REFERENCES public.billing_accounts (id) ON DELETE CASCADE,
    resource           text NOT NULL
        CHECK (resource IN ('storage_gb_per_account', 'podcasts_per_account')),
    amount             numeric NOT NULL CHECK (amount >= 0),
    expires_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_credit_pools_account ON public.credit_pools (billing_account_id, resource);

-- The live cap of one account for one resource, NULL = unlimited:
-- an unexpired override wins outright (its NULL means unlimited); otherwise the plan's limit
-- (missing or NULL = unlimited) plus every unexpired credit pool.
CREATE FUNCTION public.effective_cap(
    account uuid, resource text, p_now timestamptz DEFAULT now()
) RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_override record;
    v_plan     text;
    v_limit    numeric;
    v_found    boolean;
    v_credits  numeric;
BEGIN
    SELECT o.limit_value INTO v_override
      FROM public.cap_overrides o
     WHERE o.billing_account_id = account
       AND o.resource = effective_cap.resource
       AND (o.expires_at IS NULL OR o.expires_at > p_now);
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
    v_found := FOUND;
    IF NOT v_found OR v_limit IS NULL THEN
        RETURN NULL;
    END IF;

    SELECT coalesce(sum(c.amount), 0) INTO v_credits
      FROM public.credit_pools c
     WHERE c.billing_account_id = account
       AND c.resource = effective_cap.resource
       AND (c.expires_at IS NULL OR c.expires_at > p_now);
    RETURN v_limit + v_credits;
END
$$;

-- Storage cap: an episode write that GROWS an account's audio + original bytes past its cap
-- raises 23514. Shrinking (or keeping) the bytes never trips it, so quarantine and
-- corrections always go through.
CREATE FUNCTION public.enforce_storage_account_cap() RETURNS trigger
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

CREATE TRIGGER trigger_enforce_storage_account_cap
    BEFORE INSERT OR UPDATE OF audio_file_size_bytes, original_audio_file_size_bytes, podcast_id
    ON public.episodes
    FOR EACH ROW EXECUTE FUNCTION public.enforce_storage_account_cap();

-- Platform-owned columns: a browser session (a user JWT, auth.uid() NOT NULL) may not write the
-- overage suspension stamp or the episode audio columns. The service role (NULL uid) may.
CREATE FUNCTION public.guard_platform_owned_columns() RETURNS trigger
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
    ELSIF TG_TABLE_NAME = 'episodes' AND TG_OP = 'UPDATE' THEN
        IF NEW.audio_url IS DISTINCT FROM OLD.audio_url
           OR NEW.audio_file_size_bytes IS DISTINCT FROM OLD.audio_file_size_bytes
           OR NEW.original_audio_url IS DISTINCT FROM OLD.original_audio_url
           OR NEW.original_audio_file_size_bytes IS DISTINCT FROM OLD.original_audio_file_size_bytes
        THEN
            RAISE EXCEPTION 'episode audio columns are platform-owned'
                  USING ERRCODE = '42501';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER trigger_guard_podcasts_platform_columns
    BEFORE INSERT OR UPDATE ON public.podcasts
    FOR EACH ROW EXECUTE FUNCTION public.guard_platform_owned_columns();
CREATE TRIGGER trigger_guard_episodes_audio_columns
    BEFORE UPDATE ON public.episodes
    FOR EACH ROW EXECUTE FUNCTION public.guard_platform_owned_columns();

-- De-provision and delete every unconfirmed, never-invited user older than the retention.
-- Each user is deleted in its own subtransaction: a row still held by a NO ACTION foreign key
-- (e.g. it owns a billing account) is skipped with a WARNING and counted, never fails the batch.
CREATE FUNCTION public.reap_unconfirmed_users(
    retention interval, p_now timestamptz DEFAULT now()
) RETURNS TABLE (deleted integer, skipped integer)
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
           AND u.created_at <= p_now - retention
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

-- Tell whoever awaits a media job (the workflow, the UI) that it reached a result.
CREATE FUNCTION public.notify_media_job_result(job_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_job record;
BEGIN
    SELECT id, episode_id, type, status, error INTO v_job
      FROM public.media_jobs WHERE id = job_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('media_job_result', json_build_object(
        'job_id', v_job.id, 'episode_id', v_job.episode_id, 'type', v_job.type,
        'status', v_job.status, 'error', v_job.error)::text);
END
$$;
