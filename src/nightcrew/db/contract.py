"""What nightcrew needs from a platform database, and a check that reports what is missing.

``db migrate`` creates all of this as the reference schema; against production, where the
platform owns its schema, ``db check`` compares the live catalog with this contract, table by
table. A test keeps the contract and the reference migration in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nightcrew.db.database import Database
from nightcrew.db.migrate import applied_migrations, discover_migrations

TS = "timestamp with time zone"

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
        "plan": "text",
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
        "is_active": "boolean",
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
    "public.podcast_members": {"podcast_id": "uuid", "user_id": "uuid", "role": "text"},
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
        "external_link_last_attempt_at": TS,
        "created_at": TS,
        "updated_at": TS,
    },
    "public.automation_jobs": {
        "id": "uuid",
        "episode_id": "uuid",
        "trigger_type": "text",
        "status": "text",
        "run_at": TS,
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
    "public.plan_limits": {"plan": "text", "resource": "text", "limit_value": "numeric"},
    "public.cap_overrides": {
        "billing_account_id": "uuid",
        "resource": "text",
        "limit_value": "numeric",
        "expires_at": TS,
    },
    "public.credit_pools": {
        "billing_account_id": "uuid",
        "resource": "text",
        "amount": "numeric",
        "expires_at": TS,
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
        "objects_left": "integer",
        "invalidated_at": TS,
        "attempts": "integer",
        "last_error": "text",
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
        "last_error": "text",
        "delivered_at": TS,
        "dead_at": TS,
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
    },
}

FUNCTIONS: dict[str, str] = {
    "auth.uid": "reads request.jwt.claim.sub; NULL for the service role",
    "public.effective_cap": "live cap per account and resource (NULL = unlimited)",
    "public.account_caps": "every account's live caps, set-based (the overage scan)",
    "public.reap_unconfirmed_users": "the signup reaper",
    "public.notify_media_job_result": "the media_jobs watchdog's notification",
    "nightcrew.object_key": "object keys from public URLs (reconciler)",
    "nightcrew.percent_decode": "URL path decoding for nightcrew.object_key",
    "nightcrew.account_stored_bytes": "count-both stored bytes per account (overage, over-cap)",
    "nightcrew.account_stored_bytes_of": "the same, for one account (overage re-measure)",
}

# (table, trigger name) — the reconciler disables this one by name.
TRIGGERS: list[tuple[str, str]] = [("public.episodes", "trigger_enforce_storage_account_cap")]

# Unique indexes whose semantics the jobs rely on.
REQUIRED_INDEXES: dict[str, str] = {
    "effects_one_per_key": "nightcrew.effects",
    "idx_podcast_imports_hosting_migration_active": "public.podcast_imports",
    "idx_media_jobs_one_active": "public.media_jobs",
}

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

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckReport:
    tables: list[TableCheck]
    problems: list[str]
    pending_migrations: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and all(t.ok for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tables": {
                t.name: {"ok": t.ok, "problems": t.problems, "advice": t.advice}
                for t in self.tables
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

    indexes = await db.fetch(
        "SELECT schemaname || '.' || tablename AS tbl, indexname FROM pg_indexes"
        " WHERE indexname = ANY(%(names)s)",
        {"names": [*REQUIRED_INDEXES, *RECOMMENDED_INDEXES]},
    )
    live_indexes = {row["indexname"]: row["tbl"] for row in indexes}

    triggers = await db.fetch(
        "SELECT c.oid::regclass::text AS tbl, t.tgname FROM pg_trigger t"
        " JOIN pg_class c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal"
    )
    live_triggers = {(_qualify(row["tbl"]), row["tgname"]) for row in triggers}

    reports = [
        _check_table(table, wanted, live.get(table), live_indexes, live_triggers)
        for table, wanted in TABLES.items()
    ]

    problems: list[str] = []
    functions = await db.fetch(
        "SELECT n.nspname || '.' || p.proname AS fn FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname || '.' || p.proname = ANY(%(names)s)",
        {"names": list(FUNCTIONS)},
    )
    have_functions = {row["fn"] for row in functions}
    for fn, purpose in FUNCTIONS.items():
        if fn not in have_functions:
            problems.append(f"missing function {fn}() — {purpose}")

    applied = await applied_migrations(db)
    pending = [
        m.label
        for m in discover_migrations()
        if m.scope == "nightcrew" and m.version not in applied
    ]
    if pending:
        problems.append("nightcrew migrations not applied: " + ", ".join(pending))
    return CheckReport(tables=reports, problems=problems, pending_migrations=pending)


def _check_table(
    table: str,
    wanted: dict[str, str],
    have: dict[str, str] | None,
    live_indexes: dict[str, str],
    live_triggers: set[tuple[str, str]],
) -> TableCheck:
    problems: list[str] = []
    advice: list[str] = []
    if have is None:
        problems.append("table is missing")
    else:
        for column, data_type in wanted.items():
            if column not in have:
                problems.append(f"missing column {column} ({data_type})")
            elif have[column] != data_type:
                problems.append(f"column {column} is {have[column]}, expected {data_type}")
    for index, owner in REQUIRED_INDEXES.items():
        if owner == table and index not in live_indexes:
            problems.append(f"missing unique index {index}")
    for index, owner in RECOMMENDED_INDEXES.items():
        if owner == table and index not in live_indexes:
            advice.append(f"index {index} is missing: its sweep will scan the table")
    for owner, trigger in TRIGGERS:
        if owner == table and (owner, trigger) not in live_triggers:
            problems.append(f"missing trigger {trigger}")
    return TableCheck(name=table, problems=problems, advice=advice)


def _qualify(regclass_text: str) -> str:
    return regclass_text if "." in regclass_text else f"public.{regclass_text}"
