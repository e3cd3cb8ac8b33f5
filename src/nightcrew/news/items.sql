-- Holding new items (items.py). The inline run's hold statements are candidates.sql's.

-- name: hold_staged
-- The pipeline: a fetch's new items, each at its first stage, queued (with its message in the
-- outbox) or held with the reason; minus what is written or already a candidate.
WITH ins AS (
    INSERT INTO news.candidates AS c (url, source_id, shard, title, summary, image_url,
                                      published_at, stage, state, reason, created_at,
                                      updated_at)
    SELECT i.url, i.source_id, %(shard)s, i.title, i.summary, i.image_url, i.published_at,
           i.stage, i.state, i.reason, %(now)s, %(now)s
      FROM unnest(%(urls)b::text[], %(source_ids)b::bigint[], %(titles)b::text[],
                  %(summaries)b::text[], %(images)b::text[], %(published)b::timestamptz[],
                  %(stages)b::text[], %(states)b::text[], %(reasons)b::text[])
           WITH ORDINALITY AS i (url, source_id, title, summary, image_url, published_at,
                                 stage, state, reason, n)
     WHERE NOT EXISTS (SELECT 1 FROM news.articles a WHERE a.url = i.url)
     ORDER BY i.n
    ON CONFLICT (url) DO NOTHING
    RETURNING c.url, c.shard, c.stage, c.state
)
INSERT INTO news.outbox (stage, body, created_at)
SELECT stage, jsonb_build_object('url', url, 'shard', shard), %(now)s FROM ins
 WHERE state = 'queued'
RETURNING id, message_id, stage, body;
