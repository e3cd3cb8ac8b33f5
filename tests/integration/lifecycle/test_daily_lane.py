"""The daily lane as a whole: order, isolation, events, dry run, the reaper, the schedule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.queues import RSS_INVALIDATION
from nightcrew.adapters.storage import ObjectStore, open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.lanes import lane_schedule, run_lane
from nightcrew.lifecycle.signups import reap_unconfirmed_users
from nightcrew.runtime import Runtime
from nightcrew.scheduler import Scheduler
from tests import factories as f
from tests.conftest import NOW, make_runtime
from tests.integration.lifecycle.test_lanes import _snapshot

OLD = NOW - timedelta(days=8)
R2 = {"R2_PUBLIC_URL": "https://media.example"}


async def _seed(db: Database, store: ObjectStore) -> dict[str, str]:
    paused = await f.podcast(db, status="paused", paused_at=OLD, pause_expires_at=NOW)
    doomed = await f.podcast(db, status="pending_deletion", deletion_scheduled_at=NOW)
    episode = await f.episode(db, doomed)
    for n in range(3):
        await store.put(f"podcasts/{doomed}/e/{episode}/{n}.mp3", b"audio")
    await store.put(f"podcasts/{paused}/images/cover.jpg", b"img")
    ghost = await f.user(db, created_at=OLD)
    return {"paused": paused, "doomed": doomed, "ghost": ghost}


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def _store_keys(store: ObjectStore) -> list[tuple[str, int]]:
    return sorted([(o.key, o.size) async for page in store.list_prefix("") for o in page])


async def test_the_daily_lane_runs_every_job_in_order_with_the_spec_events(
    db: Database, clock: FrozenClock, fresh_db_url: str, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}")
    seeded = await _seed(db, store)
    runtime = await make_runtime(db, clock, fresh_db_url, store=store, env=R2)
    with capture_logs() as logs:
        report = await run_lane(runtime, clock, "daily")
    assert report is not None and report.errors == []
    assert [j.name for j in report.jobs] == [
        "reactivateExpiredPauses",
        "hardDeleteExpiredPodcasts",
        "reapUnconfirmedUsers",
        "runReconcile",
        "runOverageEscalation",
    ]
    assert report.totals["podcasts_reactivated"] == 1
    assert report.totals["podcasts_deleted"] == 1 and report.totals["objects_deleted"] == 3
    assert report.totals["users_reaped"] == 1
    names = [e["event"] for e in logs]
    assert names == [
        "lifecycle_cron_started",
        "pause_auto_reactivated",
        "podcast_hard_deleted",
        "r2_cleanup_completed",
        "unconfirmed_users_reaped",
        "scheduled_reconcile",
        "overage_escalation_completed",
        "lifecycle_cron_completed",
    ]
    assert logs[0]["cron"] == "0 4 * * *"
    reconciled = next(e for e in logs if e["event"] == "scheduled_reconcile")
    assert set(reconciled) >= {
        "sizeWritten",
        "orphansDeleted",
        "overCapAccounts",
        "outboxDrained",
        "errors",
        "durationMs",
    }
    completed = logs[-1]
    assert completed["podcasts_reactivated"] == 1 and completed["podcasts_deleted"] == 1
    assert completed["users_reaped"] == 1 and completed["errors"] == 0
    assert await _store_keys(store) == [(f"podcasts/{seeded['paused']}/images/cover.jpg", 3)]
    row = await db.fetch_one(
        "SELECT lane, status FROM nightcrew.runs WHERE id = %(id)s", {"id": report.run_id}
    )
    assert row == {"lane": "daily", "status": "completed"}


async def test_a_daily_dry_run_changes_nothing_anywhere_and_predicts_the_run(
    db: Database, clock: FrozenClock, fresh_db_url: str, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}")
    await _seed(db, store)
    runtime = await make_runtime(db, clock, fresh_db_url, store=store, env=R2)
    db_before, store_before = await _snapshot(db), await _store_keys(store)
    files_before = _files(tmp_path)

    dry = await run_lane(runtime, clock, "daily", dry_run=True)

    assert dry is not None and dry.dry_run and dry.errors == []
    assert await _snapshot(db) == db_before  # rows, queue, run history: byte-for-byte
    assert await _store_keys(store) == store_before
    assert _files(tmp_path) == files_before
    assert await f.queue_messages(db, RSS_INVALIDATION) == []

    real = await run_lane(runtime, clock, "daily")
    assert real is not None
    for key in ("podcasts_reactivated", "podcasts_deleted", "objects_deleted", "users_reaped"):
        assert dry.totals[key] == real.totals[key] > 0, key


async def test_reaper_deletes_only_old_unconfirmed_uninvited_free_users(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    edge = NOW - timedelta(days=7)
    gone = await f.user(db, created_at=OLD)
    on_the_edge = await f.user(db, created_at=edge)  # exactly 7 days: due (<= now - 7 d)
    young = await f.user(db, created_at=edge + timedelta(seconds=1))
    invited = await f.user(db, created_at=OLD, invited_at=OLD)
    confirmed = await f.user(db, created_at=OLD, email_confirmed_at=OLD)
    held = await f.user(db, created_at=OLD)
    await f.account(db, owner_user_id=held)
    with capture_logs() as logs:
        report = await reap_unconfirmed_users(runtime, clock)
    assert (report.deleted, report.reap_skipped) == (2, 1)
    assert logs == [
        {
            "event": "unconfirmed_users_reaped",
            "log_level": "info",
            "deleted": 2,
            "skipped": 1,
            "retention_days": 7,
        }
    ]
    left = {r["id"] for r in await db.fetch("SELECT id::text FROM auth.users")}
    assert left == {young, invited, confirmed, held}
    assert gone not in left and on_the_edge not in left


async def test_a_reaper_that_left_a_user_is_an_ok_job_that_counts_it(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    """Spec 000: the reaper's run is ok; the users it skipped are counted
    (users_reap_skipped), never a job status of "skipped" (that is a job that did not run)."""
    from nightcrew.lifecycle.lanes import DAILY, _isolated

    held = await f.user(db, created_at=OLD)
    await f.account(db, owner_user_id=held)
    [job] = [j for j in DAILY.jobs if j.run is reap_unconfirmed_users]
    outcome = await _isolated(job, runtime, clock, DAILY)
    assert outcome.status == "ok" and outcome.skipped is None
    assert outcome.count("users_reap_skipped") == 1
    assert outcome.to_json()["status"] == "ok"


@pytest.mark.parametrize("ahead", [timedelta(days=-2), timedelta(0), timedelta(days=30)])
async def test_the_reaper_cut_off_is_nightcrews_clock_through_the_spec_signature(
    db: Database, fresh_db_url: str, ahead: timedelta
) -> None:
    """public.reap_unconfirmed_users(interval) cuts off at the database's now() - retention;
    nightcrew passes the retention that puts the cut-off at its own clock - 7 days, whether
    the clock is the database's time, a past slot or a --now a month ahead."""
    clock = FrozenClock(datetime.now(UTC) + ahead)
    runtime = await make_runtime(db, clock, fresh_db_url)
    cut_off = clock.now() - timedelta(days=7)
    due = await f.user(db, created_at=cut_off - timedelta(minutes=1))
    kept = await f.user(db, created_at=cut_off + timedelta(minutes=1))
    report = await reap_unconfirmed_users(runtime, clock)
    assert (report.deleted, report.reap_skipped) == (1, 0)
    left = {r["id"] for r in await db.fetch("SELECT id::text FROM auth.users")}
    assert kept in left and due not in left


async def test_a_failing_overage_scan_is_isolated_and_names_its_cause(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    """The scan's slices run at once; one failing fails the job with its own cause (not a
    group of them), and the lane's other jobs have done their work."""
    await db.execute("DROP FUNCTION public.effective_cap(uuid, text)")
    await f.podcast(db, billing_account_id=await f.account(db))
    paused = await f.podcast(db, status="paused", pause_expires_at=NOW)
    report = await run_lane(runtime, clock, "daily")
    assert report is not None
    [failure] = report.errors
    assert failure["event"] == "overage_escalation_failed"
    assert "effective_cap" in failure["error"], failure
    status = await db.fetch_one(
        "SELECT status FROM public.podcasts WHERE id = %(p)s", {"p": paused}
    )
    assert status == {"status": "active"}


async def test_a_failing_reaper_is_isolated_and_named(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    await db.execute("DROP FUNCTION public.reap_unconfirmed_users")
    paused = await f.podcast(db, status="paused", pause_expires_at=NOW)
    with capture_logs() as logs:
        report = await run_lane(runtime, clock, "daily")
    assert report is not None
    assert [e["event"] for e in report.errors] == ["unconfirmed_users_reap_failed"]
    assert "unconfirmed_users_reap_failed" in [e["event"] for e in logs]
    status = await db.fetch_one(
        "SELECT status FROM public.podcasts WHERE id = %(p)s", {"p": paused}
    )
    assert status == {"status": "active"}  # the jobs before it did their work


async def test_a_replica_starting_after_a_missed_daily_slot_runs_it_once(
    db: Database, fresh_db_url: str
) -> None:
    # 04:00 passed while no replica was up; two replicas start at 06:30.
    clock = FrozenClock(NOW + timedelta(hours=2, minutes=30))
    paused = await f.podcast(db, status="paused", pause_expires_at=NOW - timedelta(hours=1))
    other_db = await Database.open(fresh_db_url)
    try:
        fired = []
        for database in (db, other_db):
            rt = await make_runtime(database, clock, fresh_db_url)
            daily = lane_schedule(rt, clock, "daily")
            assert daily.cron == "0 4 * * *" and daily.catch_up == timedelta(hours=12)
            fired.append(await Scheduler(rt, clock, (daily,)).catch_up(daily))
    finally:
        await other_db.close()
    assert fired == [True, False]
    rows = await db.fetch("SELECT lane, slot, trigger FROM nightcrew.runs")
    assert rows == [{"lane": "daily", "slot": NOW, "trigger": "scheduled"}]
    status = await db.fetch_one(
        "SELECT status FROM public.podcasts WHERE id = %(p)s", {"p": paused}
    )
    assert status == {"status": "active"}
