"""What nightcrew needs from a platform database, and a check that names every mismatch.

``db migrate`` creates all of this as the reference schema; against production, where the
platform owns its schema, ``db check`` compares the live catalog with this contract: the column
types of every table nightcrew reads or writes, the argument and result types of every function
it calls (spec 000's signatures for the platform's, the migrations' for nightcrew's own), each
trigger on its table, and the unique indexes the jobs rely on. Each mismatch is one line naming
the object, what was expected and what was found. Tests keep the contract, the reference
migrations and nightcrew's SQL in step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nightcrew.db.database import Database
from nightcrew.db.migrate import applied_migrations, discover_migrations

TS = "timestamp with time zone"

# Every column nightcrew's SQL reads or writes (its queries beside the jobs, the dashboard's, and
# the bodies of its functions in schema nightcrew), as information_schema's data_type. Nothing
# of how a platform implements its caps: spec 000 names only effective_cap(), and the reference
# schema's plan_limits / cap_overrides / credit_pools / billing_accounts.plan are one way to
# write it, not the contract. auth.users keeps the columns the reaper's population is defined by.
TABLES: dict[str, dict[str, str]] = {
    "auth.users": {
        "id": "uuid",
        "email": "text",
        "email_confirmed_at": TS,
        "invited_at": TS,
        "created_at": TS,
    },
    "public.billing_accounts": {
        "id": "uuid",
        "owner_user_id": "uuid",
        "billing_model": "text",
        "stripe_customer_id": "text",
        "stripe_subscription_id": "text",
        "content_overage_since": TS,
        "content_overage_deadline": TS,
        "content_overage_nag_stage": "smallint",
        "content_overage_last_nag_at": TS,
        "created_at": TS,
    },
    "public.user_profiles": {"id": "uuid", "email": "text", "billing_account_id": "uuid"},
    "public.podcasts": {
        "id": "uuid",
        "billing_account_id": "uuid",
        "slug": "text",
        "title": "text",
        "status": "text",
        "hosting_type": "text",
        "paused_at": TS,
        "pause_expires_at": TS,
        "last_pause_ended_at": TS,
        "deletion_scheduled_at": TS,
        "deletion_redirect_url": "text",
        "overage_suspended_at": TS,
        "created_at": TS,
        "updated_at": TS,
    },
    "public.podcast_members": {
        "podcast_id": "uuid",
        "user_id": "uuid",
        "role": "text",
        "created_at": TS,
    },
    "public.episodes": {
        "id": "uuid",
        "podcast_id": "uuid",
        "title": "text",
        "status": "text",
        "audio_url": "text",
        "audio_file_size_bytes": "bigint",
        "original_audio_url": "text",
        "original_audio_file_size_bytes": "bigint",
        "cover_image_url": "text",
        "published_at": TS,
        "scheduled_for": TS,
        "external_link_status": "text",
        "external_link_attempt": "integer",
        "external_link_next_attempt_at": TS,
        "created_at": TS,
        "updated_at": TS,
    },
    "public.automation_jobs": {
        "id": "uuid",
        "episode_id": "uuid",
        "trigger_type": "text",
        "status": "text",
        "updated_at": TS,
    },
    "public.feed_invalidation_outbox": {
        "id": "uuid",
        "podcast_id": "uuid",
        "reason": "text",
        "created_at": TS,
        "delivered_at": TS,
        "attempts": "integer",
        "last_error": "text",
    },
    "public.podcast_imports": {
        "id": "uuid",
        "podcast_id": "uuid",
        "status": "text",
        "is_hosting_migration": "boolean",
        "started_at": TS,
        "dispatch_end_at": TS,
        "created_at": TS,
        "updated_at": TS,
    },
    "public.import_items": {
        "id": "uuid",
        "import_id": "uuid",
        "status": "text",
        "attempts": "integer",
        "created_at": TS,
        "updated_at": TS,
    },
    "public.media_jobs": {
        "id": "uuid",
        "episode_id": "uuid",
        "type": "text",
        "status": "text",
        "error": "text",
        "created_at": TS,
        "updated_at": TS,
    },
    "nightcrew.queue_messages": {
        "id": "bigint",
        "queue": "text",
        "body": "jsonb",
        "visible_at": TS,
        "created_at": TS,
    },
    "nightcrew.podcast_deletions": {
        "podcast_id": "uuid",
        "slug": "text",
        "deleted_at": TS,
        "storage_cleaned_at": TS,
        "objects_deleted": "bigint",
        "bytes_deleted": "bigint",
        "objects_left": "integer",
        "invalidated_at": TS,
        "attempts": "integer",
        "last_error": "text",
        "updated_at": TS,
        "in_flight": "jsonb",
        "invalidation_effect_id": "bigint",
    },
    "nightcrew.effects": {
        "id": "bigint",
        "kind": "text",
        "key": "text",
        "payload": "jsonb",
        "created_at": TS,
        "next_attempt_at": TS,
        "expires_at": TS,
        "attempts": "integer",
        "last_attempt_at": TS,
        "claimed_until": TS,
        "last_error": "text",
        "delivered_at": TS,
        "dead_at": TS,
        "dead_reason": "text",
    },
    "nightcrew.leases": {"name": "text", "token": "text", "fence": "bigint", "expires_at": TS},
    "nightcrew.runs": {
        "id": "bigint",
        "lane": "text",
        "trigger": "text",
        "slot": TS,
        "started_at": TS,
        "finished_at": TS,
        "status": "text",
        "report": "jsonb",
        "heartbeat_at": TS,
        "attempts": "integer",
    },
}


@dataclass(frozen=True, kw_only=True, slots=True)
class FunctionSpec:
    """A function nightcrew calls: argument types in order and the result as PostgreSQL prints
    it (``pg_get_function_result``), column names included for a ``TABLE(…)`` result."""

    name: str  # schema-qualified
    args: tuple[str, ...]
    result: str
    purpose: str
    nightcrew: bool = False  # created by nightcrew's migrations (not the platform's)

    @property
    def signature(self) -> str:
        return _signature(self.args, self.result)


FUNCTIONS: tuple[FunctionSpec, ...] = (
    # The platform's, with spec 000's signatures.
    FunctionSpec(
        name="public.reap_unconfirmed_users",
        args=("interval",),
        result="TABLE(deleted integer, skipped integer)",
        purpose="the signup reaper (nightcrew reads deleted and skipped)",
    ),
    FunctionSpec(
        name="public.effective_cap",
        args=("uuid", "text"),
        result="numeric",
        purpose="the live cap of an account for a resource (NULL = unlimited)",
    ),
    FunctionSpec(
        name="public.notify_media_job_result",
        args=("uuid",),
        result="void",
        purpose="the media_jobs watchdog's notification",
    ),
    FunctionSpec(
        name="auth.uid",
        args=(),
        result="uuid",
        purpose="the caller's user id; NULL for the service role nightcrew runs as",
    ),
    # nightcrew's own (schema nightcrew): a mismatch means its migrations are not applied.
    FunctionSpec(
        name="nightcrew.object_key",
        args=("text", "text"),
        result="text",
        purpose="object keys from public URLs (reconciler)",
        nightcrew=True,
    ),
    FunctionSpec(
        name="nightcrew.percent_decode",
        args=("text",),
        result="text",
        purpose="URL path decoding for nightcrew.object_key",
        nightcrew=True,
    ),
    FunctionSpec(
        name="nightcrew.overcap_report_bytes",
        args=(),
        result="TABLE(account_id uuid, bytes numeric)",
        purpose="the over-cap report's stored bytes per account (audio + original)",
        nightcrew=True,
    ),
    FunctionSpec(
        name="nightcrew.escalation_storage_bytes",
        args=(),
        result="TABLE(account_id uuid, bytes numeric)",
        purpose="the overage escalation's storage per account (audio, non-pending_deletion)",
        nightcrew=True,
    ),
)

# (table, trigger name): the reconciler disables and re-enables this one by name, so it must
# exist on that table. Whether it is enabled is not checked (the reconciler may have it off
# for a moment).
TRIGGERS: list[tuple[str, str]] = [("public.episodes", "trigger_enforce_storage_account_cap")]


@dataclass(frozen=True, kw_only=True, slots=True)
class UniqueIndex:
    """A unique index whose semantics the jobs rely on. A platform may name it differently:
    any unique index on the table over the same columns (partial when this one is) will do,
    unless nightcrew's SQL names it (``ON CONFLICT ON CONSTRAINT``)."""

    name: str
    table: str
    columns: tuple[str, ...]
    where: str | None = None  # the reference predicate; None = not a partial index
    name_fixed: bool = False

    @property
    def expected(self) -> str:
        shape = f"UNIQUE ({', '.join(self.columns)})"
        if self.where is not None:
            shape += f" WHERE {self.where}"
        return f"constraint {self.name} {shape}" if self.name_fixed else shape


REQUIRED_INDEXES: tuple[UniqueIndex, ...] = (
    UniqueIndex(
        name="effects_one_per_key",
        table="nightcrew.effects",
        columns=("kind", "key"),
        name_fixed=True,
    ),
    UniqueIndex(
        name="runs_one_per_slot",
        table="nightcrew.runs",
        columns=("lane", "slot"),
        name_fixed=True,
    ),
    UniqueIndex(
        name="idx_podcast_imports_hosting_migration_active",
        table="public.podcast_imports",
        columns=("podcast_id",),
        where="is_hosting_migration AND status IN ('preview', 'running')",
    ),
    UniqueIndex(
        name="idx_media_jobs_one_active",
        table="public.media_jobs",
        columns=("episode_id", "type"),
        where="status IN ('pending', 'running')",
    ),
)

# Without these the sweeps still work but scan whole tables every tick.
RECOMMENDED_INDEXES: dict[str, str] = {
    "idx_effects_due": "nightcrew.effects",
    "idx_feed_invalidation_outbox_pending": "public.feed_invalidation_outbox",
    "idx_import_items_active": "public.import_items",
    "idx_podcast_imports_running": "public.podcast_imports",
    "idx_podcast_imports_stuck_preview": "public.podcast_imports",
    "idx_episodes_external_link_pending": "public.episodes",
    "idx_media_jobs_active_updated": "public.media_jobs",
    "idx_podcasts_pause_expiry": "public.podcasts",
    "idx_podcasts_deletion_due": "public.podcasts",
    "idx_auth_users_unconfirmed": "auth.users",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class TableCheck:
    name: str
    problems: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    # what was accepted although it differs from the reference (an index under another name)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def missing(self) -> bool:
        return self.problems == [f"table {self.name}: missing"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FunctionCheck:
    name: str
    expected: str  # "(uuid, text) → numeric"
    found: list[str]  # every signature of that name, as "(…) → …"
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def missing(self) -> bool:
        return not self.found


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckReport:
    tables: list[TableCheck]
    functions: list[FunctionCheck]
    # what belongs to no table: the functions' mismatches, then unapplied migrations
    problems: list[str]
    pending_migrations: list[str]

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and all(t.ok for t in self.tables)
            and all(f.ok for f in self.functions)
        )

    @property
    def mismatches(self) -> list[str]:
        """Every mismatch, one line each."""
        lines = [p for t in self.tables for p in t.problems]
        return lines + self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tables": {
                t.name: {
                    "ok": t.ok,
                    "missing": t.missing,
                    "problems": t.problems,
                    "advice": t.advice,
                    "notes": t.notes,
                }
                for t in self.tables
            },
            "functions": {
                f.name: {
                    "ok": f.ok,
                    "missing": f.missing,
                    "expected": f.expected,
                    "found": f.found,
                    "problems": f.problems,
                }
                for f in self.functions
            },
            "problems": self.problems,
            "pending_migrations": self.pending_migrations,
        }


async def check_schema(db: Database) -> CheckReport:
    columns = await db.fetch(
        "SELECT table_schema || '.' || table_name AS tbl, column_name, data_type"
        " FROM information_schema.columns"
        " WHERE table_schema || '.' || table_name = ANY(%(tables)s)",
        {"tables": list(TABLES)},
    )
    live: dict[str, dict[str, str]] = {}
    for row in columns:
        live.setdefault(row["tbl"], {})[row["column_name"]] = row["data_type"]

    indexes = [
        LiveIndex(
            name=row["name"],
            table=row["tbl"],
            columns=tuple(row["columns"]),
            unique=row["is_unique"],
            predicate=row["predicate"],
            constraint=row["is_constraint"],
        )
        for row in await db.fetch(_INDEXES_SQL, {"tables": list(TABLES)})
    ]

    triggers = await db.fetch(
        "SELECT t.tgname, n.nspname || '.' || c.relname AS tbl FROM pg_trigger t"
        " JOIN pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE NOT t.tgisinternal AND t.tgname = ANY(%(names)s)"
        " ORDER BY 2",
        {"names": [name for _, name in TRIGGERS]},
    )
    live_triggers: dict[str, list[str]] = {}
    for row in triggers:
        live_triggers.setdefault(row["tgname"], []).append(row["tbl"])

    reports = [
        _check_table(table, wanted, live.get(table), indexes, live_triggers)
        for table, wanted in TABLES.items()
    ]

    rows = await db.fetch(_FUNCTIONS_SQL, {"names": [fn.name for fn in FUNCTIONS]})
    overloads: dict[str, list[LiveFunction]] = {}
    for row in rows:
        overloads.setdefault(row["fn"], []).append(
            LiveFunction(args=tuple(row["args"]), result=row["result"], defaults=row["defaults"])
        )
    functions = [_check_function(spec, overloads.get(spec.name, [])) for spec in FUNCTIONS]
    problems = [p for f in functions for p in f.problems]

    applied = await applied_migrations(db)
    pending = [
        m.label
        for m in discover_migrations()
        if m.scope == "nightcrew" and m.version not in applied
    ]
    if pending:
        problems.append("nightcrew migrations not applied: " + ", ".join(pending))
    return CheckReport(
        tables=reports, functions=functions, problems=problems, pending_migrations=pending
    )


# --- functions -----------------------------------------------------------------------------------

# Every function of a contract name: its input argument types in order (proargtypes: OUT and
# TABLE columns excluded), its result as PostgreSQL prints it, and how many trailing arguments
# have defaults (which lets a shorter call reach it).
_FUNCTIONS_SQL = """
SELECT n.nspname || '.' || p.proname AS fn,
       ARRAY(SELECT format_type(a.oid, NULL)
               FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a (oid, i)
              ORDER BY a.i) AS args,
       pg_get_function_result(p.oid) AS result,
       p.pronargdefaults AS defaults
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.prokind = 'f'
   AND n.nspname || '.' || p.proname = ANY(%(names)s)
 ORDER BY 1, p.pronargs, p.oid
"""


@dataclass(frozen=True, slots=True)
class LiveFunction:
    args: tuple[str, ...]
    result: str
    defaults: int

    @property
    def signature(self) -> str:
        return _signature(self.args, self.result)

    def reachable_with(self, args: tuple[str, ...]) -> bool:
        """Would a call with exactly these argument types also resolve to this function (the
        missing trailing arguments taking their defaults)?"""
        n = len(args)
        return len(self.args) > n and self.args[:n] == args and len(self.args) - self.defaults <= n


def _signature(args: Iterable[str], result: str) -> str:
    return f"({', '.join(args)}) → {result}"


def _check_function(spec: FunctionSpec, found: list[LiveFunction]) -> FunctionCheck:
    problems: list[str] = []
    exact = [f for f in found if f.args == spec.args]
    hint = " (nightcrew's migrations are not applied: run `nightcrew db migrate`)"
    after = hint if spec.nightcrew else ""
    if not found:
        problems.append(
            f"function {spec.name}({', '.join(spec.args)}): missing — {spec.purpose}{after}"
        )
    elif not exact:
        others = "; ".join(f.signature for f in found)
        problems.append(f"function {spec.name}: expected {spec.signature}, found {others}{after}")
    elif exact[0].result != spec.result:
        problems.append(
            f"function {spec.name}: expected {spec.signature}, found {exact[0].signature}{after}"
        )
    else:
        # An overload whose extra arguments all have defaults makes the spec's call ambiguous
        # ("function … is not unique").
        shadows = [f for f in found if f.reachable_with(spec.args)]
        if shadows:
            others = "; ".join(f"{f.signature} with defaults" for f in shadows)
            problems.append(
                f"function {spec.name}: expected {spec.signature} alone, found also {others},"
                f" which makes a call with ({', '.join(spec.args)}) ambiguous"
            )
    return FunctionCheck(
        name=spec.name,
        expected=spec.signature,
        found=[f.signature for f in found],
        problems=problems,
    )


# --- tables, triggers, indexes -------------------------------------------------------------------

# Every index on a contract table: its key columns (or expressions) in order, whether it is
# unique, its predicate (partial index), and whether a constraint owns it.
_INDEXES_SQL = """
SELECT c.relname AS name, n.nspname || '.' || t.relname AS tbl,
       ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true)
               FROM generate_series(1, i.indnkeyatts) AS k
              ORDER BY k) AS columns,
       i.indisunique AS is_unique,
       pg_get_expr(i.indpred, i.indrelid, true) AS predicate,
       EXISTS (SELECT 1 FROM pg_constraint k
                WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid
                  AND k.contype IN ('u', 'p')) AS is_constraint
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_class t ON t.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
 WHERE n.nspname || '.' || t.relname = ANY(%(tables)s)
 ORDER BY 2, 1
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveIndex:
    name: str
    table: str
    columns: tuple[str, ...]
    unique: bool
    predicate: str | None
    constraint: bool

    def describe(self) -> str:
        shape = f"{self.name} {'UNIQUE ' if self.unique else ''}({', '.join(self.columns)})"
        if self.predicate is not None:
            shape += f" WHERE {self.predicate}"
        return shape if self.unique else f"{shape} (not unique)"

    def serves(self, wanted: UniqueIndex) -> bool:
        """Unique over the same columns (in any order), partial exactly when the reference is."""
        return (
            self.unique
            and len(self.columns) == len(wanted.columns)
            and set(self.columns) == set(wanted.columns)
            and (self.predicate is None) == (wanted.where is None)
            and (self.constraint or not wanted.name_fixed)
        )


def _check_table(
    table: str,
    wanted: dict[str, str],
    have: dict[str, str] | None,
    indexes: list[LiveIndex],
    live_triggers: dict[str, list[str]],
) -> TableCheck:
    if have is None:
        # One line: its columns, trigger and indexes are missing with it.
        return TableCheck(name=table, problems=[f"table {table}: missing"])
    problems: list[str] = []
    advice: list[str] = []
    notes: list[str] = []
    for column, data_type in wanted.items():
        if column not in have:
            problems.append(f"column {table}.{column}: missing, expected {data_type}")
        elif have[column] == "character varying" and data_type == "text":
            # Supabase's auth.users.email is varchar(255): read as text, it is the same value.
            notes.append(f"column {table}.{column}: character varying, accepted as text")
        elif have[column] != data_type:
            problems.append(f"column {table}.{column}: expected {data_type}, found {have[column]}")
    for owner, trigger in TRIGGERS:
        if owner != table:
            continue
        on = live_triggers.get(trigger, [])
        if table in on:
            continue
        if on:
            problems.append(f"trigger {trigger}: expected on {table}, found on {', '.join(on)}")
        else:
            problems.append(f"trigger {trigger} on {table}: missing")
    own = [i for i in indexes if i.table == table]
    for unique in REQUIRED_INDEXES:
        if unique.table != table:
            continue
        problem, note = _check_unique(unique, own)
        if problem:
            problems.append(problem)
        if note:
            notes.append(note)
    names = {i.name for i in own}
    for index, owner in RECOMMENDED_INDEXES.items():
        if owner == table and index not in names:
            advice.append(f"index {index} is missing: its sweep will scan the table")
    return TableCheck(name=table, problems=problems, advice=advice, notes=notes)


def _check_unique(wanted: UniqueIndex, live: list[LiveIndex]) -> tuple[str | None, str | None]:
    """(problem, note): a problem when no index on the table serves, a note when one under
    another name does."""
    named = next((i for i in live if i.name == wanted.name), None)
    if named is not None and named.serves(wanted):
        return None, None
    what = f"unique index {wanted.name} on {wanted.table}"
    if not wanted.name_fixed:
        serving = next((i for i in live if i.serves(wanted)), None)
        if serving is not None:
            return None, f"{what}: found as {serving.describe()}"
    if named is not None:
        found = named.describe()
        if wanted.name_fixed and not named.constraint:
            found += " (an index, not a constraint: ON CONFLICT ON CONSTRAINT needs one)"
    else:
        similar = [i for i in live if set(i.columns) == set(wanted.columns)]
        found = "; ".join(i.describe() for i in similar) if similar else "none"
    return f"{what}: expected {wanted.expected}, found {found}", None
