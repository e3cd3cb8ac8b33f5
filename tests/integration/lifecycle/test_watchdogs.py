"""The minute lane's sweeps against real PostgreSQL, with a frozen Clock.

For every threshold: one case just under and one exactly on it (both left alone: thresholds are
"older than") and one just over (acted on). Then what is left alone, the per-tick caps, and what
the queue received.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.queues import EXTERNAL_EPISODE_LINK, PODCAST_IMPORTS, MemoryQueueProducer
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle import watchdogs as wd
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.conftest import NOW
from tests.support.rabbitmq_vhosts import rabbitmq_vhost, vhost_url
from tests.support.services import needs_rabbitmq

S = timedelta(seconds=1)


def ago(seconds: float) -> Any:
    return NOW - timedelta(seconds=seconds)


async def _item(db: Database, row_id: str) -> dict[str, Any]:
    row = await db.fetch_one("SELECT * FROM public.import_items WHERE id = %(id)s", {"id": row_id})
    assert row is not None
    return row


async def _running_import(db: Database, **values: Any) -> tuple[str, str]:
    podcast = await f.podcast(db)
    return podcast, await f.podcast_import(db, podcast, status="running", **values)


# --- sweepStalledImports ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("attempts", "threshold_seconds"),
    [(1, 67), (2, 85), (3, 160), (4, 410), (5, 600), (9, 600)],
)
@pytest.mark.parametrize(("offset", "expected"), [(-1, False), (0, False), (+1, True)])
async def test_stalled_import_per_attempt_threshold(
    db: Database,
    runtime: Runtime,
    clock: FrozenClock,
    attempts: int,
    threshold_seconds: int,
    offset: int,
    expected: bool,
) -> None:
    podcast, imp = await _running_import(db, dispatch_end_at=ago(3600))
    item = await f.import_item(
        db, imp, attempts=attempts, updated_at=ago(threshold_seconds + offset)
    )

    report = await wd.sweep_stalled_imports(runtime, clock)

    sent = await f.queue_messages(db, PODCAST_IMPORTS)
    if expected:
        assert report.items_requeued == 1
        assert [m["body"] for m in sent] == [
            {"import_id": imp, "import_item_id": item, "podcast_id": podcast}
        ]
        row = await _item(db, item)
        assert row["updated_at"] == NOW  # cooldown starts now
        assert row["status"] == "pending" and row["attempts"] == attempts  # nothing else moved
    else:
        assert report.items_requeued == 0
        assert sent == []
        assert (await _item(db, item))["updated_at"] == ago(threshold_seconds + offset)


@pytest.mark.parametrize(("dispatch_age", "expected"), [(29, False), (30, False), (31, True)])
async def test_attempt_zero_is_aged_from_dispatch_end_plus_grace(
    db: Database, runtime: Runtime, clock: FrozenClock, dispatch_age: int, expected: bool
) -> None:
    _, imp = await _running_import(db, dispatch_end_at=ago(dispatch_age))
    # updated_at long past the cooldown: only dispatch_end_at + 30 s decides.
    await f.import_item(db, imp, attempts=0, updated_at=ago(3600))
    report = await wd.sweep_stalled_imports(runtime, clock)
    assert report.items_requeued == (1 if expected else 0)


@pytest.mark.parametrize(("updated_age", "expected"), [(59, False), (60, False), (61, True)])
async def test_resend_cooldown_on_updated_at(
    db: Database, runtime: Runtime, clock: FrozenClock, updated_age: int, expected: bool
) -> None:
    _, imp = await _running_import(db, dispatch_end_at=ago(3600))
    await f.import_item(db, imp, attempts=0, updated_at=ago(updated_age))
    report = await wd.sweep_stalled_imports(runtime, clock)
    assert report.items_requeued == (1 if expected else 0)


@pytest.mark.parametrize(("offset", "expected"), [(-1, False), (0, False), (+1, True)])
async def test_legacy_fallback_when_dispatch_end_at_is_null(
    db: Database, runtime: Runtime, clock: FrozenClock, offset: int, expected: bool
) -> None:
    _, imp = await _running_import(db, dispatch_end_at=None)
    await f.import_item(db, imp, attempts=0, updated_at=ago(25 * 60 + offset))
    report = await wd.sweep_stalled_imports(runtime, clock)
    assert report.items_requeued == (1 if expected else 0)


@pytest.mark.parametrize(("offset", "expected"), [(-1, False), (0, False), (+1, True)])
async def test_processing_claim_older_than_ten_minutes_is_reset_and_resent(
    db: Database, runtime: Runtime, clock: FrozenClock, offset: int, expected: bool
) -> None:
    _podcast, imp = await _running_import(db, dispatch_end_at=ago(3600))
    item = await f.import_item(
        db, imp, status="processing", attempts=2, updated_at=ago(600 + offset)
    )
    with capture_logs() as logs:
        report = await wd.sweep_stalled_imports(runtime, clock)
    row = await _item(db, item)
    sent = await f.queue_messages(db, PODCAST_IMPORTS)
    if expected:
        assert report.items_rescued == 1 and report.items_requeued == 1
        assert row["status"] == "pending" and row["updated_at"] == NOW
        assert row["attempts"] == 2
        assert [m["body"]["import_item_id"] for m in sent] == [item]
        rescued = [e for e in logs if e["event"] == "import_watchdog_rescued_processing"]
        assert rescued and rescued[0]["count"] == 1
    else:
        assert report.items_rescued == 0 and row["status"] == "processing"
        assert sent == []


async def test_a_rescued_item_is_not_resent_again_by_the_pending_sweep_in_the_same_tick(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    _, imp = await _running_import(db, dispatch_end_at=ago(3600))
    await f.import_item(db, imp, status="processing", attempts=0, updated_at=ago(3600))
    report = await wd.sweep_stalled_imports(runtime, clock)
    assert report.items_requeued == 1
    assert len(await f.queue_messages(db, PODCAST_IMPORTS)) == 1
    # One minute later the rescued row is pending, past cooldown and dispatch grace: due again.
    clock.advance(timedelta(seconds=61))
    assert (await wd.sweep_stalled_imports(runtime, clock)).items_requeued == 1


@pytest.mark.parametrize("parent_status", ["preview", "completed", "failed", "canceled"])
async def test_items_under_a_parent_that_is_not_running_are_left_alone(
    db: Database, runtime: Runtime, clock: FrozenClock, parent_status: str
) -> None:
    podcast = await f.podcast(db)
    imp = await f.podcast_import(db, podcast, status=parent_status, dispatch_end_at=ago(3600))
    await f.import_item(db, imp, attempts=1, updated_at=ago(3600))
    await f.import_item(db, imp, status="processing", updated_at=ago(3600))
    report = await wd.sweep_stalled_imports(runtime, clock)
    assert report.items_requeued == 0 and report.items_rescued == 0
    assert await f.queue_messages(db, PODCAST_IMPORTS) == []


@pytest.mark.parametrize("status", ["completed", "failed"])
async def test_terminal_items_are_never_touched(
    db: Database, runtime: Runtime, clock: FrozenClock, status: str
) -> None:
    _, imp = await _running_import(db, dispatch_end_at=ago(3600))
    item = await f.import_item(db, imp, status=status, attempts=3, updated_at=ago(86400))
    report = await wd.sweep_stalled_imports(runtime, clock)
    assert report.items_requeued == 0
    row = await _item(db, item)
    assert row["status"] == status and row["updated_at"] == ago(86400)


async def test_at_most_500_resends_per_tick_and_the_rest_next_tick(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    _, imp = await _running_import(db, dispatch_end_at=ago(3600))
    await db.execute(
        "INSERT INTO public.import_items (import_id, status, attempts, updated_at)"
        " SELECT %(imp)s, 'pending', 1, %(at)s FROM generate_series(1, 600)",
        {"imp": imp, "at": ago(3600)},
    )
    with capture_logs() as logs:
        first = await wd.sweep_stalled_imports(runtime, clock)
    assert first.items_requeued == wd.STALLED_IMPORT_MAX_RESEND == 500
    found = [e for e in logs if e["event"] == "import_watchdog_found_stalled"]
    assert found == [
        {
            "event": "import_watchdog_found_stalled",
            "log_level": "info",
            "import_id": imp,
            "count": 500,
            "oldest_stale_minutes": 60.0,
        }
    ]
    clock.advance(S)
    second = await wd.sweep_stalled_imports(runtime, clock)
    assert second.items_requeued == 100
    bodies = [m["body"]["import_item_id"] for m in await f.queue_messages(db, PODCAST_IMPORTS)]
    assert len(bodies) == len(set(bodies)) == 600


# --- sweepStalledExternalLinks ---------------------------------------------------------------
async def _external_episode(
    db: Database, *, hosting_type: str = "external", **values: Any
) -> tuple[str, str]:
    podcast = await f.podcast(db, hosting_type=hosting_type)
    defaults: dict[str, Any] = {
        "status": "published",
        "published_at": ago(7200),
        "external_link_status": "pending",
        "external_link_attempt": 2,
        "external_link_next_attempt_at": ago(3600),
    }
    return podcast, await f.episode(db, podcast, **{**defaults, **values})


@pytest.mark.parametrize(("age", "expected"), [(89, False), (90, False), (91, True)])
async def test_external_link_grace_past_next_attempt(
    db: Database, runtime: Runtime, clock: FrozenClock, age: int, expected: bool
) -> None:
    podcast, episode = await _external_episode(db, external_link_next_attempt_at=ago(age))
    report = await wd.sweep_stalled_external_links(runtime, clock)
    sent = await f.queue_messages(db, EXTERNAL_EPISODE_LINK)
    row = await db.fetch_one("SELECT * FROM public.episodes WHERE id = %(id)s", {"id": episode})
    assert row is not None
    if expected:
        assert report.links_requeued == 1
        assert [m["body"] for m in sent] == [
            {
                "episode_id": episode,
                "podcast_id": podcast,
                "attempt": 2,
                "target_published_at": ago(7200).isoformat(),
            }
        ]
        # pushed forward by the cooldown, attempt kept: the consumer's backoff is preserved
        assert row["external_link_next_attempt_at"] == NOW + timedelta(seconds=90)
        assert row["external_link_attempt"] == 2
    else:
        assert report.links_requeued == 0 and sent == []
        assert row["external_link_next_attempt_at"] == ago(age)


async def test_external_link_not_resent_again_within_the_cooldown(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    await _external_episode(db)
    assert (await wd.sweep_stalled_external_links(runtime, clock)).links_requeued == 1
    clock.advance(timedelta(seconds=179))  # next_attempt = now0+90, due at +90 grace = +180
    assert (await wd.sweep_stalled_external_links(runtime, clock)).links_requeued == 0
    clock.advance(timedelta(seconds=2))
    assert (await wd.sweep_stalled_external_links(runtime, clock)).links_requeued == 1


async def test_podcasterplus_hosted_and_settled_links_are_left_alone(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    await _external_episode(db, hosting_type="podcasterplus")
    await _external_episode(db, external_link_status="linked")
    await _external_episode(db, external_link_status="failed")
    report = await wd.sweep_stalled_external_links(runtime, clock)
    assert report.links_requeued == 0
    assert await f.queue_messages(db, EXTERNAL_EPISODE_LINK) == []


async def test_null_next_attempt_is_rescued_and_logged(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    _, episode = await _external_episode(db, external_link_next_attempt_at=None)
    with capture_logs() as logs:
        report = await wd.sweep_stalled_external_links(runtime, clock)
    assert report.links_requeued == 1 and report.null_next_attempt == 1
    assert [
        e["episode_id"] for e in logs if e["event"] == "external_link_watchdog_null_next_attempt"
    ] == [episode]
    assert any(e["event"] == "external_link_watchdog_resent" and e["count"] == 1 for e in logs)


async def test_scheduled_for_is_the_target_when_not_yet_published(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    later = NOW + timedelta(days=2)
    await _external_episode(db, status="scheduled", published_at=None, scheduled_for=later)
    await wd.sweep_stalled_external_links(runtime, clock)
    [message] = await f.queue_messages(db, EXTERNAL_EPISODE_LINK)
    assert message["body"]["target_published_at"] == later.isoformat()


async def test_no_target_is_skipped_logged_and_not_sent(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    _, episode = await _external_episode(db, status="draft", published_at=None)
    with capture_logs() as logs:
        report = await wd.sweep_stalled_external_links(runtime, clock)
    assert report.links_requeued == 0 and report.skipped_no_target == 1
    assert await f.queue_messages(db, EXTERNAL_EPISODE_LINK) == []
    assert [
        e["episode_id"] for e in logs if e["event"] == "external_link_watchdog_skipped_no_target"
    ] == [episode]


async def test_at_most_500_link_resends_per_tick(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    podcast = await f.podcast(db, hosting_type="external")
    await db.execute(
        "INSERT INTO public.episodes (podcast_id, status, published_at, external_link_status,"
        " external_link_next_attempt_at) SELECT %(p)s, 'published', %(at)s, 'pending', %(at)s"
        " FROM generate_series(1, 600)",
        {"p": podcast, "at": ago(3600)},
    )
    assert (await wd.sweep_stalled_external_links(runtime, clock)).links_requeued == 500
    assert (await wd.sweep_stalled_external_links(runtime, clock)).links_requeued == 100


# --- sweepStuckHostingMigrationPreviews ------------------------------------------------------
@pytest.mark.parametrize(("offset", "expected"), [(-1, False), (0, False), (+1, True)])
async def test_stuck_preview_threshold(
    db: Database, runtime: Runtime, clock: FrozenClock, offset: int, expected: bool
) -> None:
    podcast = await f.podcast(db)
    imp = await f.podcast_import(
        db, podcast, status="preview", is_hosting_migration=True, created_at=ago(15 * 60 + offset)
    )
    with capture_logs() as logs:
        report = await wd.sweep_stuck_hosting_migration_previews(runtime, clock)
    row = await db.fetch_one("SELECT * FROM public.podcast_imports WHERE id = %(id)s", {"id": imp})
    assert row is not None
    if expected:
        assert report.import_ids == [imp]
        assert row["status"] == "canceled" and row["updated_at"] == NOW
        assert any(e["event"] == "hosting_migration_preview_watchdog_canceled" for e in logs)
        # the unique index no longer blocks a fresh commit for this podcast
        await f.podcast_import(db, podcast, status="preview", is_hosting_migration=True)
    else:
        assert report.previews_canceled == 0 and row["status"] == "preview"


async def test_only_unstarted_hosting_migration_previews_are_canceled(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    old = ago(3600)
    plain = await f.podcast_import(db, await f.podcast(db), status="preview", created_at=old)
    started = await f.podcast_import(
        db,
        await f.podcast(db),
        status="preview",
        is_hosting_migration=True,
        started_at=old,
        created_at=old,
    )
    running = await f.podcast_import(
        db,
        await f.podcast(db),
        status="running",
        is_hosting_migration=True,
        started_at=old,
        created_at=old,
    )
    report = await wd.sweep_stuck_hosting_migration_previews(runtime, clock)
    assert report.previews_canceled == 0
    rows = await db.fetch(
        "SELECT id::text, status FROM public.podcast_imports WHERE id = ANY(%(ids)s::uuid[])",
        {"ids": [plain, started, running]},
    )
    assert {r["id"]: r["status"] for r in rows} == {
        plain: "preview",
        started: "preview",
        running: "running",
    }


async def test_at_most_50_previews_canceled_per_run(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    for _ in range(60):
        await f.podcast_import(
            db,
            await f.podcast(db),
            status="preview",
            is_hosting_migration=True,
            created_at=ago(3600),
        )
    assert (await wd.sweep_stuck_hosting_migration_previews(runtime, clock)).previews_canceled == 50
    assert (await wd.sweep_stuck_hosting_migration_previews(runtime, clock)).previews_canceled == 10


# --- sweepWedgedMediaJobs --------------------------------------------------------------------
@pytest.mark.parametrize("status", ["pending", "running"])
@pytest.mark.parametrize(("offset", "expected"), [(-1, False), (0, False), (+1, True)])
async def test_wedged_media_job_threshold(
    db: Database, runtime: Runtime, clock: FrozenClock, status: str, offset: int, expected: bool
) -> None:
    episode = await f.episode(db, await f.podcast(db))
    job = await f.media_job(db, episode, status=status, updated_at=ago(3 * 3600 + offset))
    report = await wd.sweep_wedged_media_jobs(runtime, clock)
    row = await db.fetch_one("SELECT * FROM public.media_jobs WHERE id = %(id)s", {"id": job})
    assert row is not None
    if expected:
        assert report.job_ids == [job]
        assert row["status"] == "failed" and row["error"] == wd.WEDGED_MEDIA_JOB_ERROR
        # the one-active slot is free again for this episode + type
        await f.media_job(db, episode, status="pending", updated_at=NOW)
    else:
        assert report.media_jobs_flagged == 0 and row["status"] == status


async def test_wedged_media_jobs_are_notified_and_finished_ones_untouched(
    db: Database, runtime: Runtime, clock: FrozenClock, fresh_db_url: str
) -> None:
    episode = await f.episode(db, await f.podcast(db))
    wedged = await f.media_job(db, episode, type="normalize", updated_at=ago(86400))
    done = await f.media_job(
        db, episode, type="transcribe", status="completed", updated_at=ago(86400)
    )
    async with await psycopg.AsyncConnection.connect(fresh_db_url, autocommit=True) as listener:
        await listener.execute("LISTEN media_job_result")
        await wd.sweep_wedged_media_jobs(runtime, clock)
        notes = [n async for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert len(notes) == 1
    payload = json.loads(notes[0].payload)
    assert payload["job_id"] == wedged and payload["status"] == "failed"
    row = await db.fetch_one("SELECT status FROM public.media_jobs WHERE id = %(id)s", {"id": done})
    assert row == {"status": "completed"}


@pytest.mark.parametrize(("attempts", "threshold"), [(0, 0), (4, 410), (9, 600)])
async def test_a_failed_send_is_reported_undone_and_retried_on_the_next_tick(
    db: Database, runtime: Runtime, clock: FrozenClock, attempts: int, threshold: int
) -> None:
    """Send, then bump: a send that fails undoes its claim, so the next tick (a minute later)
    sends it — not the item's whole threshold later (410 s at attempt 4, 600 s past it)."""
    podcast, imp = await _running_import(db, dispatch_end_at=ago(3600))
    item = await f.import_item(db, imp, attempts=attempts, updated_at=ago(3600))
    down = replace(
        runtime, queues=MemoryQueueProducer(clock, failing_queues=frozenset({PODCAST_IMPORTS}))
    )
    with capture_logs() as logs:
        report = await wd.sweep_stalled_imports(down, clock)
    assert report.items_requeued == 0 and report.counts()["items_resend_failed"] == 1
    assert report.errors[0]["event"] == "import_watchdog_resend_failed"
    failed = [e for e in logs if e["event"] == "import_watchdog_resend_failed"]
    assert failed[0]["import_item_id"] == item and "refusing" in failed[0]["error"]
    assert (await _item(db, item))["updated_at"] == ago(3600)  # the claim undone

    clock.advance(timedelta(seconds=60))  # the next tick
    assert (await wd.sweep_stalled_imports(runtime, clock)).items_requeued == 1
    [message] = await f.queue_messages(db, PODCAST_IMPORTS)
    assert message["body"] == {"import_id": imp, "import_item_id": item, "podcast_id": podcast}
    # sent: claimed for good, so the tick after leaves it to the consumer
    clock.advance(timedelta(seconds=60))
    assert (await wd.sweep_stalled_imports(runtime, clock)).items_requeued == 0


async def test_a_rescued_item_whose_send_fails_is_sent_on_the_next_tick(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    _podcast, imp = await _running_import(db)
    item = await f.import_item(db, imp, status="processing", attempts=2, updated_at=ago(3600))
    down = replace(
        runtime, queues=MemoryQueueProducer(clock, failing_queues=frozenset({PODCAST_IMPORTS}))
    )
    report = await wd.sweep_stalled_imports(down, clock)
    assert report.items_rescued == 1 and report.items_requeued == 0
    row = await _item(db, item)
    assert (row["status"], row["updated_at"]) == ("pending", ago(3600))
    clock.advance(timedelta(seconds=60))
    assert (await wd.sweep_stalled_imports(runtime, clock)).items_requeued == 1
    [message] = await f.queue_messages(db, PODCAST_IMPORTS)
    assert message["body"]["import_item_id"] == item


async def test_an_external_link_whose_send_fails_is_sent_on_the_next_tick(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    _podcast, episode = await _external_episode(db, external_link_next_attempt_at=ago(3600))
    down = replace(
        runtime,
        queues=MemoryQueueProducer(clock, failing_queues=frozenset({EXTERNAL_EPISODE_LINK})),
    )
    report = await wd.sweep_stalled_external_links(down, clock)
    assert report.links_requeued == 0 and report.counts()["links_resend_failed"] == 1
    row = await db.fetch_one("SELECT * FROM public.episodes WHERE id = %(id)s", {"id": episode})
    assert row is not None and row["external_link_next_attempt_at"] == ago(3600)
    clock.advance(timedelta(seconds=60))  # inside the 90 s cooldown a claim would have set
    assert (await wd.sweep_stalled_external_links(runtime, clock)).links_requeued == 1
    [message] = await f.queue_messages(db, EXTERNAL_EPISODE_LINK)
    assert message["body"]["episode_id"] == episode


async def test_four_concurrent_minute_runs_dispatch_each_stalled_item_once(
    db: Database, runtime: Runtime, clock: FrozenClock, fresh_db_url: str
) -> None:
    """Four replicas' sweeps at the same tick, each on its own connections: every stalled item
    and link is sent exactly once (the claim is one statement; SKIP LOCKED keeps them apart)."""
    import asyncio

    from tests.conftest import make_runtime

    _, imp = await _running_import(db, dispatch_end_at=ago(3600))
    items = [await f.import_item(db, imp, attempts=1, updated_at=ago(3600)) for _ in range(60)]
    links = [
        (await _external_episode(db, external_link_next_attempt_at=ago(3600)))[1] for _ in range(20)
    ]
    dbs = [await Database.open(fresh_db_url) for _ in range(4)]
    try:
        replicas = [await make_runtime(d, clock, fresh_db_url) for d in dbs]
        await asyncio.gather(
            *(wd.sweep_stalled_imports(r, clock) for r in replicas),
            *(wd.sweep_stalled_external_links(r, clock) for r in replicas),
        )
    finally:
        for d in dbs:
            await d.close()
    imports = [m["body"]["import_item_id"] for m in await f.queue_messages(db, PODCAST_IMPORTS)]
    linked = [m["body"]["episode_id"] for m in await f.queue_messages(db, EXTERNAL_EPISODE_LINK)]
    assert sorted(imports) == sorted(items) and sorted(linked) == sorted(links)


async def test_a_queue_that_cannot_be_used_is_misconfigured_once_and_the_other_sweeps_run(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    """The in-database queue's table is gone: the import and link watchdogs each say
    spec 000's *_misconfigured once (not a failure per message), send nothing more, and leave
    their rows due for when it is fixed; the minute lane's other sweeps run on."""
    from nightcrew.lifecycle.lanes import MINUTE, run_jobs

    _, imp = await _running_import(db, dispatch_end_at=ago(3600))
    items = [await f.import_item(db, imp, attempts=1, updated_at=ago(3600)) for _ in range(3)]
    _, episode = await _external_episode(db, external_link_next_attempt_at=ago(3600))
    await db.execute("DROP TABLE nightcrew.queue_messages")
    with capture_logs() as logs:
        report = await run_jobs(runtime, clock, MINUTE)
    names = [e["event"] for e in logs]
    assert names.count("import_watchdog_misconfigured") == 1
    assert names.count("external_link_watchdog_misconfigured") == 1
    assert "import_watchdog_resend_failed" not in names
    misconfigured = next(e for e in logs if e["event"] == "import_watchdog_misconfigured")
    assert misconfigured["queue"] == PODCAST_IMPORTS and "db migrate" in misconfigured["error"]
    jobs = {j.name: j for j in report.jobs}
    assert all(j.status == "ok" for j in jobs.values()), {n: j.status for n, j in jobs.items()}
    assert "import_watchdog_completed" in names  # the lane's own line: it ran to the end
    for item in items:  # not sent: due again once the queue is fixed
        assert (await _item(db, item))["updated_at"] == ago(3600)
    row = await db.fetch_one("SELECT * FROM public.episodes WHERE id = %(id)s", {"id": episode})
    assert row is not None and row["external_link_next_attempt_at"] == ago(3600)


@needs_rabbitmq
async def test_a_podcast_imports_queue_the_broker_refuses_is_misconfigured_and_the_rest_runs(
    db: Database, clock: FrozenClock, fresh_db_url: str
) -> None:
    """On a real RabbitMQ, a vhost of its own where the user may declare
    `external-episode-link` but not `podcast-imports` (ACCESS_REFUSED, as a broker set up
    without that queue answers). The minute lane logs import_watchdog_misconfigured once,
    sends no import and leaves the items due; the stalled-link sweep still delivers its message
    on the same producer, and the lane's other sweeps run to the lane's own completed line."""
    import aio_pika

    from nightcrew.adapters.queues import RabbitQueueProducer
    from nightcrew.lifecycle.lanes import MINUTE, run_jobs
    from tests.conftest import open_test_runtime

    vhost = f"nightcrew-test-{uuid.uuid4().hex[:8]}"
    with rabbitmq_vhost(vhost, configure=f"^{EXTERNAL_EPISODE_LINK}$"):
        url = vhost_url(vhost)
        _, imp = await _running_import(db, dispatch_end_at=ago(3600))
        items = [await f.import_item(db, imp, attempts=1, updated_at=ago(3600)) for _ in range(3)]
        _, episode = await _external_episode(db, external_link_next_attempt_at=ago(3600))
        preview = await f.podcast_import(
            db,
            await f.podcast(db),
            status="preview",
            is_hosting_migration=True,
            created_at=ago(3600),
        )
        producer = await RabbitQueueProducer.connect(url)
        try:
            async with open_test_runtime(db, clock, fresh_db_url, queues=producer) as runtime:
                with capture_logs() as logs:
                    report = await run_jobs(runtime, clock, MINUTE)
        finally:
            await producer.close()
        connection = await aio_pika.connect_robust(url)
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(EXTERNAL_EPISODE_LINK, passive=True)
            message = await queue.get(timeout=5)
            assert message is not None
            sent = json.loads(message.body)
        finally:
            await connection.close()
    names = [e["event"] for e in logs]
    assert names.count("import_watchdog_misconfigured") == 1
    misconfigured = next(e for e in logs if e["event"] == "import_watchdog_misconfigured")
    assert misconfigured["queue"] == PODCAST_IMPORTS and "ACCESS_REFUSED" in misconfigured["error"]
    assert "import_watchdog_resend_failed" not in names
    assert "external_link_watchdog_misconfigured" not in names
    assert sent["episode_id"] == episode
    assert "hosting_migration_preview_watchdog_canceled" in names
    assert names[-1] == "import_watchdog_completed"
    jobs = {j.name: j for j in report.jobs}
    assert all(j.status == "ok" for j in jobs.values()), {n: j.status for n, j in jobs.items()}
    assert report.total("links_requeued") == 1 and report.total("items_requeued") == 0
    for item in items:  # not sent: due again once the queue is fixed
        assert (await _item(db, item))["updated_at"] == ago(3600)
    row = await db.fetch_one(
        "SELECT status FROM public.podcast_imports WHERE id = %(id)s", {"id": preview}
    )
    assert row is not None and row["status"] == "canceled"
