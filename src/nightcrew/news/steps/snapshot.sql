-- The shards' public snapshots (snapshot.py).

-- name: snapshot
SELECT url, title, summary, image_url, published_at, created_at
  FROM news.articles
 WHERE shard = %(shard)s AND status = 'accepted'
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: stale_snapshot
INSERT INTO news.snapshots AS s (shard, stale_since) VALUES (%(shard)s, %(now)s)
ON CONFLICT (shard) DO UPDATE SET stale_since = coalesce(s.stale_since, excluded.stale_since);

-- name: any_due
-- Whether claim_snapshots would find a shard (the article count is read only then).
SELECT EXISTS (SELECT 1 FROM news.snapshots
                WHERE stale_since IS NOT NULL
                  AND (published_at IS NULL
                       OR published_at <= %(now)s - make_interval(secs => %(debounce)s)))
       AS due;

-- name: claim_snapshots
-- Shards whose snapshot is stale and was not published within the debounce interval.
UPDATE news.snapshots SET stale_since = NULL, published_at = %(now)s
 WHERE shard IN (SELECT shard FROM news.snapshots
                  WHERE stale_since IS NOT NULL
                    AND (published_at IS NULL
                         OR published_at <= %(now)s - make_interval(secs => %(debounce)s))
                    FOR UPDATE SKIP LOCKED)
RETURNING shard;

-- name: restale_snapshot
UPDATE news.snapshots SET stale_since = coalesce(stale_since, %(now)s) WHERE shard = %(shard)s;
