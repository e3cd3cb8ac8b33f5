-- nightcrew:scope nightcrew
--
-- The dashboard's reads (issue 15): every page is one keyset-paginated index scan, however long
-- the history (bench.dashboard: 1M runs, 100k deletions). Btree indexes scan backwards as well,
-- so "newest first" needs no DESC; the trailing id is the keyset's tie-break.

DROP INDEX IF EXISTS nightcrew.idx_runs_lane_started;
CREATE INDEX idx_runs_lane_started ON nightcrew.runs (lane, started_at, id);
CREATE INDEX idx_runs_started ON nightcrew.runs (started_at, id);
CREATE INDEX idx_runs_status_started ON nightcrew.runs (status, started_at, id);
CREATE INDEX idx_runs_lane_status_started ON nightcrew.runs (lane, status, started_at, id);
-- "skipped" is a completed run whose report says so (a shard another worker held).
CREATE INDEX idx_runs_skipped ON nightcrew.runs (started_at, id)
    WHERE (report ->> 'skipped') = 'true';

CREATE INDEX idx_podcast_deletions_deleted ON nightcrew.podcast_deletions (deleted_at, podcast_id);

CREATE INDEX idx_effects_dead ON nightcrew.effects (dead_at, id) WHERE dead_at IS NOT NULL;
CREATE INDEX idx_effects_failing ON nightcrew.effects (last_attempt_at, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL AND last_error IS NOT NULL;

CREATE INDEX idx_news_sources_parked ON news.sources (parked_at, id) WHERE parked_at IS NOT NULL;

-- A count from a stored report: a number (whatever its JSON spelling, 3 or 3.0) or 0 — never an
-- error, so one odd report cannot take a page of a million down with it.
CREATE FUNCTION nightcrew.report_number(report jsonb, key text) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(report -> key) = 'number' THEN (report ->> key)::numeric
                ELSE 0 END
$$;
