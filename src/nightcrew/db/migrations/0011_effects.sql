-- nightcrew:scope nightcrew
--
-- The effects outbox: every effect that leaves the database (a queue message, an email, a
-- Stripe billing resume, a feed-cache invalidation) is first a row here, written in the same
-- transaction as the state change that owes it. The first attempt follows the commit at once;
-- the minute lane's deliverEffects retries what failed, with backoff, until it is confirmed
-- (delivered_at) or given up (dead_at). A claimed row's next_attempt_at is pushed past the
-- delivery's time limit, which is what keeps one effect to one delivery in flight.

CREATE TABLE nightcrew.effects (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            text NOT NULL
        CHECK (kind IN ('queue', 'mail', 'billing_resume', 'feed_invalidate')),
    key             text NOT NULL,
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    last_attempt_at timestamptz,
    claimed_until   timestamptz,  -- while an attempt is in flight
    last_error      text,
    delivered_at    timestamptz,
    dead_at         timestamptz,
    -- why it was given up: 'permanent' (retrying cannot help), 'expired' (not confirmed within
    -- its maximum age), 'superseded' (a later state change made it wrong to deliver)
    dead_reason     text CHECK (dead_reason IN ('permanent', 'expired', 'superseded')),
    CONSTRAINT effects_one_per_key UNIQUE (kind, key)
);
-- The drain's claim: an index scan over what is due, however many delivered rows there are.
CREATE INDEX idx_effects_due ON nightcrew.effects (next_attempt_at, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL;
-- A queue-like table: a backlog goes from due to delivered in bulk. Analyze and vacuum after 1 %
-- of it changed (not the default 10 % / 20 %), so the planner learns within minutes that a
-- drained backlog is gone and the idle sweep stays an index lookup (bench.effects).
ALTER TABLE nightcrew.effects
    SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.01);
-- Pending and dead counts per kind (metrics, `effects list --dead`).
CREATE INDEX idx_effects_undelivered ON nightcrew.effects (kind, id) WHERE delivered_at IS NULL;
-- Retention of delivered rows.
CREATE INDEX idx_effects_delivered ON nightcrew.effects (delivered_at)
    WHERE delivered_at IS NOT NULL;

-- A hard deletion's feed invalidation is an effect; the record says which one.
ALTER TABLE nightcrew.podcast_deletions ADD COLUMN invalidation_effect_id bigint;

-- Object keys from public URLs, in one place (reconciler joins and re-checks, db check).
-- The key is the URL without R2_PUBLIC_URL + '/', cut at the first '?' or '#', with the path
-- percent-decoded exactly once ("my%20file.mp3" → "my file.mp3"; '+' stays '+'). NULL when the
-- URL is not under the prefix, or when it is but no key can be derived (an empty path, a
-- malformed escape, bytes that are not UTF-8, a NUL): callers treat such a URL as protecting
-- its podcast's objects, never as exposing them.
CREATE FUNCTION nightcrew.percent_decode(path text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    WITH hex AS (
        SELECT string_agg(
                   CASE WHEN left(m[1], 1) = '%' THEN lower(substr(m[1], 2))
                        ELSE encode(convert_to(m[1], 'UTF8'), 'hex') END,
                   '' ORDER BY n) AS h
          FROM regexp_matches(path, '(%[0-9A-Fa-f]{2}|[^%]+)', 'g') WITH ORDINALITY AS t (m, n)
    )
    SELECT CASE
        WHEN path ~ '%(?![0-9A-Fa-f]{2})' THEN NULL
        -- well-formed UTF-8 without NUL, pair by pair (RFC 3629 table 4)
        WHEN h !~ ('^(0[1-9a-f]|[1-7][0-9a-f]'
                   '|(c[2-9a-f]|d[0-9a-f])[89ab][0-9a-f]'
                   '|e0[ab][0-9a-f][89ab][0-9a-f]'
                   '|(e[1-9abcef])[89ab][0-9a-f][89ab][0-9a-f]'
                   '|ed[89][0-9a-f][89ab][0-9a-f]'
                   '|f0[9ab][0-9a-f][89ab][0-9a-f][89ab][0-9a-f]'
                   '|f[123][89ab][0-9a-f][89ab][0-9a-f][89ab][0-9a-f]'
                   '|f48[0-9a-f][89ab][0-9a-f][89ab][0-9a-f])*$') THEN NULL
        ELSE convert_from(decode(h, 'hex'), 'UTF8')
    END
      FROM hex
$$;

-- A plain SQL expression, so the planner inlines it: the common case (no '%') costs a few
-- string operations per row, not a function call.
CREATE FUNCTION nightcrew.key_path(path text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN path = '' THEN NULL
                WHEN strpos(path, '%') = 0 THEN path
                ELSE nightcrew.percent_decode(path) END
$$;

CREATE FUNCTION nightcrew.object_key(url text, prefix text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN left(url, length(prefix)) = prefix
                THEN nightcrew.key_path(split_part(split_part(substr(url, length(prefix) + 1),
                                                              '#', 1), '?', 1)) END
$$;
