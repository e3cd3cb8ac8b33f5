-- nightcrew:scope nightcrew
--
-- The pipeline's pass admits work as the inline run does: spec 001's queue limit gates the
-- shard's whole queue, not each stage.
--
-- candidates.admitted_at: when a run or pass admitted the candidate into the expensive steps
-- (NULL: it waits for one). A pass admits at most the queue limit less what it admitted
-- before that is still in flight (queued, or held for a backoff or a lease held elsewhere),
-- oldest first, and within MAX_AI_REVIEWS; once admitted a candidate goes through every
-- stage without asking again, and a worker's housekeeping re-sends only admitted candidates
-- whose backoff has passed. A review the model failed for now goes back to waiting (NULL), so
-- its retry is admitted, and counted against the cost bound, by a later pass — as inline.
--
-- The per-stage admission's review budget window (news.review_budgets, budget_held_at) and
-- the fetch stage's watermark go: the pass's admission is the cost bound, and a fetch decides
-- what is new by the processed-URL set, as the inline run does.
ALTER TABLE news.candidates ADD COLUMN admitted_at timestamptz;
UPDATE news.candidates
   SET admitted_at = updated_at
 WHERE state IN ('queued', 'dead') OR (state = 'held' AND not_before IS NOT NULL);
ALTER TABLE news.candidates DROP COLUMN budget_held_at;
DROP TABLE news.review_budgets;
ALTER TABLE news.sources DROP COLUMN watermark_at, DROP COLUMN watermark_urls;
CREATE INDEX idx_news_candidates_waiting ON news.candidates (shard, created_at, id)
    WHERE state = 'held' AND admitted_at IS NULL;

-- What the stage workers did is noted in the transaction that does it, and taken by the next
-- pass (exactly once, whenever it commits): an article written (reason: its status; source:
-- 'translated' when its summary was translated with its review), a write refused (source: the
-- URL, reason: the error), a review parked behind a review lease held elsewhere.
ALTER TABLE news.report_notes
    DROP CONSTRAINT report_notes_kind_check,
    ADD CONSTRAINT report_notes_kind_check CHECK (kind IN (
        'dropped_items', 'translated', 'fetch_locked', 'redis_failed', 'written',
        'write_refused', 'review_lock_skipped'));
