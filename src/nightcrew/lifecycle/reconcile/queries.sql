-- The storage reconciler. The store is listed once into a session temp table (COPY), then
-- every job is a join against it: no HEAD per episode.
-- `prefix` is R2_PUBLIC_URL + '/'. An episode's key is nightcrew.object_key(url, prefix): the
-- URL without the prefix and any ?query or #fragment, percent-decoded once; NULL when no key
-- can be derived from a URL under the prefix — and such a URL protects every object of its
-- podcast from the orphan sweeps, since we cannot tell which one it means.
-- The episodes' side of the audio joins (every audio URL's key) needs no listing: it is
-- derived once into reconcile_refs while the store is still being listed, and the size
-- backfill, the missing check and the audio sweep join that instead of each decoding every
-- URL again (100k episodes: 1.6-2.0 s of joins after the listing became 0.2 s, plus 0.8 s
-- overlapped with it). Its snapshot is older than the listing; nothing relies on it being
-- current: a size write and a quarantine re-check the row, a delete re-checks references.

-- name: create_refs
CREATE TEMP TABLE reconcile_refs ON COMMIT PRESERVE ROWS AS
SELECT e.id, e.podcast_id, e.status, e.audio_url, e.audio_file_size_bytes AS recorded,
       u.enclosure, nightcrew.object_key(u.url, %(prefix)s) AS key,
       substr(u.url, length(%(prefix)s) + 1) AS raw
  FROM public.episodes e
 CROSS JOIN LATERAL (VALUES (true, e.audio_url), (false, e.original_audio_url))
       AS u (enclosure, url)
 WHERE left(u.url, length(%(prefix)s)) = %(prefix)s;

-- name: index_refs
CREATE INDEX ON reconcile_refs (key);

-- name: analyze_refs
ANALYZE reconcile_refs;

-- name: drop_refs
DROP TABLE IF EXISTS reconcile_refs;

-- name: create_listing
CREATE TEMP TABLE reconcile_objects (
    key           text NOT NULL,
    kind          text NOT NULL,
    size          bigint NOT NULL,
    last_modified timestamptz NOT NULL
) ON COMMIT PRESERVE ROWS;

-- name: copy_listing
COPY reconcile_objects (key, kind, size, last_modified) FROM STDIN;

-- name: index_listing
CREATE INDEX ON reconcile_objects (key);

-- name: analyze_listing
ANALYZE reconcile_objects;

-- name: drop_listing
DROP TABLE IF EXISTS reconcile_objects;

-- name: create_unlisted
-- The enclosures' keys the listing of podcasts/ cannot cover (a legacy key outside it), with
-- how many enclosures name each: derived while the store is listed, in one scan with the count
-- of every other keyed enclosure (the one row whose key is NULL). Each is HEADed after the
-- listing, and its object, when present, joins the listing as kind 'headed', which no sweep
-- selects. A flat podcasts/{p}/e/{file} key is listed (kind 'other'), so it needs no HEAD.
CREATE TEMP TABLE reconcile_unlisted ON COMMIT PRESERVE ROWS AS
SELECT CASE WHEN left(key, 9) = 'podcasts/' THEN NULL ELSE key END AS key,
       count(*) AS episodes
  FROM reconcile_refs
 WHERE enclosure
   AND key IS NOT NULL
 GROUP BY 1;

-- name: drop_unlisted
DROP TABLE IF EXISTS reconcile_unlisted;

-- name: keyed_enclosures
SELECT coalesce(sum(episodes), 0)::bigint AS keyed FROM reconcile_unlisted;

-- name: unlisted_keys
-- A page at a time after the last key (keyset): no cursor stays open while the page's objects
-- are added to the listing on the same session.
SELECT key, episodes
  FROM reconcile_unlisted
 WHERE key IS NOT NULL
   AND key > %(after)s
 ORDER BY key
 LIMIT %(limit)s;

-- name: add_headed
INSERT INTO reconcile_objects (key, kind, size, last_modified)
SELECT key, 'headed', size, last_modified
  FROM unnest(%(keys)s::text[], %(sizes)s::bigint[], %(modified)s::timestamptz[])
       AS t (key, size, last_modified);

-- name: not_under_public_url
-- Episodes whose audio_url is not under R2_PUBLIC_URL: no key can be derived, so no size is
-- measured; counted and sampled for the report, never guessed at.
SELECT count(*) OVER () AS total, id, audio_url
  FROM public.episodes
 WHERE audio_url IS NOT NULL
   AND left(audio_url, length(%(prefix)s)) <> %(prefix)s
 ORDER BY id
 LIMIT %(sample)s;

-- name: size_candidates
-- Episodes whose object exists but whose recorded size is NULL or differs: whatever the key's
-- layout (podcasts/{p}/e/{e}/{file}, a flat podcasts/{p}/e/{file}, or a legacy key HEADed
-- into the listing), the object the enclosure names is what its size measures.
SELECT r.id, r.podcast_id, r.audio_url, r.recorded, o.size AS actual, o.key
  FROM reconcile_refs r
  JOIN reconcile_objects o ON o.key = r.key
 WHERE r.enclosure
   AND r.recorded IS DISTINCT FROM o.size
 ORDER BY r.id;

-- name: missing_candidates
-- Episodes whose URL is ours but whose object is not in the listing (HEAD-confirmed later:
-- it may have been uploaded after the listing passed its key).
-- A URL whose key cannot be derived is not a candidate: it cannot be HEAD-checked, and
-- quarantining on a guess would unpublish an episode that may be fine.
SELECT r.id, r.status, r.audio_url, r.key
  FROM reconcile_refs r
 WHERE r.enclosure
   AND r.key IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM reconcile_objects o WHERE o.key = r.key)
 ORDER BY r.id;

-- name: unreferenced_audio
-- Audio objects that neither audio_url nor original_audio_url references, with whether their
-- podcast still has an undelivered feed invalidation (a cached feed may still point at them).
-- A reference is by KEY, derived exactly as for the backfill: ".../a.mp3?v=2" and
-- ".../my%%20a.mp3" reference "a.mp3" and "my a.mp3". A podcast with an episode URL under the
-- prefix whose key cannot be derived keeps all its audio (`unknown`).
WITH unknown AS (
    -- the episode's podcast, and the podcast folder the URL itself names
    SELECT podcast_id::text AS podcast_id FROM reconcile_refs WHERE key IS NULL
    UNION
    SELECT split_part(raw, '/', 2) FROM reconcile_refs WHERE key IS NULL
)
SELECT o.key, o.size, o.last_modified,
       EXISTS (SELECT 1 FROM public.feed_invalidation_outbox f
                WHERE f.delivered_at IS NULL
                  AND f.podcast_id::text = split_part(o.key, '/', 2)) AS invalidation_pending
  FROM reconcile_objects o
 WHERE o.kind = 'audio'
   AND NOT EXISTS (SELECT 1 FROM reconcile_refs r WHERE r.key = o.key)
   AND NOT EXISTS (SELECT 1 FROM unknown u WHERE u.podcast_id = split_part(o.key, '/', 2))
 ORDER BY o.key;

-- name: unreferenced_episode_images
-- unreferenced_audio's rule over cover_image_url, without the invalidation guard. Kept a query
-- of its own, its references derived here: one query for both kinds (a LATERAL VALUES of the three URL columns filtered by a kind
-- parameter) took this join from 11 to 260 ms at 100k episodes (EXPLAIN ANALYZE,
-- bench/reconcile_plans.py): every episode then makes three rows to filter, not one test.
WITH refs AS (
    SELECT e.podcast_id, nightcrew.object_key(e.cover_image_url, %(prefix)s) AS key,
           substr(e.cover_image_url, length(%(prefix)s) + 1) AS raw
      FROM public.episodes e
     WHERE left(e.cover_image_url, length(%(prefix)s)) = %(prefix)s
), referenced AS (
    SELECT key FROM refs WHERE key IS NOT NULL
), unknown AS (
    SELECT podcast_id::text AS podcast_id FROM refs WHERE key IS NULL
    UNION
    SELECT split_part(raw, '/', 2) FROM refs WHERE key IS NULL
)
SELECT o.key, o.size, o.last_modified, false AS invalidation_pending
  FROM reconcile_objects o
 WHERE o.kind = 'episode_image'
   AND NOT EXISTS (SELECT 1 FROM referenced r WHERE r.key = o.key)
   AND NOT EXISTS (SELECT 1 FROM unknown u WHERE u.podcast_id = split_part(o.key, '/', 2))
 ORDER BY o.key;

-- name: expired_prep
SELECT o.key, o.size, o.last_modified, false AS invalidation_pending
  FROM reconcile_objects o
 WHERE o.kind = 'prep'
   AND o.last_modified < %(now)s - make_interval(days => %(ttl_days)s)
 ORDER BY o.key;

-- name: recheck_audio_references
-- The final re-check, immediately before a delete batch: which of these keys must stay?
-- Referenced now by either audio column (exact URL, or the same key however the URL spells it:
-- each URL of the batch's podcasts is decoded once, through the podcast index), or its podcast
-- has an episode URL whose key cannot be derived, or an undelivered invalidation.
-- Only a URL with '%%', '?' or '#' after the prefix, or nothing after it, can have a key other
-- than its plain remainder; every other URL is the exact match's (the first EXISTS), so refs
-- decodes just those few instead of every URL of the batch's podcasts (at a million episodes
-- that was most of an apply run).
WITH k AS (
    SELECT key, CASE WHEN split_part(key, '/', 2) ~ %(uuid_re)s
                     THEN split_part(key, '/', 2)::uuid END AS podcast_id
      FROM unnest(%(keys)s::text[]) AS t (key)
), refs AS MATERIALIZED (
    SELECT e.podcast_id, nightcrew.object_key(u.url, %(prefix)s) AS key
      FROM public.episodes e
     CROSS JOIN LATERAL (VALUES (e.audio_url), (e.original_audio_url)) AS u (url)
     WHERE e.podcast_id IN (SELECT DISTINCT podcast_id FROM k WHERE podcast_id IS NOT NULL)
       AND left(u.url, length(%(prefix)s)) = %(prefix)s
       AND (u.url = %(prefix)s OR strpos(u.url, '%%') > 0 OR strpos(u.url, '?') > 0
            OR strpos(u.url, '#') > 0)
)
SELECT k.key
  FROM k
 WHERE EXISTS (SELECT 1 FROM public.episodes e
                WHERE e.audio_url = %(prefix)s || k.key
                   OR e.original_audio_url = %(prefix)s || k.key)
    OR EXISTS (SELECT 1 FROM refs r
                WHERE r.podcast_id = k.podcast_id AND (r.key IS NULL OR r.key = k.key))
    OR EXISTS (SELECT 1 FROM public.feed_invalidation_outbox f
                WHERE f.delivered_at IS NULL
                  AND f.podcast_id::text = split_part(k.key, '/', 2));

-- name: recheck_image_references
WITH k AS (
    SELECT key, CASE WHEN split_part(key, '/', 2) ~ %(uuid_re)s
                     THEN split_part(key, '/', 2)::uuid END AS podcast_id
      FROM unnest(%(keys)s::text[]) AS t (key)
), refs AS MATERIALIZED (
    SELECT e.podcast_id, nightcrew.object_key(e.cover_image_url, %(prefix)s) AS key
      FROM public.episodes e
     WHERE e.podcast_id IN (SELECT DISTINCT podcast_id FROM k WHERE podcast_id IS NOT NULL)
       AND left(e.cover_image_url, length(%(prefix)s)) = %(prefix)s
)
SELECT k.key
  FROM k
 WHERE EXISTS (SELECT 1 FROM public.episodes e WHERE e.cover_image_url = %(prefix)s || k.key)
    OR EXISTS (SELECT 1 FROM refs r
                WHERE r.podcast_id = k.podcast_id AND (r.key IS NULL OR r.key = k.key));

-- name: write_sizes
-- A batch of measured sizes in one statement (arrays of equal length, one element per row),
-- each written only if the row still has what the scan saw: a concurrent upload wins.
-- The cap trigger is a row trigger, and a VOLATILE function's queries see the rows this
-- statement already changed, so a batch cannot grow an account past its cap between them: the
-- statement fails with 23514 as a whole and the caller splits it (size backfill, engine.py).
-- unnest() arrays rather than a VALUES list or a COPY into a temp table: the three measured
-- alike (10,000 rows in batches of 500: 1.3-1.6 s each, within the noise, against 26 s one
-- transaction per row; bench/reconcile_writes.py), and this one is a single statement of fixed
-- text, one round trip, with no text built per batch and no temp table per transaction.
UPDATE public.episodes e
   SET audio_file_size_bytes = v.actual, updated_at = %(now)s
  FROM unnest(%(ids)s::uuid[], %(audio_urls)s::text[], %(recorded)s::bigint[],
              %(actual)s::bigint[]) AS v (id, audio_url, recorded, actual)
 WHERE e.id = v.id
   AND e.audio_url = v.audio_url
   AND e.audio_file_size_bytes IS NOT DISTINCT FROM v.recorded
RETURNING e.podcast_id, e.status;

-- name: savepoint_batch
SAVEPOINT size_batch;

-- name: rollback_batch
-- The refused statement's changes go; the batch's earlier, accepted ones stay.
ROLLBACK TO SAVEPOINT size_batch;

-- name: release_batch
RELEASE SAVEPOINT size_batch;

-- name: disable_cap_trigger
ALTER TABLE public.episodes DISABLE TRIGGER trigger_enforce_storage_account_cap;

-- name: enable_cap_trigger
ALTER TABLE public.episodes ENABLE TRIGGER trigger_enforce_storage_account_cap;

-- name: lock_episode
SELECT podcast_id, status, audio_url FROM public.episodes WHERE id = %(id)s FOR UPDATE;

-- name: quarantine_episode
UPDATE public.episodes
   SET audio_url = NULL,
       audio_file_size_bytes = NULL,
       status = CASE WHEN status IN ('published', 'scheduled') THEN 'draft' ELSE status END,
       published_at = CASE WHEN status IN ('published', 'scheduled') THEN NULL
                           ELSE published_at END,
       scheduled_for = CASE WHEN status IN ('published', 'scheduled') THEN NULL
                            ELSE scheduled_for END,
       updated_at = %(now)s
 WHERE id = %(id)s;

-- name: cancel_time_automation
-- Only for an episode that was published or scheduled (its automation is what would publish
-- or re-publish it); a draft's or an archived episode's automation is the owner's to keep.
UPDATE public.automation_jobs
   SET status = 'canceled', updated_at = %(now)s
 WHERE episode_id = %(id)s AND status = 'pending' AND trigger_type = 'time';

-- name: over_cap_accounts
-- The over-cap report's byte rule, nightcrew.overcap_report_bytes() (count-both: enclosure +
-- master, every podcast of the account, as the storage cap trigger counts; migration 0021)
-- against the platform's live effective_cap(account, 'storage_gb_per_account'). Report only.
WITH usage AS MATERIALIZED (
    SELECT u.account_id, u.bytes,
           public.effective_cap(u.account_id, 'storage_gb_per_account') AS cap_gb
      FROM nightcrew.overcap_report_bytes() u
     WHERE u.bytes > 0
)
SELECT account_id, bytes, cap_gb
  FROM usage
 WHERE cap_gb IS NOT NULL AND bytes > cap_gb * 1000000000
 ORDER BY bytes - cap_gb * 1000000000 DESC;
