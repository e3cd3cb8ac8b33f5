-- The shard fences (leases.py).

-- name: draw_fence
-- A new holder's fence: one more than any holder of the shard has drawn.
INSERT INTO news.shard_fences AS f (shard, fence) VALUES (%(shard)s, 1)
ON CONFLICT (shard) DO UPDATE SET fence = f.fence + 1
RETURNING fence;

-- name: claim_fence
-- The fencing check: this holder's fence must be at least the newest any writer has used.
INSERT INTO news.shard_fences AS f (shard, fence) VALUES (%(shard)s, %(fence)s)
ON CONFLICT (shard) DO UPDATE SET fence = excluded.fence WHERE f.fence <= excluded.fence
RETURNING fence;
