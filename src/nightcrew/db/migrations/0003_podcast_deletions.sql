-- nightcrew:scope nightcrew
--
-- The durable after-work of a hard deletion. The podcast row and this record are written in
-- one transaction, so whatever happens next — a store that fails half its deletes, a queue
-- that is down, a crash — the next daily run knows exactly which storage prefix and which
-- feed still need cleaning, retries them, and reports them until they are done.

CREATE TABLE nightcrew.podcast_deletions (
    podcast_id          uuid PRIMARY KEY,
    slug                text NOT NULL,
    deleted_at          timestamptz NOT NULL,
    storage_cleaned_at  timestamptz,
    objects_deleted     bigint NOT NULL DEFAULT 0,
    bytes_deleted       bigint NOT NULL DEFAULT 0,
    objects_left        integer,
    invalidated_at      timestamptz,
    attempts            integer NOT NULL DEFAULT 0,
    last_error          text,
    updated_at          timestamptz
);
CREATE INDEX idx_podcast_deletions_unfinished ON nightcrew.podcast_deletions (deleted_at)
    WHERE storage_cleaned_at IS NULL OR invalidated_at IS NULL;
