"""``nightcrew demo``: a small sample podcast platform, both lanes run on it, the outcome shown.

It always uses the embedded PostgreSQL in ``NIGHTCREW_DATA_DIR`` (a database of its own,
``nightcrew_demo``, recreated every time) and a local store under ``demo/media`` — never
``DATABASE_URL`` or ``STORAGE_URL``, so it cannot touch a real platform — and it talks to no
outside service (Stripe and the feed worker are left unconfigured, which the output says).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from nightcrew import narrate
from nightcrew.adapters.mail import RecordingMailer
from nightcrew.adapters.reviewer import OfflineReviewer
from nightcrew.adapters.storage import ObjectStore
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.connection import with_dbname
from nightcrew.db.database import Database
from nightcrew.db.embedded import EmbeddedPostgres
from nightcrew.db.migrate import migrate
from nightcrew.effects import outbox as effects_outbox
from nightcrew.errors import ConfigError
from nightcrew.lifecycle.lanes import LaneReport, run_lane
from nightcrew.runtime import Runtime, open_runtime

DEMO_DATABASE = "nightcrew_demo"
DEMO_MEDIA_URL = "https://media.demo.nightcrew.test"
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


@dataclass(kw_only=True)
class Sample:
    """What was seeded, by name, so the outcome can be told in words."""

    names: dict[str, str] = field(default_factory=dict)  # id → human name
    files: int = 0
    bytes: int = 0
    orphan_key: str = ""

    def name(self, row_id: object) -> str:
        return self.names.get(str(row_id), str(row_id)[:8])


async def _one(db: Database, sql: str, params: dict[str, Any]) -> str:
    row = await db.fetch_one(sql + " RETURNING id", params)
    assert row is not None
    return str(row["id"])


class _Seeder:
    """Rows of a small podcast platform, each named in ``sample`` for the story."""

    def __init__(self, db: Database, store: ObjectStore, now: datetime) -> None:
        self.db, self.store, self.now = db, store, now
        self.sample = Sample()

    def ago(self, delta: timedelta) -> datetime:
        return self.now - delta

    async def user(self, email: str, created: datetime, **extra: Any) -> str:
        cols = ", ".join(["email", "created_at", *extra])
        vals = ", ".join(f"%({k})s" for k in ["email", "created_at", *extra])
        uid = await _one(
            self.db,
            f"INSERT INTO auth.users ({cols}) VALUES ({vals})",
            {"email": email, "created_at": created, **extra},
        )
        self.sample.names[uid] = email
        return uid

    async def account(self, owner: str, name: str, model: str) -> str:
        acct = await _one(
            self.db,
            "INSERT INTO public.billing_accounts (owner_user_id, billing_model, plan,"
            " stripe_customer_id) VALUES (%(o)s, %(m)s, 'creator', %(c)s)",
            {"o": owner, "m": model, "c": f"cus_{name.lower()}"},
        )
        await self.db.execute(
            "INSERT INTO public.user_profiles (id, email, billing_account_id)"
            " VALUES (%(u)s, %(e)s, %(a)s)",
            {"u": owner, "e": self.sample.names[owner], "a": acct},
        )
        return acct

    async def podcast(self, title: str, acct: str, owner: str, **cols: Any) -> str:
        slug = title.lower().replace(" ", "-")
        names = ", ".join(["slug", "title", "billing_account_id", *cols])
        vals = ", ".join(f"%({k})s" for k in ["slug", "title", "billing_account_id", *cols])
        pid = await _one(
            self.db,
            f"INSERT INTO public.podcasts ({names}) VALUES ({vals})",
            {"slug": slug, "title": title, "billing_account_id": acct, **cols},
        )
        await self.db.execute(
            "INSERT INTO public.podcast_members (podcast_id, user_id, role)"
            " VALUES (%(p)s, %(u)s, 'owner')",
            {"p": pid, "u": owner},
        )
        self.sample.names[pid] = f"“{title}”"
        return pid

    async def episode(self, pid: str, title: str, files: int = 1, **cols: Any) -> str:
        names = ", ".join(["podcast_id", "title", "status", *cols])
        vals = ", ".join(f"%({k})s" for k in ["podcast_id", "title", "status", *cols])
        eid = await _one(
            self.db,
            f"INSERT INTO public.episodes ({names}) VALUES ({vals})",
            {"podcast_id": pid, "title": title, "status": "published", **cols},
        )
        self.sample.names[eid] = f"“{title}”"
        for n in range(files):
            data = f"sample audio {title} #{n}\n".encode() * 64
            key = f"podcasts/{pid}/e/{eid}/audio-{n}.mp3"
            await self.store.put(key, data)
            self.sample.files += 1
            self.sample.bytes += len(data)
            if n == 0:  # the episode's enclosure; its recorded size is left for the reconciler
                await self.db.execute(
                    "UPDATE public.episodes SET audio_url = %(u)s WHERE id = %(e)s",
                    {"u": f"{DEMO_MEDIA_URL}/{key}", "e": eid},
                )
        return eid

    async def podcast_import(
        self, pid: str, name: str, status: str, at: datetime, *, migration: bool = False
    ) -> str:
        """An import created at ``at``; a running one was started and dispatched then too."""
        started = at if status == "running" else None
        iid = await _one(
            self.db,
            "INSERT INTO public.podcast_imports (podcast_id, status, is_hosting_migration,"
            " started_at, dispatch_end_at, created_at)"
            " VALUES (%(p)s, %(s)s, %(m)s, %(r)s, %(r)s, %(t)s)",
            {"p": pid, "s": status, "m": migration, "r": started, "t": at},
        )
        self.sample.names[iid] = name
        return iid


async def seed(db: Database, store: ObjectStore, now: datetime) -> Sample:
    seeder = _Seeder(db, store, now)
    ada = await seeder.user(
        "ada@example.test", seeder.ago(400 * DAY), email_confirmed_at=seeder.ago(400 * DAY)
    )
    bo = await seeder.user(
        "bo@example.test", seeder.ago(300 * DAY), email_confirmed_at=seeder.ago(300 * DAY)
    )
    await seeder.user("signup-bot@example.test", seeder.ago(9 * DAY))
    await seeder.user("new-listener@example.test", seeder.ago(2 * DAY))
    await seeder.user(
        "invited-cohost@example.test", seeder.ago(30 * DAY), invited_at=seeder.ago(30 * DAY)
    )
    # The "creator" plan serves two podcasts; Acme runs three, so its 30-day clock will start.
    await db.execute(
        "INSERT INTO public.plan_limits (plan, resource, limit_value)"
        " VALUES ('creator', 'podcasts_per_account', 2)"
    )
    acme = await seeder.account(ada, "Acme", "subscription")
    corp = await seeder.account(bo, "Corp", "enterprise_manual")

    brew = await seeder.podcast("Morning Brew", acme, ada)
    for n in range(3):
        await seeder.episode(brew, f"Brew #{n + 1}", published_at=seeder.ago((3 - n) * 7 * DAY))
    owls = await seeder.podcast(
        "Night Owls",
        acme,
        ada,
        status="paused",
        paused_at=seeder.ago(90 * DAY),
        pause_expires_at=seeder.ago(DAY),
    )
    await seeder.episode(owls, "Owls pilot", published_at=seeder.ago(120 * DAY))
    garden = await seeder.podcast(
        "Garden Hour",
        corp,
        bo,
        status="paused",
        paused_at=seeder.ago(10 * DAY),
        pause_expires_at=now + 7 * DAY,
    )
    await seeder.episode(garden, "Seeds", published_at=seeder.ago(30 * DAY))
    old = await seeder.podcast(
        "Old Times",
        corp,
        bo,
        status="pending_deletion",
        deletion_scheduled_at=seeder.ago(DAY),
        deletion_redirect_url="https://example.test/moved",
    )
    for n in range(3):
        await seeder.episode(
            old, f"Old Times {n + 1}", files=2 if n == 0 else 1, published_at=seeder.ago(200 * DAY)
        )
    await seeder.podcast(
        "Second Thoughts", corp, bo, status="pending_deletion", deletion_scheduled_at=now + 10 * DAY
    )
    ext = await seeder.podcast("Elsewhere FM", acme, ada, hosting_type="external")
    # A trailer uploaded and abandoned three days ago: no episode points at it any more.
    seeder.sample.orphan_key = f"podcasts/{ext}/e/retired-take/take-1.mp3"
    await store.put(seeder.sample.orphan_key, b"an old take\n" * 256)
    seeder.sample.files += 1
    await seeder.episode(
        ext,
        "Hosted elsewhere",
        files=0,
        published_at=seeder.ago(DAY),
        external_link_status="pending",
        external_link_attempt=1,
        external_link_next_attempt_at=seeder.ago(10 * MINUTE),
    )

    imp = await seeder.podcast_import(
        brew, "the import into “Morning Brew”", "running", seeder.ago(30 * MINUTE)
    )
    for status, attempts, age in (
        ("pending", 1, 5 * MINUTE),
        ("processing", 0, 20 * MINUTE),
        ("completed", 1, 25 * MINUTE),
        ("pending", 0, 10 * 1e-3 * MINUTE),
    ):
        await db.execute(
            "INSERT INTO public.import_items (import_id, status, attempts,"
            " created_at, updated_at) VALUES (%(i)s, %(s)s, %(a)s, %(t)s, %(t)s)",
            {"i": imp, "s": status, "a": attempts, "t": seeder.ago(age)},
        )
    await seeder.podcast_import(
        ext,
        "the hosting-migration preview of “Elsewhere FM”",
        "preview",
        seeder.ago(20 * MINUTE),
        migration=True,
    )
    media_episode = await db.fetch_one(
        "SELECT id FROM public.episodes WHERE podcast_id = %(p)s LIMIT 1", {"p": brew}
    )
    assert media_episode is not None
    job = await _one(
        db,
        "INSERT INTO public.media_jobs (episode_id, type, status, created_at,"
        " updated_at) VALUES (%(e)s, 'normalize', 'running', %(t)s, %(t)s)",
        {"e": media_episode["id"], "t": seeder.ago(4 * 60 * MINUTE)},
    )
    seeder.sample.names[job] = "a loudness-normalisation job on “Brew #1”"
    return seeder.sample


async def _state(db: Database) -> dict[str, Any]:
    rows = await db.fetch("SELECT id, title, status FROM public.podcasts ORDER BY created_at")
    users = await db.fetch_one("SELECT count(*) AS n FROM auth.users")
    queued = await db.fetch(
        "SELECT queue, count(*) AS n FROM nightcrew.queue_messages GROUP BY queue ORDER BY queue"
    )
    return {
        "podcasts": {str(r["id"]): (r["title"], r["status"]) for r in rows},
        "users": users["n"] if users else 0,
        "queued": {r["queue"]: r["n"] for r in queued},
    }


async def _count_files(store: ObjectStore) -> int:
    return sum([len(page) async for page in store.list_prefix("podcasts/")])


def explain(sample: Sample, minute: LaneReport, daily: LaneReport) -> list[str]:
    """The lanes' reports, in words: the dashboard's sentences, with the sample's names."""

    def name(row_id: str, item: Any) -> str:
        return sample.name(row_id)

    lines: list[str] = ["", "Minute lane — the self-healing watchdogs (every minute):"]
    lines += [f"  • {line}" for line in narrate.minute_sentences(minute.to_json(), name)]
    lines += ["", "Daily lane — once a day at 04:00 UTC:"]
    lines += [f"  • {line}" for line in narrate.daily_sentences(daily.to_json(), name)]
    failures = [*minute.errors, *daily.errors]
    if failures:
        lines += ["", "Failures (each also logged under its event name):"]
        lines += [
            f"  ! {line}"
            for line in narrate.grouped([f"{f['event']}: {f['error']}" for f in failures])
        ]
    return lines


def _demo_settings(settings: Settings, uri: str, media: Path) -> Settings:
    return settings.model_copy(
        update={
            "database_url": with_dbname(uri, DEMO_DATABASE),
            "storage_url": f"file://{media}",
            "r2_public_url": DEMO_MEDIA_URL,
            "public_app_url": "https://app.demo.nightcrew.test",
            "queue_url": "postgres",
            "stripe_secret_key": None,
            "public_feed_url": None,
            "rss_invalidation_secret": None,
            "news_shards": "",
        }
    )


def _media(settings: Settings) -> Path:
    return (settings.data_dir / "demo" / "media").resolve()


async def run_demo(settings: Settings, clock: Clock, *, events: str = "on stderr") -> list[str]:
    """The story, in lines; ``events`` says where the run's JSON events went (for its end)."""
    now = clock.now()
    media = _media(settings)
    shutil.rmtree(media, ignore_errors=True)
    embedded = EmbeddedPostgres.start(settings.embedded_pgdata)
    try:
        with psycopg.connect(embedded.uri, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DEMO_DATABASE} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {DEMO_DATABASE}")
        demo_settings = _demo_settings(settings, embedded.uri, media).model_copy(
            # the sample feeds are on this machine: the one private address the demo may
            # fetch; inline, on PostgreSQL leases, whatever NEWS_PIPELINE and REDIS_URL say
            update={
                "news_allowed_private_hosts": "127.0.0.1",
                "redis_url": None,
                "news_pipeline": "inline",
            }
        )
        reviewer = OfflineReviewer(blocked_terms=frozenset({"casino"}))
        async with open_runtime(demo_settings, clock, reviewer=reviewer) as runtime:
            return await _run(runtime, clock, now, settings, media, events)
    finally:
        embedded.stop()


@contextmanager
def demo_database(settings: Settings) -> Iterator[Settings]:
    """The last demo's database (``serve --demo``): the embedded server runs while inside."""
    embedded = EmbeddedPostgres.start(settings.embedded_pgdata)
    try:
        with psycopg.connect(embedded.uri, autocommit=True) as admin:
            found = admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DEMO_DATABASE,)
            ).fetchone()
        if found is None:
            raise ConfigError(
                f"no demo database in {settings.embedded_pgdata}: run `nightcrew demo` first"
            )
        shown = _demo_settings(settings, embedded.uri, _media(settings))
        if settings.news_pipeline == "rabbitmq":
            # the page shows (and replays) the pipeline's dead letters when asked to
            shown = shown.model_copy(update={"queue_url": settings.queue_url})
        yield shown
    finally:
        embedded.stop()


async def _run(
    runtime: Runtime, clock: Clock, now: datetime, settings: Settings, media: object, events: str
) -> list[str]:
    await migrate(runtime.db)
    sample = await seed(runtime.db, runtime.store, now)
    three_days_ago = (now - 3 * DAY).timestamp()
    os.utime(Path(str(media)) / sample.orphan_key, (three_days_ago, three_days_ago))
    # No mail leaves the demo: a recording mailer keeps what would have been sent, to show it.
    mailer = RecordingMailer(configured=True)
    runtime = replace(runtime, mail=mailer)
    before, files_before = await _state(runtime.db), await _count_files(runtime.store)
    minute = await run_lane(runtime, clock, "minute")
    daily = await run_lane(runtime, clock, "daily")
    news_lines = await _news(runtime, clock, now)
    assert minute is not None and daily is not None
    after, files_after = await _state(runtime.db), await _count_files(runtime.store)
    owed = await effects_outbox.counts(runtime.db)
    delivered = await runtime.db.fetch_one(
        "SELECT count(*) AS n FROM nightcrew.effects WHERE delivered_at IS NOT NULL"
    )

    lines = [
        "nightcrew demo — a sample podcast platform, and the crew at work on it",
        f"  PostgreSQL: embedded, in {settings.embedded_pgdata} (database {DEMO_DATABASE})",
        f"  files:      {media}",
        f"  as of:      {now:%Y-%m-%d %H:%M} UTC",
        "",
        f"Before: {len(before['podcasts'])} podcasts, {before['users']} users, "
        f"{files_before} audio files ({sample.bytes:,} bytes).",
    ]
    for pid, (title, status) in before["podcasts"].items():
        new = after["podcasts"].get(pid)
        change = "deleted" if new is None else (f"→ {new[1]}" if new[1] != status else "unchanged")
        lines.append(f"    {title:<18} {status:<17} {change}")
    lines += explain(sample, minute, daily)
    lines += news_lines
    for mail in mailer.sent:
        lines += [
            "",
            f"The warning email, as {mail.to} would get it (Idempotency-Key "
            f"{mail.idempotency_key}):",
            f"  Subject: {mail.subject}",
        ]
        lines += [f"  | {line}" for line in mail.text.strip().splitlines()]
    lines += [
        "",
        f"After: {len(after['podcasts'])} podcasts, {after['users']} users, {files_after} files."
        " Queue messages written: "
        + (", ".join(f"{q} {n}" for q, n in after["queued"].items()) or "none")
        + ".",
        "Left alone, and why: “Garden Hour” is paused until next week; “Second Thoughts” is "
        "scheduled for deletion in 10 days; the 2-day-old and the invited signups are kept.",
        "Stripe and the feed worker are not configured here, so billing resumes are skipped "
        "(loudly) and invalidations go to the in-database queue.",
        f"Effects (every call that leaves the database, owed in the same transaction as its "
        f"change): {delivered['n'] if delivered else 0} delivered, "
        f"{sum(k['pending'] for k in owed.values())} being retried, "
        f"{sum(k['dead'] for k in owed.values())} given up because Stripe and the feed worker "
        "are not configured here (on your own database, `nightcrew effects list --dead` lists "
        "such effects and `nightcrew effects retry --dead` re-drives them once configured).",
        "",
        f"Both runs are in the demo database's run history (nightcrew.runs {minute.run_id} and "
        f"{daily.run_id}). Every step above was also logged as a JSON event, {events}.",
        "Next: `nightcrew db migrate` then `nightcrew lifecycle run daily --dry-run` on your own "
        "(default) embedded database, or see the README to point nightcrew at a real one.",
    ]
    return lines


async def repoint_sample_feeds(db: Database, base: str) -> None:
    """``serve --demo``: the demo's sample sources at the feeds served again, on ``base`` (the
    run that added them served them on a port of its own, gone with it), and due at once, so
    the page's "Run now" of the demo's shard fetches them (the demo checked them minutes ago)."""
    await db.execute(
        "UPDATE news.sources SET feed_url = %(base)s || substring(feed_url from '/[^/]*$'),"
        " next_check_at = NULL"
        " WHERE shard = 'demo' AND feed_url LIKE 'http://127.0.0.1:%%'",
        {"base": base},
    )


async def _news(runtime: Runtime, clock: Clock, now: datetime) -> list[str]:
    """Two sample feeds on a loopback server, two news runs: the second finds nothing new."""
    from nightcrew.demo_support import serve_sample_feeds
    from nightcrew.news.schedule import run_shard_now
    from nightcrew.news.sources.registry import PARK_AFTER_FAILURES, add_source

    with serve_sample_feeds() as base:
        for path, name in (("/city.xml", "City desk"), ("/science.xml", "Science desk")):
            await add_source(runtime.db, url=base + path, name=name, shard="demo", now=now)
        # in the run history (lane news:demo), as `news run --manual` records them
        first = await run_shard_now(runtime, clock, "demo", requested_by=None)
        second = await run_shard_now(runtime, clock, "demo", requested_by=None)
    assert first is not None and second is not None  # manual runs always run
    # A feed on an office network that last week's runs refused until it was parked: what the
    # dashboard's News page explains (the setting that allows it) and can enable again.
    wire = await add_source(
        runtime.db, url="http://10.20.0.7/wire.xml", name="Wire (office)", shard="demo", now=now
    )
    await runtime.db.execute(
        "UPDATE news.sources SET parked_at = %(at)s, consecutive_failures = %(n)s,"
        " last_error = '10.20.0.7 is not a public address' WHERE id = %(id)s",
        {"at": now - DAY, "n": PARK_AFTER_FAILURES, "id": wire["id"]},
    )
    rejected = await runtime.db.fetch(
        "SELECT a.title, r.reasons FROM news.articles a JOIN news.reviews r"
        " ON r.article_id = a.id WHERE NOT r.accepted ORDER BY a.id"
    )
    lines = [
        "",
        "News worker — two sample feeds on a local server, shard “demo”:",
        f"  • first run: {first.queued_count} new stories queued, "
        f"{first.processed_count} written, {first.accepted_count} accepted, "
        f"{first.rejected_count} rejected by the offline rules:",
    ]
    lines += [f"      - “{r['title']}”: {', '.join(r['reasons'])}" for r in rejected]
    lines.append("    the public snapshot news/snapshots/demo.json was refreshed.")
    lines.append(
        f"  • second run: {second.queued_count} new stories — everything had been seen; "
        "nothing was reviewed or written twice."
    )
    lines.append(
        "  • “Wire (office)” on 10.20.0.7 is parked: runs refuse private addresses unless "
        "NEWS_ALLOWED_PRIVATE_HOSTS names them (the dashboard's News page says so, and can "
        "enable it again)."
    )
    return lines
