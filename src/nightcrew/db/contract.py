"""What nightcrew needs from a platform database (``db check`` compares it: ``db/check.py``).

``db migrate`` creates all of this as the reference schema; against production, where the
platform owns its schema, ``db check`` compares the live catalog with this contract: the column
types of every table nightcrew reads or writes, the argument and result types of every function
it calls (spec 000's signatures for the platform's, the migrations' for nightcrew's own), each
trigger on its table, the unique indexes the jobs rely on — and what the role nightcrew connects
as may do: use the schemas, read and write the tables, execute the functions, see every row
past row-level security. Each mismatch is one line naming the object, what was expected and
what was found. Tests keep the contract, the reference migrations and nightcrew's SQL in step.

Types are compared the way nightcrew uses them, not as the reference schema spells them
(spec 000 gives no result or column types): on the platform's tables and functions an integer
may be any of smallint/integer/bigint, a number any numeric type (nightcrew coerces numbers at
the boundary), text may be character varying or an enum (nightcrew compares and writes string
literals, which PostgreSQL casts) — except where nightcrew's SQL would refuse it, named below.
timestamptz, uuid, boolean and jsonb are exact. nightcrew's own tables and functions are
created by its migrations, so any other difference there is drift and stays a mismatch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TS = "timestamp with time zone"

# Every column nightcrew's SQL reads or writes (its queries beside the jobs, the dashboard's, and
# the bodies of its functions in schema nightcrew), as the reference schema types it (what else
# will do: column_rule below). Nothing of how a platform implements its caps: spec 000 names
# only effective_cap(), and the reference schema's plan_limits / cap_overrides / credit_pools /
# billing_accounts.plan are one way to write it, not the contract. auth.users keeps the columns
# the reaper's population is defined by.
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


# --- types ---------------------------------------------------------------------------------------

INTEGER_TYPES = ("smallint", "integer", "bigint")
NUMBER_TYPES = (*INTEGER_TYPES, "numeric", "real", "double precision")
TEXT_TYPES = ("text", "character varying")

# Platform columns that keep exactly their reference type although their family would allow more.
EXACT_COLUMNS: dict[str, str] = {
    "public.episodes.audio_file_size_bytes": (
        "the reconciler's size backfill writes measured object sizes into it, which an integer"
        " column cannot hold past 2 GiB"
    ),
}

# Platform text columns an enum will not do for, and why. nightcrew's SQL (src/nightcrew/**/*.sql
# and the statements in its Python) only reads every other text column, compares it with string
# literals or parameters (`status = 'paused'`, `status IN (…)`, `role = 'owner'`), or sets it to
# a value spec 000 names (`status = 'canceled'`): PostgreSQL casts an untyped literal or
# parameter to the enum, and psycopg sends str parameters untyped. These it does more with.
_URL_PARTS = (
    "the reconciler takes it apart with text functions (left, strpos, nightcrew.object_key) and"
    " compares it with text"
)
_FREE_TEXT = "nightcrew writes its own messages into it"
_EMAIL = "coalesce(user_profiles.email, users.email) needs both of one type"
NOT_AN_ENUM: dict[str, str] = {
    "auth.users.email": _EMAIL,
    "public.user_profiles.email": _EMAIL,
    "public.billing_accounts.stripe_subscription_id": "nightcrew stores Stripe's ids in it",
    "public.episodes.audio_url": _URL_PARTS,
    "public.episodes.original_audio_url": _URL_PARTS,
    "public.episodes.cover_image_url": _URL_PARTS,
    "public.feed_invalidation_outbox.reason": "nightcrew records its own reasons (size_backfill…)",
    "public.feed_invalidation_outbox.last_error": _FREE_TEXT,
    "public.media_jobs.error": _FREE_TEXT,
}


@dataclass(frozen=True, slots=True)
class LiveType:
    """A type as the catalog has it: format_type's name (a domain's base type), and whether it
    is an enum."""

    name: str
    enum: bool = False

    def describe(self) -> str:
        return f"enum {self.name}" if self.enum else self.name


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeRule:
    """What will do where the reference schema has ``reference``."""

    reference: str
    accepted: tuple[str, ...]
    enum: bool = False  # an enum will do (text nightcrew only compares and writes literals to)
    not_enum: str | None = None  # why an enum will not, where text would otherwise allow one

    def admits(self, found: LiveType) -> bool:
        if found.enum:
            return self.enum
        return found.name in self.accepted

    def describe(self) -> str:
        names = [*self.accepted, "an enum"] if self.enum else list(self.accepted)
        if len(names) == 1:
            return names[0]
        return f"{', '.join(names[:-1])} or {names[-1]}"

    def mismatch(self, found: LiveType) -> str:
        """``expected …, found …`` (and why an enum will not do, when that is the difference)."""
        line = f"expected {self.describe()}, found {found.describe()}"
        if found.enum and self.not_enum is not None:
            line += f" (an enum will not do: {self.not_enum})"
        return line


def _family(reference: str) -> tuple[str, ...]:
    if reference in INTEGER_TYPES:
        return INTEGER_TYPES
    if reference == "numeric":
        return NUMBER_TYPES
    if reference == "text":
        return TEXT_TYPES
    return (reference,)


def column_rule(table: str, column: str, reference: str) -> TypeRule:
    qualified = f"{table}.{column}"
    if table.startswith("nightcrew."):
        # nightcrew's own: its migrations create it; only varchar for text, as ever
        accepted = TEXT_TYPES if reference == "text" else (reference,)
        return TypeRule(reference=reference, accepted=accepted)
    if qualified in EXACT_COLUMNS:
        return TypeRule(reference=reference, accepted=(reference,))
    text = reference == "text"
    return TypeRule(
        reference=reference,
        accepted=_family(reference),
        enum=text and qualified not in NOT_AN_ENUM,
        not_enum=NOT_AN_ENUM.get(qualified) if text else None,
    )


def result_rule(spec: FunctionSpec, reference: str) -> TypeRule:
    """A platform function's result (or result column) by family; nightcrew's own exactly."""
    if spec.nightcrew or reference == "text":
        return TypeRule(reference=reference, accepted=(reference,))
    return TypeRule(reference=reference, accepted=_family(reference))


# --- functions -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class FunctionSpec:
    """A function nightcrew calls: argument types in order, and either one result (``result``)
    or the columns nightcrew reads from it by name (``columns``: a ``TABLE(…)`` result, OUT
    parameters or a composite type all do)."""

    name: str  # schema-qualified
    args: tuple[str, ...]
    result: str = ""
    columns: tuple[tuple[str, str], ...] = ()
    purpose: str
    nightcrew: bool = False  # created by nightcrew's migrations (not the platform's)

    @property
    def result_text(self) -> str:
        """The result as PostgreSQL prints the reference's (``pg_get_function_result``)."""
        if self.columns:
            return f"TABLE({', '.join(f'{n} {t}' for n, t in self.columns)})"
        return self.result

    @property
    def signature(self) -> str:
        return signature_text(self.args, self.result_text)


FUNCTIONS: tuple[FunctionSpec, ...] = (
    # The platform's, with spec 000's signatures. Spec 000 gives no result types: the reference
    # schema's are shown, and any of the same family will do (result_rule).
    FunctionSpec(
        name="public.reap_unconfirmed_users",
        args=("interval",),
        columns=(("deleted", "integer"), ("skipped", "integer")),
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
        columns=(("account_id", "uuid"), ("bytes", "numeric")),
        purpose="the over-cap report's stored bytes per account (audio + original)",
        nightcrew=True,
    ),
    FunctionSpec(
        name="nightcrew.escalation_storage_bytes",
        args=(),
        columns=(("account_id", "uuid"), ("bytes", "numeric")),
        purpose="the overage escalation's storage per account (audio, non-pending_deletion)",
        nightcrew=True,
    ),
)

# --- privileges ----------------------------------------------------------------------------------

# What nightcrew's SQL writes, per contract table (every table also needs SELECT): its INSERTs,
# UPDATEs (an INSERT … ON CONFLICT DO UPDATE and a SELECT … FOR UPDATE need UPDATE too) and
# DELETEs under src/nightcrew, the development seeding in demo.py aside. A test derives the same
# from the SQL. The reaper's deletes in auth are the platform function's own business.
WRITES: dict[str, tuple[str, ...]] = {
    "public.billing_accounts": ("UPDATE",),
    "public.podcasts": ("UPDATE", "DELETE"),
    "public.episodes": ("UPDATE",),
    "public.automation_jobs": ("UPDATE",),
    "public.feed_invalidation_outbox": ("INSERT", "UPDATE"),
    "public.podcast_imports": ("UPDATE",),
    "public.import_items": ("UPDATE",),
    "public.media_jobs": ("UPDATE",),
    "nightcrew.queue_messages": ("INSERT",),
    "nightcrew.podcast_deletions": ("INSERT", "UPDATE"),
    "nightcrew.effects": ("INSERT", "UPDATE", "DELETE"),
    "nightcrew.leases": ("INSERT", "UPDATE", "DELETE"),
    "nightcrew.runs": ("INSERT", "UPDATE"),
}

RLS_HINT = "needs BYPASSRLS, as Supabase's service_role has"

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


def signature_text(args: Iterable[str], result: str) -> str:
    return f"({', '.join(args)}) → {result}"
