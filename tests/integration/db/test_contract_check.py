"""`db check` checks the contract, not names (issue 22).

A platform whose functions, triggers, column types and unique indexes are spec 000's passes; a
platform with one thing different fails with exactly one line naming that thing, what was
expected and what was found. Each case starts from the fully migrated reference database (which
matches spec 000 exactly, the first test says so) and breaks one thing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

import nightcrew
from nightcrew.db.contract import TABLES, CheckReport, check_schema
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
    "reap counts in bigint": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
            " RETURNS TABLE(deleted bigint, skipped bigint)"
            " LANGUAGE sql AS $$ SELECT 0::bigint, 0::bigint $$",
        ),
        "function public.reap_unconfirmed_users: expected (interval) → "
        f"{REAP}, found (interval) → TABLE(deleted bigint, skipped bigint)",
    ),
    "reap returns one integer": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
            " RETURNS integer LANGUAGE sql AS $$ SELECT 0 $$",
        ),
        f"function public.reap_unconfirmed_users: expected (interval) → {REAP},"
        " found (interval) → integer",
    ),
    "reap names its columns otherwise": Case(
        _replace(
            "public.reap_unconfirmed_users(interval)",
            "CREATE FUNCTION public.reap_unconfirmed_users(retention interval)"
            " RETURNS TABLE(removed integer, kept integer) LANGUAGE sql AS $$ SELECT 0, 0 $$",
        ),
        f"function public.reap_unconfirmed_users: expected (interval) → {REAP},"
        " found (interval) → TABLE(removed integer, kept integer)",
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
    "effective_cap returns an integer": Case(
        _replace(
            "public.effective_cap(uuid, text)",
            "CREATE FUNCTION public.effective_cap(account uuid, resource text)"
            " RETURNS integer LANGUAGE sql AS $$ SELECT NULL::integer $$",
        ),
        "function public.effective_cap: expected (uuid, text) → numeric,"
        " found (uuid, text) → integer",
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
        "function public.notify_media_job_result: expected (uuid) → void, found (uuid) → boolean",
    ),
    # auth.uid() → uuid
    "uid returns text": Case(
        _replace(
            "auth.uid()",
            "CREATE FUNCTION auth.uid() RETURNS text LANGUAGE sql AS $$ SELECT NULL::text $$",
        ),
        "function auth.uid: expected () → uuid, found () → text",
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
    "escalation bytes in bigint": Case(
        _replace(
            "nightcrew.escalation_storage_bytes()",
            "CREATE FUNCTION nightcrew.escalation_storage_bytes()"
            " RETURNS TABLE(account_id uuid, bytes bigint)"
            " LANGUAGE sql AS $$ SELECT NULL::uuid, 0::bigint $$",
        ),
        "function nightcrew.escalation_storage_bytes:"
        " expected () → TABLE(account_id uuid, bytes numeric),"
        " found () → TABLE(account_id uuid, bytes bigint)" + NOT_APPLIED,
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
    "attempts column is a bigint": Case(
        ("ALTER TABLE public.import_items ALTER COLUMN attempts TYPE bigint",),
        "column public.import_items.attempts: expected integer, found bigint",
    ),
    "overage clock without a time zone": Case(
        (
            "ALTER TABLE public.billing_accounts"
            " ALTER COLUMN content_overage_since TYPE timestamp without time zone",
        ),
        "column public.billing_accounts.content_overage_since:"
        f" expected {TZ}, found timestamp without time zone",
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


# --- the contract against nightcrew's own SQL -----------------------------------------------------

_SRC = Path(nightcrew.__file__).parent
_PLATFORM_NAME = re.compile(r"\b(public|auth)\.([a-z_][a-z0-9_]*)\b(\s*\()?", re.IGNORECASE)


def _queries() -> dict[str, str]:
    return {
        str(path.relative_to(_SRC)): path.read_text()
        for path in sorted(_SRC.rglob("*.sql"))
        if "migrations" not in path.parts
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
