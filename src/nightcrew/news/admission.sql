-- Spec 001's backpressure: the article count (both engines) and the pipeline's stage
-- admission (admission.py).

-- name: article_count
SELECT news.article_count() AS n;

-- name: savepoint_article_count
-- The count may fail (an operator's replacement of news.article_count(), a statement
-- timeout): spec 001 reports that and goes on, so inside a transaction it runs under a
-- savepoint the failure rolls back to, leaving the admission's transaction usable.
SAVEPOINT article_count;

-- name: rollback_article_count
ROLLBACK TO SAVEPOINT article_count;

-- name: admission_lock
-- One admission into a stage at a time, so concurrent workers cannot all see the same room.
SELECT pg_advisory_xact_lock(hashtext('nightcrew.news.stage.' || %(stage)s));

-- name: stage_load
-- Candidates owed to, waiting in, or being worked on in a stage: its depth plus in flight.
SELECT count(*) AS n FROM news.candidates WHERE stage = %(stage)s AND state = 'queued';

-- name: fetch_load
SELECT count(*) AS n FROM news.sources WHERE fetch_queued_at IS NOT NULL;
