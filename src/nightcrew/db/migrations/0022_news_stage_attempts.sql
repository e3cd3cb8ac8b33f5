-- nightcrew:scope nightcrew
--
-- The pipeline counts a candidate's attempts in PostgreSQL, when a stage takes it (issue 23),
-- not in the broker's delivery header: a message that dies with its worker counts like one
-- that failed, and the count survives a candidate parked behind a lease and released as a
-- fresh message (whose header count starts again).
--
-- candidates.stage_attempts: the takes of the candidate at its current stage that did not
-- finish — failed, or never came back (its worker died). Back to 0 whenever an attempt
-- finishes (the candidate moves on, is deferred, or waits for a retry the model asked for).
-- At NEWS_MAX_DELIVERIES the candidate is dead-lettered and no worker runs it again.
-- (candidates.attempts stays what it was: the model's failed review attempts.)
-- candidates.stage_taken_at: when the attempt under way began; NULL once it finished. A take
-- that finds it set knows the previous attempt never finished: "worker died".
-- candidates.stage_taken_by: the token of that attempt, the handling message's own: taking the
-- candidate again with the same token (after a database outage that lost the answer to the
-- take, or as the copy a stopping worker handed back) resumes the attempt, uncounted.

ALTER TABLE news.candidates
    ADD COLUMN stage_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN stage_taken_at timestamptz,
    ADD COLUMN stage_taken_by text;
