-- nightcrew:scope nightcrew
--
-- The backpressure signal as a function: one place for "how big is the article table", which
-- an operator can swap for an estimate (pg_class.reltuples) on a very large table.

CREATE FUNCTION news.article_count() RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT count(*) FROM news.articles $$;
