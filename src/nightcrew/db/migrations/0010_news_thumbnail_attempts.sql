-- nightcrew:scope nightcrew
--
-- No-thumbnail retries take turns: the oldest *attempt* goes first, and an article is retried
-- at most once per retry age, so twenty stubborn pages cannot starve every newer article.

ALTER TABLE news.articles ADD COLUMN thumbnail_attempted_at timestamptz;
