-- Spec 001's backpressure: the article count (both engines) and the pipeline's stage
-- admission, per stage and shard (admission.py).

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
-- One admission into a shard's stage at a time, so concurrent workers cannot all see the same
-- room; another shard's admissions take another lock.
SELECT pg_advisory_xact_lock(hashtext('nightcrew.news.stage.' || %(stage)s),
                             hashtext(%(shard)s));

-- name: stage_load
-- A shard's candidates owed to, waiting in, or being worked on in a stage: its depth plus in
-- flight, for that shard only (spec 001 counts the queue by source and shard).
SELECT count(*) AS n FROM news.candidates
 WHERE shard = %(shard)s AND stage = %(stage)s AND state = 'queued';

-- name: fetch_load
SELECT count(*) AS n FROM news.sources WHERE fetch_queued_at IS NOT NULL;
