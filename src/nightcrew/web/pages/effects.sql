-- name: effects_failing
SELECT id, kind, key, attempts, last_attempt_at, next_attempt_at, last_error
  FROM nightcrew.effects
 WHERE delivered_at IS NULL AND dead_at IS NULL AND last_error IS NOT NULL
 ORDER BY last_attempt_at DESC, id DESC
 LIMIT %(limit)s;

-- name: effects_dead
SELECT id, kind, key, attempts, dead_at, dead_reason, last_error
  FROM nightcrew.effects
 WHERE dead_at IS NOT NULL
 ORDER BY dead_at DESC, id DESC
 LIMIT %(limit)s;

-- name: news_candidates
SELECT stage, state, count(*) AS n
  FROM news.candidates
 WHERE state IN ('held', 'queued', 'dead')
 GROUP BY stage, state
 ORDER BY stage, state;

-- name: effects_due
-- Owed and never failed yet: waiting for their first attempt (the partial due index).
SELECT id, kind, key, attempts, next_attempt_at
  FROM nightcrew.effects
 WHERE delivered_at IS NULL AND dead_at IS NULL AND last_error IS NULL
 ORDER BY next_attempt_at, id
 LIMIT %(limit)s;

