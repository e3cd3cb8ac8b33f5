"""`db check` checks the contract, not names, and passes exactly when nightcrew will
work.

A platform whose functions, triggers, column types and unique indexes are spec 000's passes —
with the result and column types of the same family (spec 000 gives none), OUT parameters for a
TABLE result, an enum for a text column nightcrew only compares with literals. A platform with
one thing different fails with exactly one line naming that thing, what was expected and what
was found. So does a role that may not do what nightcrew does: use a schema, read or write a
table, execute a function, or see the rows behind row-level security. Each case starts from the
fully migrated reference database (which matches spec 000 exactly, the first test says so) and
breaks one thing.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import nightcrew
from nightcrew.db.check import check_schema
from nightcrew.db.check_report import CheckReport
from nightcrew.db.contract import RLS_HINT, TABLES, WRITES
from nightcrew.db.database import Database
from tests.acceptance.test_cli import _env, run

REAP = "TABLE(deleted integer, skipped integer)"
TZ = "timestamp with time zone"
MEDIA_JOBS_ACTIVE = "status = ANY (ARRAY['pending'::text, 'running'::text])"
NOT_APPLIED = " (nightcrew's migrations are not applied: run `nightcrew db migrate`)"


@dataclass(frozen=True)
class Case:
    sql: tuple[str, ...]
    line: str  # the one mismatch line the check must print


def _replace(function: str, create: str) -> tuple[str, ...]:
    """Drop the spec's function and create another one under its name."""
    return (f"DROP FUNCTION {function}", create)


FUNCTION_CASES: dict[str, Case] = {
    # public.reap_unconfirmed_users(interval) → TABLE(deleted integer, skipped integer)
    "reap takes text": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention text)"
            f" RETURNS {REAP} LANGUAGE sql AS $$ SELECT 0, 0 $$",
        ),
        "function public.reap_unconfirmed_users:"
        f" expected (interval) → {REAP}, found (text) → {REAP}",
    ),
    "reap takes a time too": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval,"
            f" p_now timestamptz DEFAULT now()) RETURNS {REAP} LANGUAGE sql AS $$ SELECT 0, 0 $$",
        ),
        "function public.reap_unconfirmed_users:"
        f" expected (interval) → {REAP}, found (interval, {TZ}) → {REAP}",
    ),
    "reap returns one integer": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
            " RETURNS integer LANGUAGE sql AS $$ SELECT 0 $$",
        ),
        f"function public.reap_unconfirmed_users: expected (interval) → {REAP},"
        " found (interval) → integer (columns deleted, skipped expected)",
    ),
    "reap names its columns otherwise": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
            " RETURNS TABLE(removed integer, kept integer) LANGUAGE sql AS $$ SELECT 0, 0 $$",
        ),
        f"function public.reap_unconfirmed_users: expected (interval) → {REAP},"
        " found (interval) → TABLE(removed integer, kept integer)"
        " (no column deleted; no column skipped)",
    ),
    "reap says removed for deleted": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval,"
            " OUT removed integer, OUT skipped integer) LANGUAGE sql AS $$ SELECT 0, 0 $$",
        ),
        f"function public.reap_unconfirmed_users: expected (interval) → {REAP},"
        " found (interval) → record (removed integer, skipped integer) (no column deleted)",
    ),
    "reap counts in text": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
            " RETURNS TABLE(deleted text, skipped integer) LANGUAGE sql AS $$ SELECT '0', 0 $$",
        ),
        f"function public.reap_unconfirmed_users: expected (interval) → {REAP},"
        " found (interval) → TABLE(deleted text, skipped integer)"
        " (column deleted must be smallint, integer or bigint)",
    ),
    # public.effective_cap(uuid, text) → numeric
    "effective_cap takes a time": Case(
        _replace(
            "public.effective_cap(uuid, text)",
            "CREATE FUNCTION public.effective_cap(account uuid, resource text, p_now timestamptz)"
            " RETURNS numeric LANGUAGE sql AS $$ SELECT NULL::numeric $$",
        ),
        "function public.effective_cap:"
        f" expected (uuid, text) → numeric, found (uuid, text, {TZ}) → numeric",
    ),
    "effective_cap returns text": Case(
        _replace(
            "public.effective_cap(uuid, text)",
            "CREATE FUNCTION public.effective_cap(account uuid, resource text)"
            " RETURNS text LANGUAGE sql AS $$ SELECT NULL::text $$",
        ),
        "function public.effective_cap: expected (uuid, text) → numeric,"
        " found (uuid, text) → text (the result must be smallint, integer, bigint, numeric,"
        " real or double precision)",
    ),
    # in a CASE of a select list: a set-returning function is refused there
    "effective_cap returns a set": Case(
        _replace(
            "public.effective_cap(uuid, text)",
            "CREATE FUNCTION public.effective_cap(account uuid, resource text)"
            " RETURNS SETOF numeric LANGUAGE sql AS $$ SELECT NULL::numeric $$",
        ),
        "function public.effective_cap: expected (uuid, text) → numeric,"
        " found (uuid, text) → SETOF numeric (one value expected, not a set or a row)",
    ),
    "effective_cap is gone": Case(
        ("DROP FUNCTION public.effective_cap(uuid, text)",),
        "function public.effective_cap(uuid, text): missing"
        " — the live cap of an account for a resource (NULL = unlimited)",
    ),
    # An overload whose extra argument has a default: effective_cap(uuid, text) is ambiguous.
    "effective_cap has a defaulted overload": Case(
        (
            "CREATE FUNCTION public.effective_cap(account uuid, resource text,"
            " p_now timestamptz DEFAULT now())"
            " RETURNS numeric LANGUAGE sql AS $$ SELECT NULL::numeric $$",
        ),
        "function public.effective_cap: expected (uuid, text) → numeric alone, found also"
        f" (uuid, text, {TZ}) → numeric with defaults,"
        " which makes a call with (uuid, text) ambiguous",
    ),
    # public.notify_media_job_result(uuid) → void
    "notify takes a bigint": Case(
        _replace(
            "public.notify_media_job_result(uuid)",
            "CREATE FUNCTION public.notify_media_job_result(job_id bigint)"
            " RETURNS void LANGUAGE sql AS $$ SELECT $$",
        ),
        "function public.notify_media_job_result: expected (uuid) → void, found (bigint) → void",
    ),
    "notify returns a boolean": Case(
        _replace(
            "public.notify_media_job_result(uuid)",
            "CREATE FUNCTION public.notify_media_job_result(job_id uuid)"
            " RETURNS boolean LANGUAGE sql AS $$ SELECT true $$",
        ),
        "function public.notify_media_job_result: expected (uuid) → void,"
        " found (uuid) → boolean (the result must be void)",
    ),
    # auth.uid() → uuid
    "uid returns text": Case(
        _replace(
            "auth.uid()",
            "CREATE FUNCTION auth.uid() RETURNS text LANGUAGE sql AS $$ SELECT NULL::text $$",
        ),
        "function auth.uid: expected () → uuid, found () → text (the result must be uuid)",
    ),
    "uid takes an argument": Case(
        _replace(
            "auth.uid()",
            "CREATE FUNCTION auth.uid(claim text) RETURNS uuid"
            " LANGUAGE sql AS $$ SELECT NULL::uuid $$",
        ),
        "function auth.uid: expected () → uuid, found (text) → uuid",
    ),
    # nightcrew's own: a mismatch means its migrations are not applied.
    "object_key is gone": Case(
        ("DROP FUNCTION nightcrew.object_key(text, text)",),
        "function nightcrew.object_key(text, text): missing"
        " — object keys from public URLs (reconciler)" + NOT_APPLIED,
    ),
    # nightcrew's own are exactly what its migrations create: another type is drift
    "escalation bytes in bigint": Case(
        _replace(
            "nightcrew.escalation_storage_bytes()",
            "CREATE FUNCTION nightcrew.escalation_storage_bytes()"
            " RETURNS TABLE(account_id uuid, bytes bigint)"
            " LANGUAGE sql AS $$ SELECT NULL::uuid, 0::bigint $$",
        ),
        "function nightcrew.escalation_storage_bytes:"
        " expected () → TABLE(account_id uuid, bytes numeric),"
        " found () → TABLE(account_id uuid, bytes bigint) (column bytes must be numeric)"
        + NOT_APPLIED,
    ),
    "overcap bytes takes an argument": Case(
        _replace(
            "nightcrew.overcap_report_bytes()",
            "CREATE FUNCTION nightcrew.overcap_report_bytes(include_pending_deletion boolean)"
            " RETURNS TABLE(account_id uuid, bytes numeric)"
            " LANGUAGE sql AS $$ SELECT NULL::uuid, 0::numeric $$",
        ),
        "function nightcrew.overcap_report_bytes:"
        " expected () → TABLE(account_id uuid, bytes numeric),"
        " found (boolean) → TABLE(account_id uuid, bytes numeric)" + NOT_APPLIED,
    ),
}

TABLE_CASES: dict[str, Case] = {
    # triggers: present, on their table
    "cap trigger dropped": Case(
        ("DROP TRIGGER trigger_enforce_storage_account_cap ON public.episodes",),
        "trigger trigger_enforce_storage_account_cap on public.episodes: missing",
    ),
    "cap trigger on another table": Case(
        (
            "DROP TRIGGER trigger_enforce_storage_account_cap ON public.episodes",
            "CREATE TRIGGER trigger_enforce_storage_account_cap BEFORE INSERT ON public.podcasts"
            " FOR EACH ROW EXECUTE FUNCTION public.enforce_storage_account_cap()",
        ),
        "trigger trigger_enforce_storage_account_cap:"
        " expected on public.episodes, found on public.podcasts",
    ),
    # columns
    "attempts column is text": Case(
        ("ALTER TABLE public.import_items ALTER COLUMN attempts TYPE text",),
        "column public.import_items.attempts: expected smallint, integer or bigint, found text",
    ),
    # stays exact: a timestamp without a time zone silently shifts every deadline
    "overage clock without a time zone": Case(
        (
            "ALTER TABLE public.billing_accounts"
            " ALTER COLUMN content_overage_since TYPE timestamp without time zone",
        ),
        "column public.billing_accounts.content_overage_since:"
        f" expected {TZ}, found timestamp without time zone",
    ),
    "outbox podcast id as text": Case(
        ("ALTER TABLE public.feed_invalidation_outbox ALTER COLUMN podcast_id TYPE text",),
        "column public.feed_invalidation_outbox.podcast_id: expected uuid, found text",
    ),
    # stays exact: the size backfill writes object sizes past 2 GiB into it
    "audio size an integer": Case(
        (
            # the cap trigger's WHEN names the column: set aside and put back as it was
            """DO $$
            DECLARE
                definition text := pg_get_triggerdef((SELECT oid FROM pg_trigger
                    WHERE tgname = 'trigger_enforce_storage_account_cap'));
            BEGIN
                DROP TRIGGER trigger_enforce_storage_account_cap ON public.episodes;
                ALTER TABLE public.episodes ALTER COLUMN audio_file_size_bytes TYPE integer;
                EXECUTE definition;
            END $$""",
        ),
        "column public.episodes.audio_file_size_bytes: expected bigint, found integer",
    ),
    # nightcrew takes URLs apart with text functions: an enum will not do
    "cover image an enum": Case(
        (
            "CREATE TYPE public.cover_kind AS ENUM ('none')",
            "ALTER TABLE public.episodes ALTER COLUMN cover_image_url TYPE public.cover_kind"
            " USING cover_image_url::public.cover_kind",
        ),
        "column public.episodes.cover_image_url: expected text or character varying, found"
        " enum public.cover_kind (an enum will not do: the reconciler takes it apart with text"
        " functions (left, strpos, nightcrew.object_key) and compares it with text)",
    ),
    # nightcrew's own tables are what its migrations create
    "a nightcrew counter in bigint": Case(
        ("ALTER TABLE nightcrew.effects ALTER COLUMN attempts TYPE bigint",),
        "column nightcrew.effects.attempts: expected integer, found bigint",
    ),
    "column dropped": Case(
        ("ALTER TABLE public.podcasts DROP COLUMN deletion_redirect_url",),
        "column public.podcasts.deletion_redirect_url: missing, expected text",
    ),
    "table dropped": Case(
        ("DROP TABLE public.automation_jobs",),
        "table public.automation_jobs: missing",
    ),
    # unique indexes: unique, same columns, partial where the reference is
    "one-active index not unique": Case(
        (
            "DROP INDEX public.idx_media_jobs_one_active",
            "CREATE INDEX idx_media_jobs_one_active ON public.media_jobs (episode_id, type)"
            " WHERE status IN ('pending', 'running')",
        ),
        "unique index idx_media_jobs_one_active on public.media_jobs: expected UNIQUE"
        " (episode_id, type) WHERE status IN ('pending', 'running'), found"
        f" idx_media_jobs_one_active (episode_id, type) WHERE {MEDIA_JOBS_ACTIVE} (not unique)",
    ),
    "one-active index not partial": Case(
        (
            "DROP INDEX public.idx_media_jobs_one_active",
            "CREATE UNIQUE INDEX idx_media_jobs_one_active ON public.media_jobs (episode_id, type)",
        ),
        "unique index idx_media_jobs_one_active on public.media_jobs: expected UNIQUE"
        " (episode_id, type) WHERE status IN ('pending', 'running'), found"
        " idx_media_jobs_one_active UNIQUE (episode_id, type)",
    ),
    "one-active index over other columns": Case(
        (
            "DROP INDEX public.idx_media_jobs_one_active",
            "CREATE UNIQUE INDEX idx_media_jobs_one_active ON public.media_jobs (episode_id)"
            " WHERE status IN ('pending', 'running')",
        ),
        "unique index idx_media_jobs_one_active on public.media_jobs: expected UNIQUE"
        " (episode_id, type) WHERE status IN ('pending', 'running'), found"
        f" idx_media_jobs_one_active UNIQUE (episode_id) WHERE {MEDIA_JOBS_ACTIVE}",
    ),
    "hosting migration index dropped": Case(
        ("DROP INDEX public.idx_podcast_imports_hosting_migration_active",),
        "unique index idx_podcast_imports_hosting_migration_active on public.podcast_imports:"
        " expected UNIQUE (podcast_id) WHERE is_hosting_migration AND status IN"
        " ('preview', 'running'), found idx_podcast_imports_podcast (podcast_id) (not unique)",
    ),
    # nightcrew's SQL names these (ON CONFLICT ON CONSTRAINT): another name will not do
    "effects key constraint renamed": Case(
        (
            "ALTER TABLE nightcrew.effects RENAME CONSTRAINT effects_one_per_key"
            " TO effects_kind_key_key",
        ),
        "unique index effects_one_per_key on nightcrew.effects: expected constraint"
        " effects_one_per_key UNIQUE (kind, key), found effects_kind_key_key UNIQUE (kind, key)",
    ),
    "effects key an index, not a constraint": Case(
        (
            "ALTER TABLE nightcrew.effects DROP CONSTRAINT effects_one_per_key",
            "CREATE UNIQUE INDEX effects_one_per_key ON nightcrew.effects (kind, key)",
        ),
        "unique index effects_one_per_key on nightcrew.effects: expected constraint"
        " effects_one_per_key UNIQUE (kind, key), found effects_one_per_key UNIQUE (kind, key)"
        " (an index, not a constraint: ON CONFLICT ON CONSTRAINT needs one)",
    ),
}

# What a platform may do differently without being wrong.
ACCEPTED: dict[str, tuple[str, ...]] = {
    "overloads beside the exact signatures": (
        "CREATE FUNCTION public.effective_cap(account uuid, resource text, p_now timestamptz)"
        " RETURNS numeric LANGUAGE sql AS $$ SELECT NULL::numeric $$",
        "CREATE FUNCTION public.reap_unconfirmed_users(retention text)"
        f" RETURNS {REAP} LANGUAGE sql AS $$ SELECT 0, 0 $$",
        "CREATE FUNCTION public.notify_media_job_result(job_ids uuid[])"
        " RETURNS void LANGUAGE sql AS $$ SELECT $$",
    ),
    "other argument names": (
        "DROP FUNCTION public.effective_cap(uuid, text)",
        "CREATE FUNCTION public.effective_cap(p_account uuid, p_resource text)"
        " RETURNS numeric LANGUAGE sql AS $$ SELECT NULL::numeric $$",
    ),
    "cap trigger disabled (the reconciler's backfill)": (
        "ALTER TABLE public.episodes DISABLE TRIGGER trigger_enforce_storage_account_cap",
    ),
    "Supabase's varchar(255) email, read as text": (
        "ALTER TABLE auth.users ALTER COLUMN email TYPE varchar(255)",
    ),
    # spec 000 gives no result types: the same family will do
    "effective_cap returns an integer": (
        "DROP FUNCTION public.effective_cap(uuid, text)",
        "CREATE FUNCTION public.effective_cap(account uuid, resource text)"
        " RETURNS integer LANGUAGE sql AS $$ SELECT NULL::integer $$",
    ),
    "effective_cap returns a bigint": (
        "DROP FUNCTION public.effective_cap(uuid, text)",
        "CREATE FUNCTION public.effective_cap(account uuid, resource text)"
        " RETURNS bigint LANGUAGE sql AS $$ SELECT NULL::bigint $$",
    ),
    "effective_cap returns a double": (
        "DROP FUNCTION public.effective_cap(uuid, text)",
        "CREATE FUNCTION public.effective_cap(account uuid, resource text)"
        " RETURNS double precision LANGUAGE sql AS $$ SELECT NULL::double precision $$",
    ),
    "the reaper counts in bigint": (
        "DROP FUNCTION public.reap_unconfirmed_users(interval)",
        "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
        " RETURNS TABLE(deleted bigint, skipped bigint)"
        " LANGUAGE sql AS $$ SELECT 0::bigint, 0::bigint $$",
    ),
    # `SELECT deleted, skipped FROM public.reap_unconfirmed_users(…)` reads either by name
    "the reaper with OUT parameters": (
        "DROP FUNCTION public.reap_unconfirmed_users(interval)",
        "CREATE FUNCTION public.reap_unconfirmed_users(retention interval,"
        " OUT deleted integer, OUT skipped integer) LANGUAGE sql AS $$ SELECT 0, 0 $$",
    ),
    "the reaper returning a row type, columns in another order, one more": (
        "DROP FUNCTION public.reap_unconfirmed_users(interval)",
        "CREATE TYPE public.reap_result AS (skipped integer, deleted smallint, cutoff timestamptz)",
        "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
        " RETURNS SETOF public.reap_result"
        " LANGUAGE sql AS $$ SELECT 0, 0::smallint, now() $$",
    ),
    # numbers are coerced at the boundary
    "counters in other integer types": (
        "ALTER TABLE public.import_items ALTER COLUMN attempts TYPE bigint",
        "ALTER TABLE public.billing_accounts ALTER COLUMN content_overage_nag_stage TYPE integer",
        "ALTER TABLE public.episodes ALTER COLUMN external_link_attempt TYPE smallint",
    ),
    # compared with and set to string literals only, which PostgreSQL casts
    "an enum for a status": (
        "CREATE TYPE public.automation_status AS ENUM ('pending', 'running', 'done', 'canceled')",
        "ALTER TABLE public.automation_jobs DROP CONSTRAINT automation_jobs_status_check",
        "DROP INDEX public.idx_automation_jobs_pending",
        "ALTER TABLE public.automation_jobs ALTER COLUMN status DROP DEFAULT",
        "ALTER TABLE public.automation_jobs ALTER COLUMN status TYPE public.automation_status"
        " USING status::public.automation_status",
        "CREATE INDEX idx_automation_jobs_pending ON public.automation_jobs (episode_id)"
        " WHERE status = 'pending'",
    ),
    "a domain over text": (
        "CREATE DOMAIN public.slug AS text CHECK (VALUE ~ '^[a-z0-9-]+$')",
        "ALTER TABLE public.podcasts ALTER COLUMN slug TYPE public.slug",
    ),
    "extra columns, tables and indexes": (
        "ALTER TABLE public.episodes ADD COLUMN duration_seconds integer",
        "CREATE TABLE public.storage_quotas (account uuid, gb numeric)",
        "CREATE INDEX idx_media_jobs_type ON public.media_jobs (type)",
    ),
}


async def _check_after(db: Database, sql: tuple[str, ...]) -> CheckReport:
    before = await check_schema(db)
    assert before.ok, before.mismatches
    for statement in sql:
        await db.execute(statement)
    return await check_schema(db)


async def test_the_fully_migrated_reference_database_matches_spec_000(db: Database) -> None:
    report = await check_schema(db)
    assert report.ok, report.mismatches
    assert report.mismatches == []
    assert all(not t.advice and not t.notes for t in report.tables)
    assert {t.name for t in report.tables} == set(TABLES)
    assert {f.name: f.found for f in report.functions} == {
        "public.reap_unconfirmed_users": [f"(interval) → {REAP}"],
        "public.effective_cap": ["(uuid, text) → numeric"],
        "public.notify_media_job_result": ["(uuid) → void"],
        "auth.uid": ["() → uuid"],
        "nightcrew.object_key": ["(text, text) → text"],
        "nightcrew.percent_decode": ["(text) → text"],
        "nightcrew.overcap_report_bytes": ["() → TABLE(account_id uuid, bytes numeric)"],
        "nightcrew.escalation_storage_bytes": ["() → TABLE(account_id uuid, bytes numeric)"],
    }


@pytest.mark.parametrize("case", FUNCTION_CASES.values(), ids=FUNCTION_CASES.keys())
async def test_a_function_with_another_signature_is_one_line(db: Database, case: Case) -> None:
    report = await _check_after(db, case.sql)
    assert not report.ok
    assert report.mismatches == [case.line]
    assert report.problems == [case.line]  # the JSON's top-level problems, as before
    assert all(t.ok for t in report.tables)


@pytest.mark.parametrize("case", TABLE_CASES.values(), ids=TABLE_CASES.keys())
async def test_a_table_trigger_or_index_that_differs_is_one_line(db: Database, case: Case) -> None:
    report = await _check_after(db, case.sql)
    assert not report.ok
    assert report.mismatches == [case.line]
    assert all(f.ok for f in report.functions) and report.problems == []


@pytest.mark.parametrize("sql", ACCEPTED.values(), ids=ACCEPTED.keys())
async def test_what_a_platform_may_do_differently_passes(
    db: Database, sql: tuple[str, ...]
) -> None:
    report = await _check_after(db, sql)
    assert report.ok, report.mismatches


async def test_a_unique_index_under_another_name_is_accepted_and_named(db: Database) -> None:
    report = await _check_after(
        db,
        (
            "ALTER INDEX public.idx_media_jobs_one_active RENAME TO media_jobs_active_uq",
            # another spelling of the predicate, the columns in another order
            "DROP INDEX public.idx_podcast_imports_hosting_migration_active",
            "CREATE UNIQUE INDEX podcast_imports_one_migration ON public.podcast_imports"
            " (podcast_id) WHERE is_hosting_migration AND status <> ALL"
            " (ARRAY['completed', 'failed', 'canceled'])",
        ),
    )
    assert report.ok, report.mismatches
    notes = {t.name: t.notes for t in report.tables if t.notes}
    assert notes == {
        "public.media_jobs": [
            "unique index idx_media_jobs_one_active on public.media_jobs: found as"
            f" media_jobs_active_uq UNIQUE (episode_id, type) WHERE {MEDIA_JOBS_ACTIVE}"
        ],
        "public.podcast_imports": [
            "unique index idx_podcast_imports_hosting_migration_active on"
            " public.podcast_imports: found as podcast_imports_one_migration UNIQUE (podcast_id)"
            " WHERE is_hosting_migration AND (status <> ALL"
            " (ARRAY['completed'::text, 'failed'::text, 'canceled'::text]))"
        ],
    }


async def test_the_same_columns_in_another_order_serve_a_unique_index(db: Database) -> None:
    report = await _check_after(
        db,
        (
            "DROP INDEX public.idx_media_jobs_one_active",
            "CREATE UNIQUE INDEX idx_media_jobs_one_active ON public.media_jobs (type, episode_id)"
            " WHERE status IN ('pending', 'running')",
        ),
    )
    assert report.ok, report.mismatches


def _break(url: str, *sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in sql:
            conn.execute(statement)


CLI_CASES = {
    name: FUNCTION_CASES[name]
    for name in (
        "reap takes text",
        "effective_cap takes a time",
        "notify takes a bigint",
        "uid returns text",
    )
}


@pytest.mark.acceptance
@pytest.mark.parametrize("case", CLI_CASES.values(), ids=CLI_CASES.keys())
def test_db_check_on_a_platform_with_one_wrong_signature_exits_1(
    fresh_db_url: str, case: Case
) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    clean = run("db", "check", env=env)
    assert clean.returncode == 0 and clean.stdout.rstrip().endswith("schema ok"), clean.stdout

    _break(fresh_db_url, *case.sql)
    result = run("db", "check", env=env)
    assert result.returncode == 1, result.stderr
    wrong = [line for line in result.stdout.splitlines() if not line.startswith("ok ")]
    assert wrong == [f"WRONG   {case.line}", "schema incomplete"], result.stdout

    as_json = run("db", "check", "--json", env=env)
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["problems"] == [case.line]
    name = case.line.split()[1].rstrip(":")
    assert report["functions"][name]["ok"] is False
    assert report["functions"][name]["problems"] == [case.line]
    assert all(t["ok"] for t in report["tables"].values())


@pytest.mark.acceptance
def test_db_check_names_a_moved_trigger_under_its_table(fresh_db_url: str) -> None:
    _break(fresh_db_url, *TABLE_CASES["cap trigger on another table"].sql)
    result = run("db", "check", env=_env(DATABASE_URL=fresh_db_url))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    at = lines.index("WRONG   public.episodes")
    assert lines[at + 1] == "          - " + TABLE_CASES["cap trigger on another table"].line


# --- the role nightcrew connects as --------------------------------------------------------------

_roles = itertools.count()

# What a service role is given on a platform (Supabase's service_role: every table of the
# schemas it serves, their sequences, EXECUTE by default), nightcrew's schema included.
SERVICE_GRANTS = (
    "GRANT USAGE ON SCHEMA public, auth, nightcrew TO {role}",
    "GRANT ALL ON ALL TABLES IN SCHEMA public, auth, nightcrew TO {role}",
    "GRANT ALL ON ALL SEQUENCES IN SCHEMA public, auth, nightcrew TO {role}",
)


def _as_user(url: str, user: str) -> str:
    """The same server and database, another user (the test server trusts 127.0.0.1)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))


@contextmanager
def _role(url: str, *, bypassrls: bool, grants: tuple[str, ...] = SERVICE_GRANTS) -> Iterator[str]:
    """A LOGIN role, neither superuser nor owner of anything, with ``grants`` on ``url``'s
    database; dropped afterwards (roles are cluster-wide: a unique name, always dropped, what
    it came to own handed back first)."""
    role = f"nightcrew_check_{os.getpid()}_{next(_roles)}"
    attribute = "BYPASSRLS" if bypassrls else "NOBYPASSRLS"
    try:
        _break(url, f"CREATE ROLE {role} LOGIN NOSUPERUSER {attribute}")
        _break(url, *(g.format(role=role) for g in grants))
        yield role
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")


@asynccontextmanager
async def _open_as(url: str, role: str) -> AsyncIterator[Database]:
    database = await Database.open(_as_user(url, role))
    try:
        yield database
    finally:
        await database.close()


@dataclass(frozen=True)
class RoleCase:
    bypassrls: bool
    sql: tuple[str, ...]  # run as the superuser; {role} and {database} are filled in
    line: str  # the one line, likewise


ROLE_CASES: dict[str, RoleCase] = {
    "no EXECUTE on effective_cap (revoked from PUBLIC)": RoleCase(
        True,
        ("REVOKE EXECUTE ON FUNCTION public.effective_cap(uuid, text) FROM PUBLIC",),
        "function public.effective_cap(uuid, text): role {role} lacks the EXECUTE privilege",
    ),
    "no SELECT on podcasts": RoleCase(
        True,
        ("REVOKE SELECT ON public.podcasts FROM {role}",),
        "table public.podcasts: role {role} lacks the SELECT privilege",
    ),
    "no UPDATE nor INSERT on the outbox": RoleCase(
        True,
        ("REVOKE INSERT, UPDATE ON public.feed_invalidation_outbox FROM {role}",),
        "table public.feed_invalidation_outbox: role {role} lacks the INSERT, UPDATE privileges",
    ),
    "row-level security on podcasts, no BYPASSRLS": RoleCase(
        False,
        ("ALTER TABLE public.podcasts ENABLE ROW LEVEL SECURITY",),
        f"table public.podcasts: row-level security hides rows from role {{role}} ({RLS_HINT})",
    ),
    # the owner is subject to it when it is forced
    "row-level security forced on the owner": RoleCase(
        False,
        (
            "ALTER TABLE public.podcasts OWNER TO {role}",
            "ALTER TABLE public.podcasts ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE public.podcasts FORCE ROW LEVEL SECURITY",
        ),
        f"table public.podcasts: row-level security hides rows from role {{role}} ({RLS_HINT})",
    ),
    # a policy that lets only some rows through is still hiding the others
    "a policy that lets some rows through": RoleCase(
        False,
        (
            "ALTER TABLE public.podcasts ENABLE ROW LEVEL SECURITY",
            "CREATE POLICY members ON public.podcasts TO {role} USING (status = 'active')",
        ),
        f"table public.podcasts: row-level security hides rows from role {{role}} ({RLS_HINT})",
    ),
    "no USAGE on schema auth": RoleCase(
        True,
        ("REVOKE USAGE ON SCHEMA auth FROM {role}",),
        "schema auth: role {role} lacks the USAGE privilege",
    ),
    "no temporary tables": RoleCase(
        True,
        ("REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC",),
        "database {database}: role {role} lacks the TEMPORARY privilege"
        " (the reconciler lists the store into temporary tables)",
    ),
}

# What a role may be without being wrong.
ROLE_ACCEPTED: dict[str, RoleCase] = {
    "a service role": RoleCase(True, (), ""),
    "no BYPASSRLS where no table has row-level security": RoleCase(False, (), ""),
    "row-level security, BYPASSRLS": RoleCase(
        True, ("ALTER TABLE public.podcasts ENABLE ROW LEVEL SECURITY",), ""
    ),
    "row-level security, not forced, on the owner": RoleCase(
        False,
        (
            "ALTER TABLE public.podcasts OWNER TO {role}",
            "ALTER TABLE public.podcasts ENABLE ROW LEVEL SECURITY",
        ),
        "",
    ),
    "row-level security with a policy letting every row through": RoleCase(
        False,
        (
            "ALTER TABLE public.podcasts ENABLE ROW LEVEL SECURITY",
            "CREATE POLICY nightcrew_all ON public.podcasts TO {role}"
            " USING (true) WITH CHECK (true)",
        ),
        "",
    ),
}


def _database(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def _check_as(url: str, case: RoleCase) -> tuple[str, CheckReport]:
    """Run ``case.sql``, then db check as a fresh role; (the line expected, the report)."""
    with _role(url, bypassrls=case.bypassrls) as role:
        names = {"role": role, "database": _database(url)}
        _break(url, *(statement.format(**names) for statement in case.sql))
        async with _open_as(url, role) as db:
            report = await check_schema(db)
        return case.line.format(**names), report


@pytest.mark.parametrize("case", ROLE_CASES.values(), ids=ROLE_CASES.keys())
async def test_what_the_role_may_not_do_is_one_line_naming_it(
    fresh_db_url: str, case: RoleCase
) -> None:
    line, report = await _check_as(fresh_db_url, case)
    assert not report.ok
    assert report.mismatches == [line]
    assert not report.role.superuser and report.role.bypassrls is case.bypassrls


@pytest.mark.parametrize("case", ROLE_ACCEPTED.values(), ids=ROLE_ACCEPTED.keys())
async def test_what_a_role_may_be_passes(fresh_db_url: str, case: RoleCase) -> None:
    _, report = await _check_as(fresh_db_url, case)
    assert report.ok, report.mismatches
    # not the owner of episodes: the reconciler's cap bypass will fall back, and says so
    episodes = next(t for t in report.tables if t.name == "public.episodes")
    assert [a.split(":")[0] for a in episodes.advice] == [
        "trigger trigger_enforce_storage_account_cap"
    ]


async def test_a_role_without_grants_sees_every_table_and_what_it_lacks(
    fresh_db_url: str,
) -> None:
    """information_schema lists only what the role may use; the catalog lists everything: no
    table is "missing", every one says which privileges the role lacks."""
    with _role(fresh_db_url, bypassrls=True, grants=()) as role:
        async with _open_as(fresh_db_url, role) as db:
            report = await check_schema(db)
    assert not report.ok
    assert not any(t.missing for t in report.tables)
    assert all(not t.problems for t in report.tables)  # the shapes are all right
    by_name = {t.name: t for t in report.tables}
    assert by_name["public.podcasts"].privileges == [
        f"table public.podcasts: role {role} lacks the SELECT, UPDATE, DELETE privileges"
    ]
    assert by_name["auth.users"].privileges == [
        f"table auth.users: role {role} lacks the SELECT privilege"
    ]
    assert report.role.problems == [
        f"schema auth: role {role} lacks the USAGE privilege",
        f"schema nightcrew: role {role} lacks the USAGE privilege",
        f"table nightcrew.schema_migrations: role {role} lacks the SELECT privilege"
        " (which migrations are applied cannot be told)",
    ]


@pytest.mark.acceptance
def test_db_check_as_a_role_names_what_it_may_not_do(fresh_db_url: str) -> None:
    with _role(fresh_db_url, bypassrls=False) as role:
        env = _env(DATABASE_URL=_as_user(fresh_db_url, role))
        clean = run("db", "check", env=env)
        assert clean.returncode == 0 and clean.stdout.rstrip().endswith("schema ok"), clean.stdout

        _break(
            fresh_db_url,
            "REVOKE EXECUTE ON FUNCTION public.effective_cap(uuid, text) FROM PUBLIC",
            f"REVOKE SELECT ON public.podcasts FROM {role}",
            "ALTER TABLE public.billing_accounts ENABLE ROW LEVEL SECURITY",
        )
        result = run("db", "check", env=env)
        as_json = run("db", "check", "--json", env=env)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("DENIED  public.billing_accounts")
    assert lines[at + 1] == (
        f"          - table public.billing_accounts: row-level security hides rows from role"
        f" {role} ({RLS_HINT})"
    )
    at = lines.index("DENIED  public.podcasts")
    assert (
        lines[at + 1]
        == f"          - table public.podcasts: role {role} lacks the SELECT privilege"
    )
    assert (
        f"DENIED  function public.effective_cap(uuid, text): role {role} lacks the EXECUTE"
        " privilege"
    ) in lines
    assert lines[-1] == "schema incomplete"

    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["role"]["name"] == role
    assert report["role"]["bypassrls"] is False
    assert report["tables"]["public.podcasts"]["privileges"] == [
        f"table public.podcasts: role {role} lacks the SELECT privilege"
    ]
    assert report["functions"]["public.effective_cap"]["privileges"] == [
        f"function public.effective_cap(uuid, text): role {role} lacks the EXECUTE privilege"
    ]


# --- the contract against nightcrew's own SQL -----------------------------------------------------

_SRC = Path(nightcrew.__file__).parent
_PLATFORM_NAME = re.compile(r"\b(public|auth)\.([a-z_][a-z0-9_]*)\b(\s*\()?", re.IGNORECASE)


def _queries() -> dict[str, str]:
    """nightcrew's own SQL: not the migrations, nor the demo's seeding of its sample platform
    (``demo/seed.sql`` writes rows nightcrew itself never writes, into its own database)."""
    return {
        str(path.relative_to(_SRC)): path.read_text()
        for path in sorted(_SRC.rglob("*.sql"))
        if "migrations" not in path.parts and "demo" not in path.parts
    }


def test_every_platform_table_nightcrews_sql_names_is_in_the_contract() -> None:
    named: set[str] = set()
    for text in _queries().values():
        sql = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        for schema, name, call in _PLATFORM_NAME.findall(sql):
            if not call:  # a function call is checked as a function
                named.add(f"{schema}.{name}")
    platform = {t for t in TABLES if not t.startswith("nightcrew.")}
    assert named, "no platform table found: the pattern is wrong"
    assert named <= platform, named - platform


def test_nothing_of_the_reference_caps_implementation_is_in_the_contract() -> None:
    """plan_limits, cap_overrides and credit_pools are how the reference schema implements
    effective_cap(); spec 000 never names them and nightcrew's SQL never reads them."""
    for table in ("public.plan_limits", "public.cap_overrides", "public.credit_pools"):
        assert table not in TABLES
        for path, text in _queries().items():
            assert table.split(".")[1] not in text, path
    assert "plan" not in TABLES["public.billing_accounts"]


_WRITE = re.compile(
    r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+((?:public|auth|nightcrew)\.[a-z_]+)", re.IGNORECASE
)


def test_the_write_privileges_checked_are_the_ones_nightcrews_sql_needs() -> None:
    """Every INSERT, UPDATE and DELETE on a contract table under src/nightcrew (and the UPDATE an
    INSERT … ON CONFLICT DO UPDATE needs), but for the demo's seeding (``demo/``)."""
    derived: dict[str, set[str]] = {}
    for path in sorted([*_SRC.rglob("*.sql"), *_SRC.rglob("*.py")]):
        if "migrations" in path.parts or "demo" in path.parts or path.name == "contract.py":
            continue
        text = path.read_text()
        if path.suffix == ".sql":
            text = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        for match in _WRITE.finditer(text):
            verb, table = match[1].split()[0].upper(), match[2].lower()
            if table not in TABLES:
                continue
            derived.setdefault(table, set()).add(verb)
            statement = text[match.end() : match.end() + 600].split(";", 1)[0]
            if verb == "INSERT" and re.search(r"DO\s+UPDATE", statement, re.IGNORECASE):
                derived[table].add("UPDATE")
    assert derived == {table: set(verbs) for table, verbs in WRITES.items()}
