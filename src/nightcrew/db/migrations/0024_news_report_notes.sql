-- nightcrew:scope nightcrew
--
-- One report for both engines (issue 23). A pipeline pass reports the stage workers' results
-- for its shard since the previous report, from PostgreSQL. Most are rows already there
-- (articles, reviews, rejected candidates, sources' last errors); what leaves no row is noted
-- here by the worker that saw it, and forgotten once a pass has reported it:
-- * `dropped_items`: items a fetch dropped (source name, reason, count) — droppedItems;
-- * `translated`: summaries translated from the translation backlog — translatedCount;
-- * `fetch_locked`: a fetch put off because another worker holds its source's lease —
--   lockedCount (a pass takes no shard lock: this is the pipeline's lock skip);
-- * `redis_failed` (shard NULL: a worker serves every shard) — redisEnabled: false.
--
-- reviews.translated_late: the translation was made after the review was written (the
-- backlog), so the reviews of a window count only the translations made with them, and the
-- backlog's are counted once, from its notes. Set by a trigger, whoever fills the translation.

CREATE TABLE news.report_notes (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    shard  text,
    kind   text NOT NULL
           CHECK (kind IN ('dropped_items', 'translated', 'fetch_locked', 'redis_failed')),
    source text,
    reason text,
    n      integer NOT NULL DEFAULT 1 CHECK (n >= 0),
    at     timestamptz NOT NULL
);
CREATE INDEX idx_news_report_notes_shard_at ON news.report_notes (shard, at);

ALTER TABLE news.reviews ADD COLUMN translated_late boolean NOT NULL DEFAULT false;

CREATE FUNCTION news.mark_translated_late() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.translated_late := true;
    RETURN NEW;
END
$$;

CREATE TRIGGER reviews_translated_late
    BEFORE UPDATE OF translation ON news.reviews
    FOR EACH ROW WHEN (OLD.translation IS NULL AND NEW.translation IS NOT NULL)
    EXECUTE FUNCTION news.mark_translated_late();
