"""The database seam against a real PostgreSQL. A query that answers one column needs no record:
``fetch_values`` / ``fetch_value`` give its first column, each value checked to be the kind the
caller named; ``fetch_as`` reads each row straight into its record, by the columns' names; a
session's settings end with it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import pytest

from nightcrew.db.database import Database, QueryError


@dataclass(frozen=True, kw_only=True, slots=True)
class _Sample:
    id: int
    label: str
    note: str | None = None


async def test_fetch_values_gives_the_first_column_of_every_row_in_order(db: Database) -> None:
    values = await db.fetch_values(
        str, "SELECT s::text AS label, s AS n FROM generate_series(3, 1, -1) AS s"
    )
    assert values == ["3", "2", "1"]
    assert await db.fetch_values(int, "SELECT 1 WHERE false") == []


async def test_fetch_value_is_none_without_a_row_and_for_null(db: Database) -> None:
    assert await db.fetch_value(int, "SELECT 1 WHERE false") is None
    assert await db.fetch_value(datetime, "SELECT NULL::timestamptz") is None
    found = await db.fetch_value(UUID, "SELECT gen_random_uuid()")
    assert isinstance(found, UUID)
    assert await db.fetch_count("SELECT count(*) FROM generate_series(1, 4)") == 4
    assert await db.fetch_count("SELECT 1 WHERE false") == 0


async def test_a_value_of_another_kind_is_a_type_error_naming_the_query(db: Database) -> None:
    with pytest.raises(TypeError, match=r"expected int in the first column, got '7'.*SELECT"):
        await db.fetch_value(int, "SELECT '7'::text")
    with pytest.raises(TypeError, match="expected str in the first column, got None"):
        await db.fetch_values(str, "SELECT NULL::text")  # a list of str holds no NULL
    with pytest.raises(TypeError, match="expected int in the first column, got True"):
        await db.fetch_value(int, "SELECT true")  # a bool is an int to isinstance, not here


async def test_the_first_column_is_the_first_even_when_two_share_a_name(db: Database) -> None:
    assert await db.fetch_value(int, "SELECT 1 AS x, 2 AS x") == 1
    assert await db.fetch_values(int, "SELECT 1, 2 UNION ALL SELECT 3, 4") == [1, 3]
    # the dry-run view reads the same, inside the transaction it rolls back
    assert await db.rollback_only().fetch_value(int, "SELECT 5 AS x, 6 AS x") == 5


async def test_a_sessions_settings_are_reset_before_its_connection_goes_back(
    fresh_db_url: str,
) -> None:
    """A session's ``settings`` and ``statement_timeout`` (the reconciler's join settings, its
    application_name) hold inside it only: RESET, one by one, before the pooled connection is
    handed to anyone else (one connection in the pool, so the next statement gets the same)."""
    db = await Database.open(fresh_db_url, max_size=1)
    try:
        before = await db.fetch_value(str, "SELECT current_setting('work_mem')")
        async with db.session(
            statement_timeout=90,
            settings={"work_mem": "7MB", "application_name": "nightcrew-test-session"},
        ) as conn:
            assert await conn.fetch_value(str, "SELECT current_setting('work_mem')") == "7MB"
            assert await conn.fetch_value(str, "SHOW statement_timeout") == "90s"
        assert await db.fetch_value(str, "SELECT current_setting('work_mem')") == before
        assert await db.fetch_value(str, "SHOW application_name") != "nightcrew-test-session"
        assert await db.fetch_value(str, "SHOW statement_timeout") != "90s"
    finally:
        await db.close()


async def test_a_session_whose_settings_fail_half_way_keeps_none_of_them(
    fresh_db_url: str,
) -> None:
    """A setting refused after another was made (or a caller cancelled between them) must not
    leave the first on the pooled connection for the next borrower."""
    db = await Database.open(fresh_db_url, max_size=1)
    try:
        before = await db.fetch_value(str, "SELECT current_setting('work_mem')")
        with pytest.raises(QueryError, match="enable_nestloop"):
            async with db.session(settings={"work_mem": "7MB", "enable_nestloop": "maybe"}):
                pytest.fail("the session must not start with a refused setting")
        assert await db.fetch_value(str, "SELECT current_setting('work_mem')") == before

        entered = asyncio.Event()

        async def cancelled_inside() -> None:
            async with db.session(settings={"work_mem": "9MB"}):
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(cancelled_inside())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await db.fetch_value(str, "SELECT current_setting('work_mem')") == before
    finally:
        await db.close()


async def test_fetch_as_reads_rows_into_records_by_column_name(db: Database) -> None:
    # columns in another order than the fields, one the record does not name, a default kept
    rows = await db.fetch_as(
        _Sample,
        "SELECT 'x' || s AS label, now() AS added_later, s AS id"
        " FROM generate_series(1, 2) AS s ORDER BY s",
    )
    assert rows == [_Sample(id=1, label="x1"), _Sample(id=2, label="x2")]
    assert await db.fetch_one_as(_Sample, "SELECT 3 AS id, 'y' AS label, 'n' AS note") == (
        _Sample(id=3, label="y", note="n")
    )
    assert await db.fetch_one_as(_Sample, "SELECT 1 AS id, 'z' AS label WHERE false") is None
    # of two columns of one name the last counts, as in a dict row
    assert await db.fetch_as(_Sample, "SELECT 1 AS id, 'a' AS label, 'b' AS label") == [
        _Sample(id=1, label="b")
    ]


async def test_a_query_without_a_records_column_fails_naming_both_and_the_pool_goes_on(
    fresh_db_url: str,
) -> None:
    # one connection: were it lost, the next query would time out
    db = await Database.open(fresh_db_url, max_size=1)
    try:
        for _ in range(3):
            with pytest.raises(TypeError) as raised:
                await db.fetch_as(_Sample, "SELECT 1 AS id, 'x' AS title")
            assert str(raised.value) == (
                "_Sample.label: the query returns no column 'label' (it returns id, title)"
            )
        # the connection went back whole, each time: the next query on the pool answers
        assert await db.fetch_value(int, "SELECT 41 + 1") == 42
        # a record and a query that disagree fail even when no row comes back
        with pytest.raises(TypeError, match="no column 'label'"):
            await db.fetch_as(_Sample, "SELECT 1 AS id WHERE false")
    finally:
        await db.close()
