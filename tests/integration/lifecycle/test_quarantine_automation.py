"""Quarantine cancels pending time automation only of episodes that were published or scheduled.

A draft's (or an archived episode's) time automation is the owner's to keep: quarantining its
missing audio must leave it pending.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from nightcrew.adapters.storage import open_store
from nightcrew.db.database import Database
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.lifecycle.reconcile.missing import MissingCandidate, quarantine_episode
from tests import factories as f
from tests.integration.lifecycle.test_reconcile import BASE, later, rt

QUARANTINE = ReconcileOptions(mode="apply", quarantine_missing=True)
STATUSES = ("published", "scheduled", "draft", "archived")


async def _episode_with_jobs(db: Database, podcast: str, status: str) -> str:
    """An episode whose audio object does not exist, with a pending time job, a pending event
    job and a finished time job."""
    extra: dict[str, Any] = {}
    if status == "published":
        extra["published_at"] = datetime(2026, 1, 1).astimezone()
    if status == "scheduled":
        extra["scheduled_for"] = datetime(2027, 1, 1).astimezone()
    episode = await f.episode(
        db,
        podcast,
        status=status,
        audio_url=f"{BASE}/podcasts/{podcast}/e/{status}/gone.mp3",
        audio_file_size_bytes=7,
        **extra,
    )
    await db.execute(
        "INSERT INTO public.automation_jobs (episode_id, trigger_type, status)"
        " VALUES (%(e)s, 'time', 'pending'), (%(e)s, 'event', 'pending'),"
        " (%(e)s, 'time', 'done')",
        {"e": episode},
    )
    return episode


async def _scanned(db: Database, episode: str, status: str) -> MissingCandidate:
    """The episode as the missing check's scan saw it, ``status`` then."""
    row = await db.fetch_one(
        "SELECT audio_url FROM public.episodes WHERE id = %(e)s", {"e": episode}
    )
    assert row is not None
    url: str = row["audio_url"]
    return MissingCandidate(
        id=UUID(episode), status=status, audio_url=url, key=url.removeprefix(f"{BASE}/")
    )


async def _jobs(db: Database, episode: str) -> list[tuple[str, str]]:
    rows = await db.fetch(
        "SELECT trigger_type, status FROM public.automation_jobs WHERE episode_id = %(e)s"
        " ORDER BY trigger_type, status",
        {"e": episode},
    )
    return [(r["trigger_type"], r["status"]) for r in rows]


def _expected(canceled: bool) -> list[tuple[str, str]]:
    return [
        ("event", "pending"),
        ("time", "canceled" if canceled else "done"),
        ("time", "done" if canceled else "pending"),
    ]


async def test_run_reconcile_cancels_time_automation_of_published_and_scheduled_only(
    db: Database, fresh_db_url: str
) -> None:
    podcast = await f.podcast(db)
    episodes = {status: await _episode_with_jobs(db, podcast, status) for status in STATUSES}
    clock = later(days=1)
    store = open_store("memory://")

    report = await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, QUARANTINE)

    assert report.missing.count == 4 and report.missing.quarantined == 4
    for status, episode in episodes.items():
        row = await db.fetch_one(
            "SELECT status, audio_url FROM public.episodes WHERE id = %(e)s", {"e": episode}
        )
        assert row is not None and row["audio_url"] is None, status  # quarantined, all four
        canceled = status in ("published", "scheduled")
        assert await _jobs(db, episode) == _expected(canceled), status
    rows = await db.fetch(
        "SELECT id::text, status FROM public.episodes WHERE id = ANY(%(ids)s::uuid[])",
        {"ids": list(episodes.values())},
    )
    by_id = {r["id"]: r["status"] for r in rows}
    assert by_id[episodes["published"]] == "draft" and by_id[episodes["scheduled"]] == "draft"
    assert by_id[episodes["draft"]] == "draft" and by_id[episodes["archived"]] == "archived"


async def test_quarantine_episode_decides_by_the_current_status_not_the_scanned_one(
    db: Database, fresh_db_url: str
) -> None:
    podcast = await f.podcast(db)
    # scanned while published; unpublished to a draft (by its owner) before the quarantine
    was_published = await _episode_with_jobs(db, podcast, "published")
    # scanned while a draft; scheduled by its owner before the quarantine
    was_draft = await _episode_with_jobs(db, podcast, "draft")
    scanned = {
        episode: await _scanned(db, episode, status)
        for episode, status in ((was_published, "published"), (was_draft, "draft"))
    }
    await db.execute(
        "UPDATE public.episodes SET status = 'draft', published_at = NULL WHERE id = %(e)s",
        {"e": was_published},
    )
    await db.execute(
        "UPDATE public.episodes SET status = 'scheduled', scheduled_for = %(t)s WHERE id = %(e)s",
        {"e": was_draft, "t": datetime(2027, 1, 1).astimezone()},
    )
    clock = later(days=1)
    runtime = await rt(db, clock, fresh_db_url, open_store("memory://"))

    assert await quarantine_episode(runtime, scanned[was_published], clock.now())
    assert await quarantine_episode(runtime, scanned[was_draft], clock.now())

    assert await _jobs(db, was_published) == _expected(canceled=False)
    assert await _jobs(db, was_draft) == _expected(canceled=True)


async def test_an_archived_episodes_pending_time_automation_stays_pending(
    db: Database, fresh_db_url: str
) -> None:
    podcast = await f.podcast(db)
    archived = await _episode_with_jobs(db, podcast, "archived")
    scanned = await _scanned(db, archived, "archived")
    clock = later(days=1)
    runtime = await rt(db, clock, fresh_db_url, open_store("memory://"))

    assert await quarantine_episode(runtime, scanned, clock.now())

    assert await _jobs(db, archived) == _expected(canceled=False)
    after = await db.fetch_one(
        "SELECT status, audio_url FROM public.episodes WHERE id = %(e)s", {"e": archived}
    )
    assert after == {"status": "archived", "audio_url": None}
    # nothing was published: no feed invalidation is owed
    assert await db.fetch("SELECT 1 FROM public.feed_invalidation_outbox") == []
