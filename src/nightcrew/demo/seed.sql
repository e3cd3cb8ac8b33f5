-- The demo's sample podcast platform, a row at a time (seed.py says which rows, and why).
-- Every column the demo sets is named here; the rest keep the reference schema's defaults.

-- name: user
INSERT INTO auth.users (email, created_at, email_confirmed_at, invited_at)
VALUES (%(email)s, %(created_at)s, %(email_confirmed_at)s, %(invited_at)s)
RETURNING id;

-- name: plan_limit
INSERT INTO public.plan_limits (plan, resource, limit_value)
VALUES (%(plan)s, %(resource)s, %(limit_value)s);

-- name: account
INSERT INTO public.billing_accounts (owner_user_id, billing_model, plan, stripe_customer_id)
VALUES (%(owner)s, %(billing_model)s, %(plan)s, %(stripe_customer_id)s)
RETURNING id;

-- name: profile
INSERT INTO public.user_profiles (id, email, billing_account_id)
VALUES (%(user_id)s, %(email)s, %(account)s);

-- name: podcast
INSERT INTO public.podcasts (slug, title, billing_account_id, status, hosting_type, paused_at,
                             pause_expires_at, deletion_scheduled_at, deletion_redirect_url)
VALUES (%(slug)s, %(title)s, %(account)s, %(status)s, %(hosting_type)s, %(paused_at)s,
        %(pause_expires_at)s, %(deletion_scheduled_at)s, %(deletion_redirect_url)s)
RETURNING id;

-- name: owner
INSERT INTO public.podcast_members (podcast_id, user_id, role)
VALUES (%(podcast)s, %(user_id)s, 'owner');

-- name: episode
INSERT INTO public.episodes (podcast_id, title, status, published_at, external_link_status,
                             external_link_attempt, external_link_next_attempt_at)
VALUES (%(podcast)s, %(title)s, 'published', %(published_at)s, %(external_link_status)s,
        %(external_link_attempt)s, %(external_link_next_attempt_at)s)
RETURNING id;

-- name: enclosure
-- The episode's audio; its recorded size is left for the reconciler to measure.
UPDATE public.episodes SET audio_url = %(audio_url)s WHERE id = %(episode)s;

-- name: podcast_import
INSERT INTO public.podcast_imports (podcast_id, status, is_hosting_migration, started_at,
                                    dispatch_end_at, created_at)
VALUES (%(podcast)s, %(status)s, %(migration)s, %(started_at)s, %(started_at)s, %(created_at)s)
RETURNING id;

-- name: import_item
INSERT INTO public.import_items (import_id, status, attempts, created_at, updated_at)
VALUES (%(import_id)s, %(status)s, %(attempts)s, %(at)s, %(at)s);

-- name: media_job
INSERT INTO public.media_jobs (episode_id, type, status, created_at, updated_at)
VALUES (%(episode)s, %(type)s, 'running', %(at)s, %(at)s)
RETURNING id;
