-- nightcrew:scope nightcrew
--
-- The model's token usage on the pipeline's review stage, noted with the review's result (in
-- the transaction that hands the candidate on, or puts it back to wait) and taken by the next
-- pass into its report's workers.aiPromptTokens / aiCompletionTokens (reason: 'prompt' or
-- 'completion'; n: the tokens).
ALTER TABLE news.report_notes
    DROP CONSTRAINT report_notes_kind_check,
    ADD CONSTRAINT report_notes_kind_check CHECK (kind IN (
        'dropped_items', 'translated', 'fetch_locked', 'redis_failed', 'written',
        'write_refused', 'review_lock_skipped', 'ai_tokens'));
