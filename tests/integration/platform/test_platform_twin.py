"""nightcrew on a platform that only spec 000 shaped.

Every test runs the installed ``nightcrew`` command (or ``nightcrew serve``) on a fresh clone
of the platform twin (tests/support/platform_twin.sql), with the REAL clock: no ``--now``, every
seeded timestamp relative to the database's now(). The twin has spec 000's function signatures,
its own cap tables, extra columns and tables, a touch trigger — so a dependency on nightcrew's
reference schema fails here the way it would fail in production.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from nightcrew.db.migrate import discover_migrations
from tests.support.platform_twin import (
    admin,
    command_env,
    nightcrew_command,
    platform_catalog,
    run_nightcrew,
)
from tests.support.servers import RecordingServer, free_port, stripe_responder

pytestmark = pytest.mark.acceptance

BASE = "https://media.twin.example"
FEED_SECRET = "twin-rss-secret-0123456789"
RECONCILER_SECRET = "twin-reconciler-secret-0123456789"
STRIPE_CUSTOMER = "cus_twin_paused"
STRIPE_SUBSCRIPTION = "sub_twin_paused"
DAILY_JOBS = (
    "reactivateExpiredPauses",
    "hardDeleteExpiredPodcasts",
    "reapUnconfirmedUsers",
    "runReconcile",
    "runOverageEscalation",
)
MINUTE_JOBS = (
    "sweepStalledImports",
    "sweepStalledExternalLinks",
    "sweepStuckHostingMigrationPreviews",
    "sweepWedgedMediaJobs",
    "deliverEffects",
)


# --- the seeded platform ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Platform:
    """A small platform on the twin, one row for each thing a lane should act on."""

    paused_podcast: str
    paying_account: str
    deleted_podcast: str
    deleted_slug: str
    deleted_files: tuple[Path, ...]
    old_user: str
    young_user: str
    held_user: str
    invited_user: str
    over_cap_account: str
    over_cap_owner_email: str
    masters_account: str
    backfill_podcast: str
    backfill_episode: str
    orphan_file: Path
    outbox_podcast: str
    outbox_row: str
    stalled_import: str
    stalled_item: str
    stuck_preview: str
    external_podcast: str
    external_episode: str
    wedged_job: str
    wedged_job_episode: str
    healthy_job: str


def _id(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None = None) -> str:
    row = conn.execute(sql, params or {}).fetchone()
    assert row is not None
    return str(row[0])


def _user(conn: psycopg.Connection[Any], email: str, age: str, *, confirmed: bool) -> str:
    return _id(
        conn,
        "INSERT INTO auth.users (email, created_at, email_confirmed_at)"
        " VALUES (%(e)s, now() - %(age)s::interval,"
        "         CASE WHEN %(c)s THEN now() - %(age)s::interval END) RETURNING id",
        {"e": email, "age": age, "c": confirmed},
    )


def _account(conn: psycopg.Connection[Any], owner: str, plan: str, **extra: Any) -> str:
    account = _id(
        conn,
        "INSERT INTO public.billing_accounts (owner_user_id, plan_id, stripe_customer_id,"
        " stripe_price_id) VALUES (%(o)s, %(p)s, %(c)s, 'price_' || %(p)s) RETURNING id",
        {"o": owner, "p": plan, "c": extra.get("customer")},
    )
    conn.execute(
        "INSERT INTO public.user_profiles (id, display_name, email, billing_account_id)"
        " SELECT id, 'Owner', email, %(a)s FROM auth.users WHERE id = %(o)s",
        {"a": account, "o": owner},
    )
    return account


def _podcast(
    conn: psycopg.Connection[Any], account: str, owner: str, slug: str, **cols: Any
) -> str:
    params = {
        "slug": slug,
        "title": slug.replace("-", " ").title(),
        "description": f"{slug}: a show",
        "billing_account_id": account,
        **cols,
    }
    podcast = _id(
        conn,
        f"INSERT INTO public.podcasts ({', '.join(params)})"
        f" VALUES ({', '.join(f'%({n})s' for n in params)}) RETURNING id",
        params,
    )
    conn.execute(
        "INSERT INTO public.podcast_members (podcast_id, user_id, role)"
        " VALUES (%(p)s, %(u)s, 'owner')",
        {"p": podcast, "u": owner},
    )
    return podcast


def _episode(conn: psycopg.Connection[Any], podcast: str, **cols: Any) -> str:
    params = {"podcast_id": podcast, "title": "An episode", "duration_seconds": 1800, **cols}
    return _id(
        conn,
        f"INSERT INTO public.episodes ({', '.join(params)})"
        f" VALUES ({', '.join(f'%({n})s' for n in params)}) RETURNING id",
        params,
    )


def _write(media: Path, key: str, body: bytes, *, age: timedelta | None = None) -> Path:
    path = media / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    if age is not None:
        then = time.time() - age.total_seconds()
        os.utime(path, (then, then))
    return path


def seed_platform(url: str, media: Path) -> Platform:
    """Everything relative to the real now (the database's now(), the files' mtime)."""
    with psycopg.connect(url, autocommit=True) as conn:
        # Account A (Creator, paying through Stripe): an expired pause, a due deletion.
        owner_a = _user(conn, "owner-a@twin.example", "400 days", confirmed=True)
        account_a = _account(conn, owner_a, "creator", customer=STRIPE_CUSTOMER)
        paused = _podcast(
            conn,
            account_a,
            owner_a,
            "night-owls",
            status="paused",
            paused_at=datetime.now(UTC) - timedelta(days=90),
            pause_expires_at=datetime.now(UTC) - timedelta(hours=1),
        )
        doomed_slug = "old-times"
        doomed = _podcast(
            conn,
            account_a,
            owner_a,
            doomed_slug,
            status="pending_deletion",
            deletion_scheduled_at=datetime.now(UTC) - timedelta(hours=2),
            deletion_redirect_url="https://elsewhere.example/old-times.xml",
        )
        doomed_episode = _episode(
            conn,
            doomed,
            status="published",
            published_at=datetime.now(UTC) - timedelta(days=300),
            audio_url=f"{BASE}/podcasts/{doomed}/e/ep1/audio.mp3",
            audio_file_size_bytes=5,
        )
        conn.execute(
            "INSERT INTO public.episode_transcripts (episode_id, body) VALUES (%(e)s, 'hello')",
            {"e": doomed_episode},
        )
        deleted_files = (
            _write(media, f"podcasts/{doomed}/images/cover.jpg", b"jpeg"),
            _write(media, f"podcasts/{doomed}/e/ep1/audio.mp3", b"audio"),
        )

        # Signups: one past the 7-day retention, one inside it, one past it but still held
        # by a NO ACTION foreign key (skipped with a WARNING), one invited.
        old_user = _user(conn, "old-signup@twin.example", "8 days", confirmed=False)
        young_user = _user(conn, "young-signup@twin.example", "2 days", confirmed=False)
        held_user = _user(conn, "held-signup@twin.example", "9 days", confirmed=False)
        conn.execute("INSERT INTO public.crm_contacts (user_id) VALUES (%(u)s)", {"u": held_user})
        invited_user = _id(
            conn,
            "INSERT INTO auth.users (email, created_at, invited_at)"
            " VALUES ('invited@twin.example', now() - interval '20 days',"
            "         now() - interval '20 days') RETURNING id",
        )

        # Account B: downgraded to Free (1 GB) while holding 1.5 GB of audio + 0.6 GB masters.
        # Legacy audio hosted outside the bucket: the reconciler leaves it alone.
        owner_b_email = "owner-b@twin.example"
        owner_b = _user(conn, owner_b_email, "200 days", confirmed=True)
        account_b = _account(conn, owner_b, "network")
        heavy = _podcast(conn, account_b, owner_b, "heavy-show")
        _episode(
            conn,
            heavy,
            status="published",
            published_at=datetime.now(UTC) - timedelta(days=30),
            audio_url="https://legacy-cdn.twin.example/heavy/ep1.mp3",
            audio_file_size_bytes=1_500_000_000,
            original_audio_url="https://legacy-cdn.twin.example/heavy/ep1.flac",
            original_audio_file_size_bytes=600_000_000,
        )
        conn.execute(
            "UPDATE public.billing_accounts SET plan_id = 'free' WHERE id = %(a)s",
            {"a": account_b},
        )

        # Account D: also downgraded to Free, 0.8 GB of audio + 0.5 GB of masters. Over its cap
        # for the over-cap report (count-both, "mirroring the storage cap trigger"), not for
        # the escalation ("storage = SUM(episodes.audio_file_size_bytes)"): reported, never armed.
        owner_d = _user(conn, "owner-d@twin.example", "100 days", confirmed=True)
        account_d = _account(conn, owner_d, "network")
        mastered = _podcast(conn, account_d, owner_d, "flac-masters")
        _episode(
            conn,
            mastered,
            status="published",
            published_at=datetime.now(UTC) - timedelta(days=10),
            audio_url="https://legacy-cdn.twin.example/flac/ep1.mp3",
            audio_file_size_bytes=800_000_000,
            original_audio_url="https://legacy-cdn.twin.example/flac/ep1.flac",
            original_audio_file_size_bytes=500_000_000,
        )
        conn.execute(
            "UPDATE public.billing_accounts SET plan_id = 'free' WHERE id = %(a)s",
            {"a": account_d},
        )

        # Account C (Network, unlimited): the reconciler's and the watchdogs' material.
        owner_c = _user(conn, "owner-c@twin.example", "300 days", confirmed=True)
        account_c = _account(conn, owner_c, "network")
        sized = _podcast(conn, account_c, owner_c, "size-me")
        sized_episode = _episode(
            conn,
            sized,
            status="published",
            published_at=datetime.now(UTC) - timedelta(days=3),
        )
        key = f"podcasts/{sized}/e/{sized_episode}/audio.mp3"
        _write(media, key, b"\0" * 2048, age=timedelta(days=3))
        conn.execute(  # a client-declared size of "unknown": the backfill measures 2048
            "UPDATE public.episodes SET audio_url = %(u)s WHERE id = %(e)s",
            {"u": f"{BASE}/{key}", "e": sized_episode},
        )
        orphan = _write(
            media,
            f"podcasts/{sized}/e/{uuid.uuid4()}/superseded.mp3",
            b"old audio",
            age=timedelta(days=3),
        )
        wedged = _id(
            conn,
            "INSERT INTO public.media_jobs (episode_id, type, status, workflow_instance_id,"
            " created_at, updated_at) VALUES (%(e)s, 'normalize', 'running', 'wf-1',"
            " now() - interval '5 hours', now() - interval '4 hours') RETURNING id",
            {"e": sized_episode},
        )
        healthy = _id(
            conn,
            "INSERT INTO public.media_jobs (episode_id, type, status, created_at, updated_at)"
            " VALUES (%(e)s, 'transcribe', 'running', now() - interval '20 minutes',"
            " now() - interval '10 minutes') RETURNING id",
            {"e": sized_episode},
        )

        importing = _podcast(conn, account_c, owner_c, "importing")
        stalled_import = _id(
            conn,
            "INSERT INTO public.podcast_imports (podcast_id, source_feed_url, status,"
            " total_items, created_at, started_at, dispatch_end_at, updated_at)"
            " VALUES (%(p)s, 'https://old-host.example/feed.xml', 'running', 2,"
            " now() - interval '30 minutes', now() - interval '30 minutes',"
            " now() - interval '20 minutes', now() - interval '20 minutes') RETURNING id",
            {"p": importing},
        )
        stalled_item = _id(
            conn,
            "INSERT INTO public.import_items (import_id, source_guid, status, attempts,"
            " created_at, updated_at) VALUES (%(i)s, 'guid-1', 'pending', 0,"
            " now() - interval '30 minutes', now() - interval '20 minutes') RETURNING id",
            {"i": stalled_import},
        )
        conn.execute(  # its sibling was delivered and finished: not touched
            "INSERT INTO public.import_items (import_id, source_guid, status, attempts,"
            " created_at, updated_at) VALUES (%(i)s, 'guid-2', 'completed', 1,"
            " now() - interval '30 minutes', now() - interval '25 minutes')",
            {"i": stalled_import},
        )
        stuck_preview = _id(
            conn,
            "INSERT INTO public.podcast_imports (podcast_id, is_hosting_migration, status,"
            " created_at, updated_at) VALUES (%(p)s, true, 'preview',"
            " now() - interval '40 minutes', now() - interval '40 minutes') RETURNING id",
            {"p": importing},
        )
        outbox_row = _id(  # the platform's own undelivered intent (an episode publish)
            conn,
            "INSERT INTO public.feed_invalidation_outbox (podcast_id, reason, created_at)"
            " VALUES (%(p)s, 'episode_published', now() - interval '2 hours') RETURNING id",
            {"p": importing},
        )

        external = _podcast(conn, account_c, owner_c, "elsewhere", hosting_type="external")
        external_episode = _episode(
            conn,
            external,
            status="published",
            published_at=datetime.now(UTC) - timedelta(hours=1),
            external_url="https://elsewhere.example/ep1",
            external_link_status="pending",
            external_link_attempt=2,
            external_link_next_attempt_at=datetime.now(UTC) - timedelta(minutes=10),
            external_link_last_attempt_at=datetime.now(UTC) - timedelta(minutes=15),
        )

    return Platform(
        paused_podcast=paused,
        paying_account=account_a,
        deleted_podcast=doomed,
        deleted_slug=doomed_slug,
        deleted_files=deleted_files,
        old_user=old_user,
        young_user=young_user,
        held_user=held_user,
        invited_user=invited_user,
        over_cap_account=account_b,
        over_cap_owner_email=owner_b_email,
        masters_account=account_d,
        backfill_podcast=sized,
        backfill_episode=sized_episode,
        orphan_file=orphan,
        outbox_podcast=importing,
        outbox_row=outbox_row,
        stalled_import=stalled_import,
        stalled_item=stalled_item,
        stuck_preview=stuck_preview,
        external_podcast=external,
        external_episode=external_episode,
        wedged_job=wedged,
        wedged_job_episode=sized_episode,
        healthy_job=healthy,
    )


# --- helpers -----------------------------------------------------------------------------------


@pytest.fixture
def media(tmp_path: Path) -> Path:
    path = tmp_path / "media"
    path.mkdir()
    return path


@pytest.fixture
def platform(twin_url: str, media: Path) -> Platform:
    return seed_platform(twin_url, media)


@pytest.fixture
def twin_env(
    twin_url: str,
    media: Path,
    tmp_path: Path,
    feed_server: RecordingServer,
    stripe_server: RecordingServer,
    resend_server: RecordingServer,
) -> dict[str, str]:
    """What an operator sets to point nightcrew at the platform (README "Running against
    production"), every outside system a loopback server that records what it got."""
    stripe_server.responder = stripe_responder({STRIPE_CUSTOMER: [STRIPE_SUBSCRIPTION]})
    resend_server.responder = lambda request: (200, {"id": f"email-{uuid.uuid4()}"})
    return command_env(
        DATABASE_URL=twin_url,
        NIGHTCREW_DATA_DIR=str(tmp_path / "data"),
        STORAGE_URL=f"file://{media}",
        R2_PUBLIC_URL=BASE,
        PUBLIC_FEED_URL=feed_server.url,
        PUBLIC_APP_URL="https://app.twin.example",
        RSS_INVALIDATION_SECRET=FEED_SECRET,
        RECONCILER_SECRET=RECONCILER_SECRET,
        STRIPE_SECRET_KEY="sk_test_twin",
        STRIPE_API_BASE=stripe_server.url,
        RESEND_API_KEY="re_test_twin",
        RESEND_FROM_EMAIL="billing@twin.example",
        RESEND_API_BASE=resend_server.url,
    )


def _one(url: str, sql: str, params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params or {}).fetchone()


def _all(url: str, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params or {}).fetchall()


def _json_run(*args: str, env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    result = run_nightcrew(*args, env=env, timeout=timeout)
    assert result.returncode == 0, (
        f"`nightcrew {' '.join(args)}` exited {result.returncode}:\n{result.stderr}"
    )
    return dict(json.loads(result.stdout))


def _failed_jobs(report: dict[str, Any]) -> dict[str, str]:
    """The jobs the lane report marks failed (lanes.JobOutcome: status 'failed', ok false),
    each with its error."""
    return {
        name: str(job.get("error"))
        for name, job in report["jobs"].items()
        if job.get("status") == "failed" or job.get("ok") is False
    }


def _queue(url: str, queue: str) -> list[dict[str, Any]]:
    rows = _all(
        url,
        "SELECT body FROM nightcrew.queue_messages WHERE queue = %(q)s ORDER BY id",
        {"q": queue},
    )
    return [dict(r[0]) for r in rows]


# --- 0. the twin itself answers as spec 000 says ------------------------------------------------


def test_the_twin_has_spec_000s_signatures_and_behaviour(bare_twin_url: str) -> None:
    """The oracle is checked before it judges: signatures, triggers, the reaper, the caps."""
    functions = dict(
        (r[0], (r[1], r[2]))
        for r in _all(
            bare_twin_url,
            "SELECT n.nspname || '.' || p.proname, pg_get_function_identity_arguments(p.oid),"
            " pg_get_function_result(p.oid) FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname || '.' || p.proname = ANY(%(names)s)",
            {
                "names": [
                    "public.reap_unconfirmed_users",
                    "public.effective_cap",
                    "public.notify_media_job_result",
                    "auth.uid",
                ]
            },
        )
    )
    assert functions == {
        # written with OUT parameters: called with (interval) all the same, the result prints
        # as record, and its columns are deleted and skipped
        "public.reap_unconfirmed_users": (
            "retention interval, OUT deleted integer, OUT skipped integer",
            "record",
        ),
        "public.effective_cap": ("account uuid, resource text", "numeric"),
        "public.notify_media_job_result": ("job_id uuid", "void"),
        "auth.uid": ("", "uuid"),
    }
    reference_only = _all(
        bare_twin_url,
        "SELECT to_regclass('public.plan_limits'), to_regclass('public.cap_overrides'),"
        " to_regclass('public.credit_pools'), to_regproc('public.account_caps'),"
        " (SELECT count(*) FROM information_schema.columns WHERE table_schema = 'public'"
        "   AND table_name = 'billing_accounts' AND column_name = 'plan')",
    )
    assert reference_only == [(None, None, None, None, 0)]
    # the real shapes db check tolerates
    shapes = _all(
        bare_twin_url,
        "SELECT a.attrelid::regclass::text || '.' || a.attname,"
        " format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
        " WHERE (a.attrelid, a.attname) IN (('auth.users'::regclass, 'email'),"
        " ('public.podcasts'::regclass, 'status'),"
        " ('public.billing_accounts'::regclass, 'content_overage_nag_stage'))"
        " ORDER BY 1",
    )
    assert shapes == [
        ("auth.users.email", "character varying(255)"),
        ("billing_accounts.content_overage_nag_stage", "integer"),
        ("podcasts.status", "podcast_status"),
    ]

    with psycopg.connect(bare_twin_url, autocommit=True) as conn:
        owner = _user(conn, "o@twin.example", "1 day", confirmed=True)
        account = _account(conn, owner, "free")  # 1 GB, 1 podcast
        cap = "SELECT public.effective_cap(%(a)s, %(r)s)"
        assert conn.execute(cap, {"a": account, "r": "storage_gb_per_account"}).fetchone() == (1,)
        assert conn.execute(cap, {"a": account, "r": "podcasts_per_account"}).fetchone() == (1,)
        conn.execute(
            "INSERT INTO public.storage_credit_grants (billing_account_id, gb) VALUES (%(a)s, 2)",
            {"a": account},
        )
        conn.execute(  # an expired grant counts for nothing
            "INSERT INTO public.storage_credit_grants (billing_account_id, gb, expires_at)"
            " VALUES (%(a)s, 100, now() - interval '1 day')",
            {"a": account},
        )
        assert conn.execute(cap, {"a": account, "r": "storage_gb_per_account"}).fetchone() == (3,)
        podcast = _podcast(conn, account, owner, "capped")
        _episode(conn, podcast, audio_file_size_bytes=2_000_000_000)
        with pytest.raises(psycopg.errors.CheckViolation):  # 23514, count-both
            _episode(
                conn,
                podcast,
                audio_file_size_bytes=500_000_000,
                original_audio_file_size_bytes=500_000_001,
            )
        conn.execute(
            "INSERT INTO public.account_cap_overrides (billing_account_id, resource, cap_value)"
            " VALUES (%(a)s, 'storage_gb_per_account', NULL)",
            {"a": account},
        )
        assert conn.execute(cap, {"a": account, "r": "storage_gb_per_account"}).fetchone() == (
            None,
        )

        conn.execute("BEGIN")
        conn.execute("SELECT set_config('request.jwt.claim.sub', %(u)s, true)", {"u": owner})
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # 42501
            conn.execute(
                "UPDATE public.podcasts SET overage_suspended_at = now() WHERE id = %(p)s",
                {"p": podcast},
            )
        conn.execute("ROLLBACK")

        old = _user(conn, "old@twin.example", "8 days", confirmed=False)
        held = _user(conn, "held@twin.example", "8 days", confirmed=False)
        young = _user(conn, "young@twin.example", "6 days", confirmed=False)
        conn.execute("INSERT INTO public.crm_contacts (user_id) VALUES (%(u)s)", {"u": held})
        warnings: list[str] = []
        conn.add_notice_handler(lambda d: warnings.append(str(d.message_primary)))
        reaped = conn.execute(
            "SELECT * FROM public.reap_unconfirmed_users(interval '7 days')"
        ).fetchone()
        assert reaped == (1, 1)
        assert any(held in w for w in warnings), warnings
        left = {str(r[0]) for r in conn.execute("SELECT id FROM auth.users").fetchall()}
        assert old not in left and {held, young, owner} <= left


# --- 1. db migrate --skip-reference ------------------------------------------------------------


def test_migrate_skip_reference_creates_nothing_in_the_platforms_schemas(
    bare_twin_url: str,
) -> None:
    before = platform_catalog(bare_twin_url)
    env = command_env(DATABASE_URL=bare_twin_url)
    result = _json_run("db", "migrate", "--skip-reference", "--json", env=env)
    migrations = discover_migrations()
    assert result["applied"] == [m.label for m in migrations if m.scope == "nightcrew"]
    assert result["skipped"] == [m.label for m in migrations if m.scope == "reference"]
    after = platform_catalog(bare_twin_url)
    for kind in before:
        added = sorted(set(after[kind]) - set(before[kind]))
        removed = sorted(set(before[kind]) - set(after[kind]))
        assert not added and not removed, f"{kind} in public/auth changed: +{added} -{removed}"
    assert _one(bare_twin_url, "SELECT to_regnamespace('nightcrew') IS NOT NULL") == (True,)

    again = _json_run("db", "migrate", "--skip-reference", "--json", env=env)
    assert again["applied"] == []


# --- 2. db check -------------------------------------------------------------------------------


def test_db_check_accepts_the_platform_as_spec_000_shapes_it(twin_url: str) -> None:
    env = command_env(DATABASE_URL=twin_url)
    human = run_nightcrew("db", "check", env=env)
    assert human.returncode == 0, human.stdout + human.stderr
    assert "schema ok" in human.stdout
    report = json.loads(run_nightcrew("db", "check", "--json", env=env).stdout)
    assert report["ok"] is True and report["problems"] == []
    advice = {t: r["advice"] for t, r in report["tables"].items() if r["advice"]}
    assert advice == {}, "the twin has every sweep index nightcrew recommends"
    notes = {t: r["notes"] for t, r in report["tables"].items() if r["notes"]}
    assert notes == {
        "auth.users": ["column auth.users.email: character varying, accepted as text"],
        "public.billing_accounts": [
            "column public.billing_accounts.content_overage_nag_stage: integer,"
            " accepted as smallint"
        ],
        "public.podcasts": [
            "column public.podcasts.status: enum public.podcast_status, accepted as text"
        ],
    }
    assert report["functions"]["public.reap_unconfirmed_users"]["found"] == [
        "(interval) → record (deleted integer, skipped integer)"
    ]


# The twin's tables with row-level security (as on any Supabase table a browser can reach).
RLS_TABLES = {
    "public.billing_accounts",
    "public.user_profiles",
    "public.podcasts",
    "public.podcast_members",
    "public.episodes",
    "public.media_jobs",
}


def _as_user(url: str, user: str) -> str:
    """The same server and database as another user: password-less, which the test server
    allows over trust authentication on 127.0.0.1."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))


@contextmanager
def _service_role(url: str, *, bypassrls: bool) -> Iterator[str]:
    """A LOGIN role that is neither superuser nor owner, with the grants a platform's service
    role has (Supabase's service_role: every table and sequence of the schemas, EXECUTE by
    default) on the platform's schemas and nightcrew's. Roles are cluster-wide: a unique name,
    and always dropped — what it came to own handed back first."""
    role = f"nightcrew_twin_{'bypass' if bypassrls else 'plain'}_{uuid.uuid4().hex[:12]}"
    schemas = "public, auth, nightcrew, news"
    try:
        admin(url, f"CREATE ROLE {role} LOGIN NOSUPERUSER {'' if bypassrls else 'NO'}BYPASSRLS")
        admin(
            url,
            f"GRANT USAGE ON SCHEMA {schemas} TO {role};"
            f" GRANT ALL ON ALL TABLES IN SCHEMA {schemas} TO {role};"
            f" GRANT ALL ON ALL SEQUENCES IN SCHEMA {schemas} TO {role}",
        )
        yield role
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")


def test_db_check_passes_exactly_when_the_role_sees_the_rows(
    twin_url: str, platform: Platform, twin_env: dict[str, str]
) -> None:
    """As a service role with BYPASSRLS, db check passes and the minute lane finds its rows
    behind row-level security; the same role without BYPASSRLS would find none of them, and db
    check says so, table by table."""
    with _service_role(twin_url, bypassrls=True) as service:
        as_service = _as_user(twin_url, service)
        check = run_nightcrew("db", "check", env=command_env(DATABASE_URL=as_service))
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.rstrip().endswith("schema ok")

        report = _json_run(
            "lifecycle", "run", "minute", "--json", env={**twin_env, "DATABASE_URL": as_service}
        )
        assert _failed_jobs(report) == {}, json.dumps(report["errors"], indent=1)
        assert report["errors"] == [], json.dumps(report["errors"], indent=1)
        # every sweep found its row, each behind (or joined through) row-level security
        assert report["items_requeued"] == 1 and report["links_requeued"] == 1
        assert report["previews_canceled"] == 1 and report["media_jobs_flagged"] == 1

    with _service_role(twin_url, bypassrls=False) as plain:
        env = command_env(DATABASE_URL=_as_user(twin_url, plain))
        denied = run_nightcrew("db", "check", env=env)
        as_json = run_nightcrew("db", "check", "--json", env=env)
    assert denied.returncode == 1, denied.stdout + denied.stderr
    hidden = [line for line in denied.stdout.splitlines() if "row-level security" in line]
    assert len(hidden) == len(RLS_TABLES), denied.stdout
    assert all(f"hides rows from role {plain} (needs BYPASSRLS" in line for line in hidden)
    assert denied.stdout.rstrip().endswith("schema incomplete")
    report = json.loads(as_json.stdout)
    assert report["role"] == {
        "name": plain,
        "superuser": False,
        "bypassrls": False,
        "problems": [],
    }
    privileges = {t: r["privileges"] for t, r in report["tables"].items() if r["privileges"]}
    assert set(privileges) == RLS_TABLES
    assert all(
        len(lines) == 1 and "row-level security" in lines[0] for lines in privileges.values()
    )
    assert report["problems"] == []


# --- 3. the daily lane -------------------------------------------------------------------------


def test_the_daily_lane_runs_every_job_on_the_platform(
    twin_url: str,
    platform: Platform,
    twin_env: dict[str, str],
    feed_server: RecordingServer,
    stripe_server: RecordingServer,
    resend_server: RecordingServer,
) -> None:
    p = platform
    started = datetime.now(UTC)
    report = _json_run("lifecycle", "run", "daily", "--json", env=twin_env)
    assert report["lane"] == "daily" and tuple(report["jobs"]) == DAILY_JOBS
    assert _failed_jobs(report) == {}, json.dumps(report["errors"], indent=1)
    assert report["errors"] == [], json.dumps(report["errors"], indent=1)
    jobs = report["jobs"]

    # 1. the expired pause: active again, the cooldown started, Stripe billing resumed
    row = _one(
        twin_url,
        "SELECT status, paused_at, pause_expires_at, last_pause_ended_at"
        " FROM public.podcasts WHERE id = %(id)s",
        {"id": p.paused_podcast},
    )
    assert row is not None and row[:3] == ("active", None, None)
    assert row[3] is not None and abs(row[3] - started) < timedelta(minutes=5)
    assert jobs["reactivateExpiredPauses"]["podcasts_reactivated"] == 1
    assert jobs["reactivateExpiredPauses"]["billing_resumed"] == 1
    calls = [(r.method, r.path) for r in stripe_server.requests]
    assert ("POST", f"/v1/subscriptions/{STRIPE_SUBSCRIPTION}") in calls, calls
    assert _one(
        twin_url,
        "SELECT stripe_subscription_id FROM public.billing_accounts WHERE id = %(a)s",
        {"a": p.paying_account},
    ) == (STRIPE_SUBSCRIPTION,)

    # 2. the due deletion: the row (and, by CASCADE, its episodes) gone, its objects gone,
    # the feed told through the rss-invalidation queue
    assert _one(
        twin_url,
        "SELECT count(*) FROM public.podcasts WHERE id = %(id)s",
        {"id": p.deleted_podcast},
    ) == (0,)
    assert _one(
        twin_url,
        "SELECT count(*) FROM public.episodes WHERE podcast_id = %(id)s",
        {"id": p.deleted_podcast},
    ) == (0,)
    assert [f for f in p.deleted_files if f.exists()] == []
    assert jobs["hardDeleteExpiredPodcasts"]["podcasts_deleted"] == 1
    assert {
        "type": "podcast.deleted",
        "podcast_id": p.deleted_podcast,
        "podcast_slug": p.deleted_slug,
    }.items() <= _queue(twin_url, "rss-invalidation")[0].items()

    # 3. the reaper, through the platform's own reap_unconfirmed_users(interval)
    users = {str(r[0]) for r in _all(twin_url, "SELECT id FROM auth.users")}
    assert p.old_user not in users
    assert {p.young_user, p.held_user, p.invited_user} <= users
    assert jobs["reapUnconfirmedUsers"]["users_reaped"] == 1
    assert jobs["reapUnconfirmedUsers"]["users_reap_skipped"] == 1

    # 4. the reconciler's safe subset: measured size written (through the platform's cap and
    # touch triggers), the platform's own outbox intent delivered, the aged orphan swept,
    # the accounts over their cap (count-both) reported
    reconcile = jobs["runReconcile"]["report"]
    assert _one(
        twin_url,
        "SELECT audio_file_size_bytes FROM public.episodes WHERE id = %(e)s",
        {"e": p.backfill_episode},
    ) == (2048,)
    assert reconcile["summary"]["sizeWritten"] == 1
    assert not p.orphan_file.exists()
    assert {a["accountId"] for a in reconcile["overCap"]} == {
        p.over_cap_account,
        p.masters_account,
    }
    assert _one(
        twin_url,
        "SELECT delivered_at IS NOT NULL FROM public.feed_invalidation_outbox WHERE id = %(id)s",
        {"id": p.outbox_row},
    ) == (True,)
    assert _one(
        twin_url, "SELECT count(*) FROM public.feed_invalidation_outbox WHERE delivered_at IS NULL"
    ) == (0,)
    invalidated = [
        r.json()["id"] for r in feed_server.requests if r.path == "/_internal/invalidate"
    ]
    assert p.outbox_podcast in invalidated and p.backfill_podcast in invalidated, invalidated
    assert all(
        r.headers.get("Authorization") == f"Bearer {FEED_SECRET}" for r in feed_server.requests
    )

    # 5. the overage escalation: the account whose audio is over its storage cap is armed and
    # told; the one over only with its masters counted is not
    clock = _one(
        twin_url,
        "SELECT content_overage_since, content_overage_deadline - content_overage_since"
        " FROM public.billing_accounts WHERE id = %(a)s",
        {"a": p.over_cap_account},
    )
    assert clock is not None and clock[0] is not None and clock[1] == timedelta(days=30)
    assert jobs["runOverageEscalation"]["armed"] == 1
    armed = _all(
        twin_url, "SELECT id FROM public.billing_accounts WHERE content_overage_since IS NOT NULL"
    )
    assert [str(r[0]) for r in armed] == [p.over_cap_account]
    mails = [r.json() for r in resend_server.requests if r.path == "/emails"]
    assert [m["to"] for m in mails] in ([p.over_cap_owner_email], [[p.over_cap_owner_email]])


# --- 4. the minute lane ------------------------------------------------------------------------


def test_the_minute_lane_watchdogs_act_on_the_platform(
    twin_url: str, platform: Platform, twin_env: dict[str, str]
) -> None:
    p = platform
    channel = f"media_jobs:{p.wedged_job_episode}"
    with psycopg.connect(twin_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        report = _json_run("lifecycle", "run", "minute", "--json", env=twin_env)
        notified = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]

    assert report["lane"] == "minute" and set(report["jobs"]) == set(MINUTE_JOBS)
    assert _failed_jobs(report) == {}, json.dumps(report["errors"], indent=1)
    assert report["errors"] == [], json.dumps(report["errors"], indent=1)

    # the lost podcast-imports message, re-dispatched
    assert report["items_requeued"] == 1
    assert _queue(twin_url, "podcast-imports") == [
        {
            "import_id": p.stalled_import,
            "import_item_id": p.stalled_item,
            "podcast_id": p.outbox_podcast,
        }
    ]
    # the lost external-episode-link message, re-enqueued with its attempt kept
    assert report["links_requeued"] == 1
    [link] = _queue(twin_url, "external-episode-link")
    assert link["episode_id"] == p.external_episode and link["attempt"] == 2
    # the wedged hosting-migration preview, canceled
    assert report["previews_canceled"] == 1
    assert _one(
        twin_url,
        "SELECT status FROM public.podcast_imports WHERE id = %(i)s",
        {"i": p.stuck_preview},
    ) == ("canceled",)
    # the wedged media job, flagged failed and notified through notify_media_job_result(uuid);
    # the healthy one left alone
    assert report["media_jobs_flagged"] == 1
    jobs = dict(
        (str(r[0]), (r[1], r[2]))
        for r in _all(twin_url, "SELECT id, status, error IS NOT NULL FROM public.media_jobs")
    )
    assert jobs == {p.wedged_job: ("failed", True), p.healthy_job: ("running", False)}
    assert len(notified) == 1 and json.loads(notified[0])["id"] == p.wedged_job


# --- 5. lifecycle reconcile --apply ------------------------------------------------------------


def test_reconcile_apply_reports_on_the_platform(
    twin_url: str, platform: Platform, twin_env: dict[str, str]
) -> None:
    p = platform
    report = _json_run("lifecycle", "reconcile", "--apply", "--json", env=twin_env)
    assert report["mode"] == "apply"
    assert report["errors"] == [], json.dumps(report["errors"], indent=1)
    over = {a["accountId"]: a for a in report["overCap"]}
    assert set(over) == {p.over_cap_account, p.masters_account}
    # count-both, as the storage cap trigger counts: audio + masters, against Free's 1 GB
    assert over[p.over_cap_account]["bytes"] == 2_100_000_000
    assert over[p.masters_account]["bytes"] == 1_300_000_000
    assert {a["capBytes"] for a in over.values()} == {1_000_000_000}
    assert report["summary"]["sizeWritten"] == 1
    assert report["outbox"]["delivered"] >= 1
    assert report["mediaJobs"]["flagged"] == 1


# --- 6. POST /reconcile, answered by `nightcrew serve` ----------------------------------------


def test_post_reconcile_is_answered_on_the_platform(
    twin_url: str, platform: Platform, twin_env: dict[str, str]
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [nightcrew_command(), "serve", "--port", str(port)],
        env=twin_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/_health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, f"serve exited {proc.returncode}"
            assert time.monotonic() < deadline, "serve did not answer /_health within 30 s"
            time.sleep(0.1)

        # (serve's scheduler may be running the daily lane's catch-up meanwhile: between
        # 04:00 and 16:00 UTC it runs a missed slot late — the reports below hold either way)
        over_cap = {platform.over_cap_account, platform.masters_account}
        auth = {"Authorization": f"Bearer {RECONCILER_SECRET}"}
        assert httpx.post(f"{base}/reconcile", timeout=10).status_code == 401
        dry = httpx.post(f"{base}/reconcile", headers=auth, timeout=60)
        assert dry.status_code == 200, dry.text
        assert dry.json()["mode"] == "dryrun" and dry.json()["errors"] == [], dry.text
        assert {a["accountId"] for a in dry.json()["overCap"]} == over_cap
        applied = httpx.post(f"{base}/reconcile?mode=apply", headers=auth, timeout=60)
        assert applied.status_code == 200, applied.text
        body = applied.json()
        assert body["mode"] == "apply" and "summary" in body and "outbox" in body
        assert {a["accountId"] for a in body["overCap"]} == over_cap
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-4000:]
