"""``nightcrew demo``: the sample platform (``seed.py``) seeded, both lanes and two news runs
on it, the outcome told in words.

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
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from nightcrew import narrate
from nightcrew.adapters.mail import RecordingMailer
from nightcrew.adapters.reviewer import OfflineReviewer
from nightcrew.adapters.storage import ObjectStore
from nightcrew.assembly import open_runtime
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.demo.news import tell_news
from nightcrew.demo.seed import DAY, DEMO_MEDIA_URL, Sample, seed
from nightcrew.effects import outbox as effects_outbox
from nightcrew.effects.deliver import handlers
from nightcrew.errors import ConfigError
from nightcrew.lifecycle.lanes import LaneReport, run_lane
from nightcrew.runtime import Runtime, embedded_database

DEMO_DATABASE = "nightcrew_demo"


@dataclass(frozen=True, kw_only=True, slots=True)
class _Podcast:
    id: object
    title: str
    status: str


@dataclass(frozen=True, kw_only=True, slots=True)
class _Queued:
    queue: str
    n: int


@dataclass(frozen=True, kw_only=True, slots=True)
class _State:
    """The platform as the story tells it before and after the runs."""

    podcasts: dict[str, tuple[str, str]]  # id → (title, status)
    users: int
    queued: dict[str, int]  # queue → messages written


async def _state(db: Database) -> _State:
    podcasts = await db.fetch_as(
        _Podcast, "SELECT id, title, status FROM public.podcasts ORDER BY created_at"
    )
    users = await db.fetch_count("SELECT count(*) AS n FROM auth.users")
    queued = await db.fetch_as(
        _Queued,
        "SELECT queue, count(*) AS n FROM nightcrew.queue_messages GROUP BY queue ORDER BY queue",
    )
    return _State(
        podcasts={str(p.id): (p.title, p.status) for p in podcasts},
        users=users,
        queued={q.queue: q.n for q in queued},
    )


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
            "database_url": uri,
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
    with embedded_database(settings, DEMO_DATABASE, fresh=True) as uri:
        assert uri is not None  # made anew
        demo_settings = _demo_settings(settings, uri, media).model_copy(
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


@contextmanager
def demo_database(settings: Settings) -> Iterator[Settings]:
    """The last demo's database (``serve --demo``): the embedded server runs while inside."""
    with embedded_database(settings, DEMO_DATABASE) as uri:
        if uri is None:
            raise ConfigError(
                f"no demo database in {settings.embedded_pgdata}: run `nightcrew demo` first"
            )
        shown = _demo_settings(settings, uri, _media(settings))
        if settings.news_pipeline == "rabbitmq":
            # the page shows (and replays) the pipeline's dead letters when asked to
            shown = shown.model_copy(update={"queue_url": settings.queue_url})
        yield shown


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
    news_lines = await tell_news(runtime, clock, now)
    assert minute is not None and daily is not None
    after, files_after = await _state(runtime.db), await _count_files(runtime.store)
    owed = await effects_outbox.counts(runtime.db, handlers(runtime))
    delivered = await runtime.db.fetch_count(
        "SELECT count(*) AS n FROM nightcrew.effects WHERE delivered_at IS NOT NULL"
    )

    lines = [
        "nightcrew demo — a sample podcast platform, and the crew at work on it",
        f"  PostgreSQL: embedded, in {settings.embedded_pgdata} (database {DEMO_DATABASE})",
        f"  files:      {media}",
        f"  as of:      {now:%Y-%m-%d %H:%M} UTC",
        "",
        f"Before: {len(before.podcasts)} podcasts, {before.users} users, "
        f"{files_before} audio files ({sample.bytes:,} bytes).",
    ]
    for pid, (title, status) in before.podcasts.items():
        new = after.podcasts.get(pid)
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
        f"After: {len(after.podcasts)} podcasts, {after.users} users, {files_after} files."
        " Queue messages written: "
        + (", ".join(f"{q} {n}" for q, n in after.queued.items()) or "none")
        + ".",
        "Left alone, and why: “Garden Hour” is paused until next week; “Second Thoughts” is "
        "scheduled for deletion in 10 days; the 2-day-old and the invited signups are kept.",
        "Stripe and the feed worker are not configured here, so billing resumes are skipped "
        "(loudly) and invalidations go to the in-database queue.",
        f"Effects (every call that leaves the database, owed in the same transaction as its "
        f"change): {delivered} delivered, "
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
