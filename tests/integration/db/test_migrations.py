"""Migrations apply once, under a lock; db check reports what a database lacks."""

from __future__ import annotations

import asyncio

import pytest

from nightcrew.db.check import check_schema
from nightcrew.db.contract import TABLES
from nightcrew.db.database import Database
from nightcrew.db.migrate import Migration, discover_migrations, migrate
from nightcrew.errors import MigrationError


async def test_migrate_applies_everything_once_then_is_a_no_op(empty_db_url: str) -> None:
    db = await Database.open(empty_db_url)
    try:
        first = await migrate(db)
        second = await migrate(db)
    finally:
        await db.close()
    labels = [m.label for m in discover_migrations()]
    assert first.applied == labels and first.already_applied == []
    assert second.applied == [] and second.already_applied == labels


async def test_two_migrators_racing_apply_each_migration_exactly_once(empty_db_url: str) -> None:
    dbs = [await Database.open(empty_db_url) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(d) for d in dbs))
        rows = await dbs[0].fetch("SELECT version FROM nightcrew.schema_migrations ORDER BY 1")
    finally:
        for d in dbs:
            await d.close()
    applied = [label for r in results for label in r.applied]
    assert sorted(applied) == [m.label for m in discover_migrations()]
    assert [r["version"] for r in rows] == [m.version for m in discover_migrations()]


async def test_an_edited_migration_is_refused(db: Database) -> None:
    await db.execute("UPDATE nightcrew.schema_migrations SET checksum = 'x' WHERE version = 1")
    with pytest.raises(MigrationError, match="edited after it was applied"):
        await migrate(db)


async def test_a_failing_migration_leaves_no_partial_state(empty_db_url: str) -> None:
    db = await Database.open(empty_db_url)
    try:
        # A table the reference migration wants to create already exists: it must fail whole.
        await db.execute("CREATE TABLE public.podcasts (id int)")
        with pytest.raises(MigrationError, match="0001_reference_schema failed"):
            await migrate(db)
        leftovers = await db.fetch("SELECT to_regclass('public.billing_accounts') AS t")
        applied = await db.fetch("SELECT version FROM nightcrew.schema_migrations")
    finally:
        await db.close()
    assert leftovers == [{"t": None}]
    assert applied == []


async def test_skip_reference_creates_only_nightcrews_own_tables(empty_db_url: str) -> None:
    db = await Database.open(empty_db_url)
    try:
        result = await migrate(db, skip_reference=True)
        report = await check_schema(db)
    finally:
        await db.close()
    assert result.skipped == [m.label for m in discover_migrations() if m.scope == "reference"]
    assert result.applied == [m.label for m in discover_migrations() if m.scope == "nightcrew"]
    by_name = {t.name: t for t in report.tables}
    assert by_name["nightcrew.runs"].ok and by_name["nightcrew.queue_messages"].ok
    assert by_name["public.podcasts"].problems == ["table public.podcasts: missing"]
    assert not report.ok


async def test_db_check_is_clean_on_the_reference_schema(db: Database) -> None:
    report = await check_schema(db)
    assert report.ok, report.to_json()
    assert {t.name for t in report.tables} == set(TABLES)
    assert all(not t.advice for t in report.tables)


async def test_db_check_names_what_is_missing_table_by_table(db: Database) -> None:
    await db.execute("ALTER TABLE public.episodes DROP COLUMN original_audio_url")
    await db.execute("DROP TRIGGER trigger_enforce_storage_account_cap ON public.episodes")
    await db.execute("ALTER TABLE public.episodes ALTER COLUMN audio_file_size_bytes TYPE integer")
    await db.execute("DROP INDEX public.idx_import_items_active")
    await db.execute("DROP FUNCTION public.reap_unconfirmed_users")
    report = await check_schema(db)
    assert not report.ok
    episodes = next(t for t in report.tables if t.name == "public.episodes")
    assert episodes.problems == [
        "column public.episodes.audio_file_size_bytes: expected bigint, found integer",
        "column public.episodes.original_audio_url: missing, expected text",
        "trigger trigger_enforce_storage_account_cap on public.episodes: missing",
    ]
    items = next(t for t in report.tables if t.name == "public.import_items")
    assert items.ok and items.advice == [
        "index idx_import_items_active is missing: its sweep will scan the table"
    ]
    assert report.problems == [
        "function public.reap_unconfirmed_users(interval): missing"
        " — the signup reaper (nightcrew reads deleted and skipped)"
    ]


def _up_to(version: int) -> list[Migration]:
    return [m for m in discover_migrations() if m.version <= version]


async def test_a_development_database_at_0019_upgrades_to_the_spec_signatures(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database migrated to 0019 only (effective_cap with p_now, account_caps, the cap
    trigger counting through schema nightcrew) ends with spec 000's signatures."""
    db = await Database.open(empty_db_url)
    try:
        with monkeypatch.context() as patch:
            patch.setattr("nightcrew.db.migrate.discover_migrations", lambda: _up_to(19))
            await migrate(db)
        result = await migrate(db)
        assert result.applied == [m.label for m in discover_migrations() if m.version > 19]
        report = await check_schema(db)
        assert report.ok, report.to_json()
        gone = await db.fetch(
            "SELECT p.oid::regprocedure::text AS fn FROM pg_proc p"
            " WHERE p.proname IN ('account_caps', 'account_stored_bytes',"
            " 'account_stored_bytes_of')"
        )
        assert gone == []
    finally:
        await db.close()


async def test_a_database_at_0019_that_switches_to_skip_reference_is_refused(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0019 pointed the reference cap trigger at a function 0021 drops; without 0020 (a
    reference migration) every episode write would fail. 0021 refuses, saying what to do, and
    leaves nothing half done."""
    db = await Database.open(empty_db_url)
    try:
        with monkeypatch.context() as patch:
            patch.setattr("nightcrew.db.migrate.discover_migrations", lambda: _up_to(19))
            await migrate(db)
        with pytest.raises(MigrationError) as refused:
            await migrate(db, skip_reference=True)
        assert "0021_two_byte_rules" in str(refused.value)
        assert "without --skip-reference" in str(refused.value)
        still = await db.fetch_one(
            "SELECT to_regproc('nightcrew.account_stored_bytes') IS NOT NULL AS kept,"
            " (SELECT max(version) FROM nightcrew.schema_migrations) AS version"
        )
        assert still == {"kept": True, "version": 19}
    finally:
        await db.close()
