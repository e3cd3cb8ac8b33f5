-- Operators' actions (nightcrew.actions, migration 0025).

-- name: record_action
INSERT INTO nightcrew.actions (at, source, action, target, ids, client, outcome)
VALUES (%(at)s, %(source)s, %(action)s, %(target)s, %(ids)s, %(client)s, %(outcome)s);

-- name: recent_actions
SELECT id, at, source, action, target, ids, client, outcome
  FROM nightcrew.actions
 WHERE action = ANY(%(actions)s::text[])
 ORDER BY at DESC, id DESC
 LIMIT %(limit)s;
