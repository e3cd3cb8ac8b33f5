-- Dead letters: replay and purge (dlq.py).

-- name: requeue_candidate
-- Replayed: queued again at the stage it waits for (which may be past the dead letter's own,
-- if the letter was a stale duplicate).
-- Its attempts start again from none: the cause is fixed, so the operator says. A replayed
-- candidate is admitted (the operator's say-so), and counts in its shard's load.
UPDATE news.candidates
   SET state = 'queued', last_error = NULL, reason = 'replayed from the dead letters',
       stage_attempts = 0, stage_taken_at = NULL, not_before = NULL,
       admitted_at = coalesce(admitted_at, %(now)s), updated_at = %(now)s
 WHERE url = %(url)s AND state IN ('dead', 'queued', 'held')
RETURNING url, shard, stage;

-- name: requeue_source
UPDATE news.sources SET fetch_queued_at = %(now)s
 WHERE id = %(id)s
RETURNING id, shard;

-- name: purge_candidate
-- Only a candidate still at the letter's stage: one that moved on (its message was re-sent and
-- worked) is not the letter's to give up.
UPDATE news.candidates SET state = 'rejected', reason = %(reason)s, updated_at = %(now)s
 WHERE url = %(url)s AND stage = %(stage)s AND state IN ('dead', 'queued', 'held');

-- name: purge_source
UPDATE news.sources SET fetch_queued_at = NULL WHERE id = %(id)s;
