from __future__ import annotations

from pathlib import Path

import pytest

import nightcrew
from nightcrew.db.queries import parse_queries

PACKAGE = Path(nightcrew.__file__).parent


def test_parse_named_blocks() -> None:
    q = parse_queries("-- name: a\nSELECT 1;\n\n-- name: b_2\n-- a comment\nSELECT 2;\n", Path("x"))
    assert q.names() == ["a", "b_2"]
    assert q["a"] == "SELECT 1;"
    assert q["b_2"] == "-- a comment\nSELECT 2;"
    with pytest.raises(KeyError, match="no query named 'c'"):
        q["c"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SELECT 1", "no '-- name"),
        ("-- name: a\n", "is empty"),
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;", "defined twice"),
    ],
)
def test_malformed_files_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_queries(text, Path("x.sql"))


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.sql")) if "migrations" not in p.parts],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_every_query_file_in_the_package_parses(path: Path) -> None:
    queries = parse_queries(path.read_text(), path)
    assert queries.names()
    for name in queries.names():
        if (path.relative_to(PACKAGE).as_posix(), name) in READS_THE_DATABASES_NOW:
            continue
        assert "now()" not in queries[name].lower(), f"{name}: take `now` as a parameter"


# Queries that read the database's now() without deciding by it: the platform's
# reap_unconfirmed_users(interval) cuts off at now() - retention, so the reaper translates
# nightcrew's clock (a parameter) into that interval.
READS_THE_DATABASES_NOW = {("lifecycle/signups.sql", "reap_unconfirmed_users")}
