-- The platform twin: the podcast platform's database as spec 000 describes it, written from the
-- spec's words and nightcrew's contract (src/nightcrew/db/contract.py) — NOT from nightcrew's
-- reference migrations. It is an independent oracle: nightcrew must run on it after
-- `nightcrew db migrate --skip-reference` exactly as it would on production.
--
-- On purpose it differs from nightcrew's reference schema the way a real platform would:
-- * extra platform columns nightcrew never reads (podcasts.description, episodes.duration_seconds,
--   billing_accounts.stripe_price_id, …) and a different column order;
-- * extra tables (guest_links, crm_contacts, episode_transcripts) — two of them hold users by
--   NO ACTION foreign keys, which is what the reaper's "skipped with a WARNING" is about;
-- * caps kept in tables of the platform's own naming (public.plans, billing_accounts.plan_id,
--   public.account_cap_overrides, public.storage_credit_grants): no plan_limits, cap_overrides,
--   credit_pools or billing_accounts.plan — nightcrew may only ask public.effective_cap();
-- * updated_at maintained by triggers, and a touch trigger that bumps the parent podcast's
--   updated_at whenever one of its episodes changes ("the parent podcast (touch trigger)");
-- * Supabase-style functions: SECURITY DEFINER where they act for a user, search_path pinned;
-- * the shapes `db check` must tolerate because nightcrew works on them: Supabase's
--   auth.users.email character varying(255), an enum for podcasts.status, an integer (not
--   smallint) content_overage_nag_stage, and the reaper written with OUT parameters (its result
--   prints as `record`; nightcrew reads deleted and skipped by name either way).
--
-- Spec 000's platform functions, with exactly the spec's signatures and the database's now():
--   public.reap_unconfirmed_users(retention interval, OUT deleted integer, OUT skipped integer)
--   public.effective_cap(account uuid, resource text) RETURNS numeric   (PL/pgSQL, per account)
--   public.notify_media_job_result(job_id uuid) RETURNS void
--   auth.uid() RETURNS uuid
-- and its triggers: trigger_enforce_storage_account_cap (23514) and the platform-owned column
-- guard (42501 for a user JWT).
--
-- Core PostgreSQL only (no extensions): it also loads into the embedded test server.

CREATE SCHEMA IF NOT EXISTS auth;

-- ------------------------------------------------------------------------------------------
-- auth: the identity provider's tables (Supabase GoTrue's shape, trimmed)
-- ------------------------------------------------------------------------------------------

CREATE TABLE auth.users (
    instance_id          uuid,
    id                   uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    aud                  text DEFAULT 'authenticated',
    role                 text DEFAULT 'authenticated',
    email                character varying(255),
    encrypted_password   text,
    email_confirmed_at   timestamptz,
    invited_at           timestamptz,
    confirmation_token   text,
    confirmation_sent_at timestamptz,
    phone                text,
    phone_confirmed_at   timestamptz,
    confirmed_at         timestamptz GENERATED ALWAYS AS (least(email_confirmed_at, phone_confirmed_at)) STORED,
    last_sign_in_at      timestamptz,
    raw_app_meta_data    jsonb NOT NULL DEFAULT '{}'::jsonb,
    raw_user_meta_data   jsonb NOT NULL DEFAULT '{}'::jsonb,
    is_anonymous         boolean NOT NULL DEFAULT false,
    updated_at           timestamptz DEFAULT now(),
    created_at           timestamptz DEFAULT now()
);
CREATE UNIQUE INDEX users_email_partial_key ON auth.users (email) WHERE email IS NOT NULL;
-- The signup reaper's scan: unconfirmed, never-invited users by age.
CREATE INDEX idx_auth_users_unconfirmed ON auth.users (created_at)
    WHERE email_confirmed_at IS NULL AND invited_at IS NULL;

-- The caller's user id from the request's JWT; NULL for the service/owner role.
CREATE FUNCTION auth.uid() RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        nullif(current_setting('request.jwt.claim.sub', true), ''),
        (nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub')
    )::uuid
$$;

-- ------------------------------------------------------------------------------------------
-- Plans and caps, in the platform's own words
-- ------------------------------------------------------------------------------------------

CREATE TABLE public.plans (
    id                  text PRIMARY KEY,
    display_name        text NOT NULL,
    monthly_price_cents integer NOT NULL DEFAULT 0,
    podcast_slots       integer,  -- NULL = unlimited
    storage_gb          numeric,  -- NULL = unlimited; GB = 10^9 bytes
    is_public           boolean NOT NULL DEFAULT true
);
INSERT INTO public.plans (id, display_name, monthly_price_cents, podcast_slots, storage_gb) VALUES
    ('free', 'Free', 0, 1, 1),
    ('creator', 'Creator', 1900, 3, 50),
    ('network', 'Network', 9900, NULL, NULL);

CREATE TABLE public.billing_accounts (
    id                          uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now(),
    display_name                text,
    plan_id                     text NOT NULL DEFAULT 'free' REFERENCES public.plans (id),
    stripe_customer_id          text UNIQUE,
    stripe_price_id             text,
    stripe_subscription_id      text,
    billing_model               text NOT NULL DEFAULT 'subscription'
        CONSTRAINT billing_accounts_billing_model_check
        CHECK (billing_model IN ('subscription', 'enterprise_manual', 'ltd')),
    content_overage_last_nag_at timestamptz,
    content_overage_nag_stage   integer
        CHECK (content_overage_nag_stage >= -1 AND content_overage_nag_stage <= 4),
    content_overage_deadline    timestamptz,
    content_overage_since       timestamptz,
    -- NO ACTION: an owner is never deleted from under the account.
    owner_user_id               uuid REFERENCES auth.users (id)
);
CREATE INDEX billing_accounts_owner_user_id_idx ON public.billing_accounts (owner_user_id);
CREATE INDEX billing_accounts_overage_clock_idx ON public.billing_accounts (content_overage_since)
    WHERE content_overage_since IS NOT NULL;

-- Admin levers: an override replaces the plan's cap outright while it is in force
-- (cap_value NULL = unlimited).
CREATE TABLE public.account_cap_overrides (
    id                 uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    billing_account_id uuid NOT NULL REFERENCES public.billing_accounts (id) ON DELETE CASCADE,
    resource           text NOT NULL
        CHECK (resource IN ('storage_gb_per_account', 'podcasts_per_account')),
    cap_value          numeric,
    reason             text NOT NULL DEFAULT 'support',
    granted_by         uuid,
    starts_at          timestamptz NOT NULL DEFAULT now(),
    ends_at            timestamptz
);
CREATE INDEX account_cap_overrides_account_idx
    ON public.account_cap_overrides (billing_account_id, resource);

-- Bought or granted storage on top of the plan.
CREATE TABLE public.storage_credit_grants (
    id                 uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    billing_account_id uuid NOT NULL REFERENCES public.billing_accounts (id) ON DELETE CASCADE,
    gb                 numeric NOT NULL CHECK (gb > 0),
    source             text NOT NULL DEFAULT 'purchase',
    granted_at         timestamptz NOT NULL DEFAULT now(),
    expires_at         timestamptz
);
CREATE INDEX storage_credit_grants_account_idx ON public.storage_credit_grants (billing_account_id);

-- ------------------------------------------------------------------------------------------
-- People
-- ------------------------------------------------------------------------------------------

CREATE TABLE public.user_profiles (
    id                 uuid NOT NULL PRIMARY KEY REFERENCES auth.users (id) ON DELETE CASCADE,
    display_name       text,
    avatar_url         text,
    billing_account_id uuid REFERENCES public.billing_accounts (id) ON DELETE SET NULL,
    email              text,
    marketing_opt_in   boolean NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX user_profiles_billing_account_id_idx ON public.user_profiles (billing_account_id);

-- Since migration 20260906200000 an unconfirmed signup owns none of these; a user that still
-- does is held by the NO ACTION foreign keys, and the reaper skips it with a WARNING.
CREATE TABLE public.crm_contacts (
    id         uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id    uuid NOT NULL REFERENCES auth.users (id),
    lifecycle  text NOT NULL DEFAULT 'lead',
    created_at timestamptz NOT NULL DEFAULT now()
);

-- ------------------------------------------------------------------------------------------
-- Podcasts and episodes
-- ------------------------------------------------------------------------------------------

-- The lifecycle state as an enum: nightcrew compares it with and sets it to string literals only.
CREATE TYPE public.podcast_status AS ENUM ('active', 'paused', 'pending_deletion');

CREATE TABLE public.podcasts (
    id                    uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    slug                  text NOT NULL,
    title                 text NOT NULL,
    description           text NOT NULL DEFAULT '',
    author_name           text,
    language              text NOT NULL DEFAULT 'en',
    explicit              boolean NOT NULL DEFAULT false,
    cover_image_url       text,
    billing_account_id    uuid REFERENCES public.billing_accounts (id) ON DELETE SET NULL,
    hosting_type          text NOT NULL DEFAULT 'podcasterplus'
        CHECK (hosting_type IN ('podcasterplus', 'external')),
    is_active             boolean NOT NULL DEFAULT true,
    status                public.podcast_status NOT NULL DEFAULT 'active',
    paused_at             timestamptz,
    pause_expires_at      timestamptz,
    last_pause_ended_at   timestamptz,
    deletion_scheduled_at timestamptz,
    deletion_redirect_url text,
    overage_suspended_at  timestamptz,
    CONSTRAINT podcasts_slug_key UNIQUE (slug),
    CONSTRAINT podcasts_pause_window CHECK (status <> 'paused' OR pause_expires_at IS NOT NULL)
);
CREATE INDEX podcasts_billing_account_id_idx ON public.podcasts (billing_account_id);
CREATE INDEX idx_podcasts_pause_expiry ON public.podcasts (pause_expires_at)
    WHERE status = 'paused';
CREATE INDEX idx_podcasts_deletion_due ON public.podcasts (deletion_scheduled_at)
    WHERE status = 'pending_deletion';

CREATE TABLE public.podcast_members (
    podcast_id uuid NOT NULL REFERENCES public.podcasts (id) ON DELETE CASCADE,
    user_id    uuid NOT NULL REFERENCES auth.users (id) ON DELETE CASCADE,
    role       text NOT NULL DEFAULT 'editor'
        CHECK (role IN ('owner', 'admin', 'editor', 'viewer')),
    invited_by uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (podcast_id, user_id)
);
CREATE INDEX podcast_members_user_id_idx ON public.podcast_members (user_id);

-- A guest's invitation link; the inviter is held by a NO ACTION foreign key.
CREATE TABLE public.guest_links (
    id         uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    podcast_id uuid NOT NULL REFERENCES public.podcasts (id) ON DELETE CASCADE,
    created_by uuid NOT NULL REFERENCES auth.users (id),
    token      text NOT NULL DEFAULT md5(random()::text),
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE public.episodes (
    id                             uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    podcast_id                     uuid NOT NULL REFERENCES public.podcasts (id) ON DELETE CASCADE,
    guid                           text NOT NULL DEFAULT gen_random_uuid()::text,
    title                          text NOT NULL DEFAULT 'Untitled episode',
    description                    text NOT NULL DEFAULT '',
    season_number                  integer,
    episode_number                 integer,
    duration_seconds               integer,
    status                         text NOT NULL DEFAULT 'draft'
        CHECK (status IN ('draft', 'scheduled', 'published', 'archived')),
    scheduled_for                  timestamptz,
    published_at                   timestamptz,
    cover_image_url                text,
    audio_mime_type                text,
    audio_url                      text,
    audio_file_size_bytes          bigint CHECK (audio_file_size_bytes >= 0),
    original_audio_url             text,
    original_audio_file_size_bytes bigint CHECK (original_audio_file_size_bytes >= 0),
    external_url                   text,
    external_link_status           text
        CHECK (external_link_status IN ('pending', 'linked', 'failed')),
    external_link_attempt          integer NOT NULL DEFAULT 0,
    external_link_next_attempt_at  timestamptz,
    external_link_last_attempt_at  timestamptz,
    external_link_error            text,
    created_at                     timestamptz NOT NULL DEFAULT now(),
    updated_at                     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT episodes_podcast_guid_key UNIQUE (podcast_id, guid)
);
CREATE INDEX episodes_podcast_id_idx ON public.episodes (podcast_id, published_at DESC);
CREATE INDEX episodes_audio_url_idx ON public.episodes (audio_url) WHERE audio_url IS NOT NULL;
CREATE INDEX episodes_original_audio_url_idx ON public.episodes (original_audio_url)
    WHERE original_audio_url IS NOT NULL;
-- sweepStalledExternalLinks.
CREATE INDEX idx_episodes_external_link_pending
    ON public.episodes (external_link_next_attempt_at)
    WHERE external_link_status = 'pending';

CREATE TABLE public.episode_transcripts (
    episode_id uuid NOT NULL PRIMARY KEY REFERENCES public.episodes (id) ON DELETE CASCADE,
    language   text NOT NULL DEFAULT 'en',
    body       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE public.automation_jobs (
    id           uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    episode_id   uuid NOT NULL REFERENCES public.episodes (id) ON DELETE CASCADE,
    kind         text NOT NULL DEFAULT 'publish',
    trigger_type text NOT NULL CHECK (trigger_type IN ('time', 'event')),
    run_at       timestamptz,
    status       text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'done', 'failed', 'canceled')),
    payload      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX automation_jobs_pending_idx ON public.automation_jobs (episode_id)
    WHERE status = 'pending';

-- Durable feed-invalidation intents. No foreign key: an intent outlives its podcast.
CREATE TABLE public.feed_invalidation_outbox (
    id           uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    podcast_id   uuid NOT NULL,
    reason       text NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz
);
CREATE INDEX idx_feed_invalidation_outbox_pending
    ON public.feed_invalidation_outbox (podcast_id, created_at)
    WHERE delivered_at IS NULL;

-- ------------------------------------------------------------------------------------------
-- Imports and hosting migrations (Epic 11)
-- ------------------------------------------------------------------------------------------

CREATE TABLE public.podcast_imports (
    id                   uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    podcast_id           uuid NOT NULL REFERENCES public.podcasts (id) ON DELETE CASCADE,
    source_feed_url      text,
    is_hosting_migration boolean NOT NULL DEFAULT false,
    status               text NOT NULL DEFAULT 'preview'
        CHECK (status IN ('preview', 'running', 'completed', 'failed', 'canceled')),
    total_items          integer NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    dispatch_end_at      timestamptz,
    completed_at         timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now()
);
-- One live hosting migration per podcast: a wedged preview row 409s every later commit.
CREATE UNIQUE INDEX idx_podcast_imports_hosting_migration_active
    ON public.podcast_imports (podcast_id)
    WHERE is_hosting_migration AND status IN ('preview', 'running');
CREATE INDEX idx_podcast_imports_running ON public.podcast_imports (id)
    WHERE status = 'running';
CREATE INDEX idx_podcast_imports_stuck_preview ON public.podcast_imports (created_at)
    WHERE is_hosting_migration AND status = 'preview' AND started_at IS NULL;

CREATE TABLE public.import_items (
    id          uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    import_id   uuid NOT NULL REFERENCES public.podcast_imports (id) ON DELETE CASCADE,
    source_guid text,
    status      text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'skipped')),
    attempts    integer NOT NULL DEFAULT 0,
    last_error  text,
    episode_id  uuid REFERENCES public.episodes (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_import_items_active ON public.import_items (import_id, status, updated_at)
    WHERE status IN ('pending', 'processing');

-- ------------------------------------------------------------------------------------------
-- Media plane
-- ------------------------------------------------------------------------------------------

CREATE TABLE public.media_jobs (
    id                   uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
    episode_id           uuid NOT NULL REFERENCES public.episodes (id) ON DELETE CASCADE,
    type                 text NOT NULL CHECK (type IN ('normalize', 'transcribe', 'waveform')),
    status               text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    workflow_instance_id text,
    error                text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
-- One active job per episode and type.
CREATE UNIQUE INDEX idx_media_jobs_one_active ON public.media_jobs (episode_id, type)
    WHERE status IN ('pending', 'running');
CREATE INDEX idx_media_jobs_active_updated ON public.media_jobs (updated_at)
    WHERE status IN ('pending', 'running');

-- ------------------------------------------------------------------------------------------
-- Row-level security, as on any Supabase table a browser can reach (the owner role that
-- nightcrew and these tests use is not subject to it).
-- ------------------------------------------------------------------------------------------

ALTER TABLE public.billing_accounts ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.user_profiles ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.podcasts ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.podcast_members ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.episodes ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.media_jobs ENABLE ROW LEVEL SECURITY;

-- ------------------------------------------------------------------------------------------
-- Platform functions (spec 000's signatures, exactly)
-- ------------------------------------------------------------------------------------------

-- The live cap of one account for one resource; NULL = unlimited. An override in force wins
-- outright (its NULL is unlimited); otherwise the plan's cap (NULL = unlimited), plus — for
-- storage — every unexpired credit grant. Storage is in GB (10^9 bytes).
CREATE FUNCTION public.effective_cap(account uuid, resource text) RETURNS numeric
LANGUAGE plpgsql STABLE
SET search_path = ''
AS $fn$
DECLARE
    v_override  public.account_cap_overrides%ROWTYPE;
    v_slots     integer;
    v_gb        numeric;
    v_credit_gb numeric;
BEGIN
    IF effective_cap.resource NOT IN ('storage_gb_per_account', 'podcasts_per_account') THEN
        RAISE EXCEPTION 'effective_cap: unknown resource "%"', effective_cap.resource
              USING ERRCODE = '22023';
    END IF;

    SELECT o.* INTO v_override
      FROM public.account_cap_overrides o
     WHERE o.billing_account_id = effective_cap.account
       AND o.resource = effective_cap.resource
       AND o.starts_at <= now()
       AND (o.ends_at IS NULL OR o.ends_at > now())
     ORDER BY o.starts_at DESC
     LIMIT 1;
    IF FOUND THEN
        RETURN v_override.cap_value;
    END IF;

    SELECT p.podcast_slots, p.storage_gb INTO v_slots, v_gb
      FROM public.billing_accounts b
      JOIN public.plans p ON p.id = b.plan_id
     WHERE b.id = effective_cap.account;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    IF effective_cap.resource = 'podcasts_per_account' THEN
        RETURN v_slots::numeric;
    END IF;
    IF v_gb IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(sum(g.gb), 0) INTO v_credit_gb
      FROM public.storage_credit_grants g
     WHERE g.billing_account_id = effective_cap.account
       AND g.granted_at <= now()
       AND (g.expires_at IS NULL OR g.expires_at > now());
    RETURN v_gb + v_credit_gb;
END
$fn$;

-- De-provision and delete every unconfirmed, non-invited user created before now() - retention.
-- One subtransaction per user: a row still held by a NO ACTION foreign key is skipped with a
-- WARNING and counted, and never fails the batch.
CREATE FUNCTION public.reap_unconfirmed_users(
    retention interval, OUT deleted integer, OUT skipped integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = ''
AS $fn$
DECLARE
    v_cutoff   timestamptz := now() - retention;
    v_user_id  uuid;
    v_deleted  integer := 0;
    v_skipped  integer := 0;
BEGIN
    IF retention IS NULL OR retention < interval '0' THEN
        RAISE EXCEPTION 'reap_unconfirmed_users: retention must be a non-negative interval'
              USING ERRCODE = '22023';
    END IF;
    FOR v_user_id IN
        SELECT u.id
          FROM auth.users u
         WHERE u.email_confirmed_at IS NULL
           AND u.invited_at IS NULL
           AND u.created_at < v_cutoff
         ORDER BY u.created_at, u.id
    LOOP
        BEGIN
            -- de-provision what a signup may have been given, then the identity itself
            DELETE FROM public.user_profiles p
             WHERE p.id = v_user_id AND p.billing_account_id IS NULL;
            DELETE FROM auth.users u WHERE u.id = v_user_id;
            v_deleted := v_deleted + 1;
        EXCEPTION WHEN foreign_key_violation THEN
            RAISE WARNING 'reap_unconfirmed_users: skipped user %: %', v_user_id, SQLERRM;
            v_skipped := v_skipped + 1;
        END;
    END LOOP;
    deleted := v_deleted;
    skipped := v_skipped;
END
$fn$;

-- Wake whoever waits on a media job (the workflow, the editor UI) with its result.
CREATE FUNCTION public.notify_media_job_result(job_id uuid) RETURNS void
LANGUAGE plpgsql
SET search_path = ''
AS $fn$
DECLARE
    v_payload jsonb;
BEGIN
    SELECT jsonb_build_object('id', j.id, 'episode_id', j.episode_id, 'type', j.type,
                              'status', j.status, 'error', j.error, 'at', now())
      INTO v_payload
      FROM public.media_jobs j
     WHERE j.id = notify_media_job_result.job_id;
    IF v_payload IS NOT NULL THEN
        PERFORM pg_notify('media_jobs:' || (v_payload ->> 'episode_id'), v_payload::text);
    END IF;
END
$fn$;

-- ------------------------------------------------------------------------------------------
-- Triggers
-- ------------------------------------------------------------------------------------------

CREATE FUNCTION public.set_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$fn$;

CREATE TRIGGER set_podcasts_updated_at BEFORE UPDATE ON public.podcasts
    FOR EACH ROW EXECUTE FUNCTION public.set_updated_at();
CREATE TRIGGER set_episodes_updated_at BEFORE UPDATE ON public.episodes
    FOR EACH ROW EXECUTE FUNCTION public.set_updated_at();
CREATE TRIGGER set_billing_accounts_updated_at BEFORE UPDATE ON public.billing_accounts
    FOR EACH ROW EXECUTE FUNCTION public.set_updated_at();

-- The touch trigger: an episode change is a change of its podcast's feed.
CREATE FUNCTION public.touch_parent_podcast() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE public.podcasts SET updated_at = now() WHERE id = OLD.podcast_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE')
       AND (TG_OP = 'INSERT' OR NEW.podcast_id IS DISTINCT FROM OLD.podcast_id) THEN
        UPDATE public.podcasts SET updated_at = now() WHERE id = NEW.podcast_id;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER episodes_touch_podcast AFTER INSERT OR UPDATE OR DELETE ON public.episodes
    FOR EACH ROW EXECUTE FUNCTION public.touch_parent_podcast();

-- The storage cap (media plane §6.4, count-both): an episode write that grows the account's
-- audio_file_size_bytes + original_audio_file_size_bytes, over every podcast of the account,
-- past effective_cap(account, 'storage_gb_per_account') raises 23514. A write that shrinks or
-- keeps the bytes always passes.
CREATE FUNCTION public.enforce_account_storage_cap() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_account  uuid;
    v_cap_gb   numeric;
    v_row_new  numeric := coalesce(NEW.audio_file_size_bytes, 0)
                          + coalesce(NEW.original_audio_file_size_bytes, 0);
    v_row_old  numeric := 0;
    v_elsewhere numeric;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.podcast_id = OLD.podcast_id THEN
        v_row_old := coalesce(OLD.audio_file_size_bytes, 0)
                     + coalesce(OLD.original_audio_file_size_bytes, 0);
    END IF;
    IF v_row_new <= v_row_old THEN
        RETURN NEW;
    END IF;

    SELECT p.billing_account_id INTO v_account FROM public.podcasts p WHERE p.id = NEW.podcast_id;
    IF v_account IS NULL THEN
        RETURN NEW;
    END IF;
    v_cap_gb := public.effective_cap(v_account, 'storage_gb_per_account');
    IF v_cap_gb IS NULL THEN
        RETURN NEW;
    END IF;

    SELECT coalesce(sum(coalesce(e.audio_file_size_bytes, 0)
                        + coalesce(e.original_audio_file_size_bytes, 0)), 0)
      INTO v_elsewhere
      FROM public.episodes e
     WHERE e.podcast_id IN (SELECT p.id FROM public.podcasts p
                             WHERE p.billing_account_id = v_account)
       AND e.id <> NEW.id;

    IF v_elsewhere + v_row_new > v_cap_gb * 1000000000 THEN
        RAISE EXCEPTION 'Storage limit reached: this account may store % GB', v_cap_gb
              USING ERRCODE = '23514',
                    DETAIL = format('account %s would hold %s bytes', v_account,
                                    v_elsewhere + v_row_new);
    END IF;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER trigger_enforce_storage_account_cap
    BEFORE INSERT OR UPDATE ON public.episodes
    FOR EACH ROW EXECUTE FUNCTION public.enforce_account_storage_cap();

-- Platform-owned columns: a browser session (a user JWT: auth.uid() is not NULL) may not write
-- the overage suspension stamp or an episode's audio columns. The service role may.
CREATE FUNCTION public.protect_podcast_platform_columns() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF auth.uid() IS NOT NULL
       AND ((TG_OP = 'INSERT' AND NEW.overage_suspended_at IS NOT NULL)
            OR (TG_OP = 'UPDATE'
                AND NEW.overage_suspended_at IS DISTINCT FROM OLD.overage_suspended_at)) THEN
        RAISE EXCEPTION 'overage_suspended_at is managed by the platform'
              USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$fn$;

CREATE FUNCTION public.protect_episode_audio_columns() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF auth.uid() IS NULL THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF num_nonnulls(NEW.audio_url, NEW.audio_file_size_bytes, NEW.original_audio_url,
                        NEW.original_audio_file_size_bytes) > 0 THEN
            RAISE EXCEPTION 'episode audio is set by the upload service' USING ERRCODE = '42501';
        END IF;
    ELSIF (NEW.audio_url, NEW.audio_file_size_bytes, NEW.original_audio_url,
           NEW.original_audio_file_size_bytes)
          IS DISTINCT FROM (OLD.audio_url, OLD.audio_file_size_bytes, OLD.original_audio_url,
                            OLD.original_audio_file_size_bytes) THEN
        RAISE EXCEPTION 'episode audio is set by the upload service' USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER protect_podcast_platform_columns
    BEFORE INSERT OR UPDATE ON public.podcasts
    FOR EACH ROW EXECUTE FUNCTION public.protect_podcast_platform_columns();
CREATE TRIGGER protect_episode_audio_columns
    BEFORE INSERT OR UPDATE ON public.episodes
    FOR EACH ROW EXECUTE FUNCTION public.protect_episode_audio_columns();
