-- nightcrew:scope nightcrew
--
-- objects_deleted exact across a crash (issue 11): before a page of a podcast's objects is
-- deleted, its keys and sizes are written here; the page's count is added, and this cleared,
-- in one statement once the store has answered. A process killed in between leaves the page
-- here, and the next cleanup asks the store which of its keys are gone and counts those
-- before it deletes anything else.

ALTER TABLE nightcrew.podcast_deletions ADD COLUMN in_flight jsonb;
