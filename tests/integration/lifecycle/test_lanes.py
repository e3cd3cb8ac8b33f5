"""The minute lane as a whole: concurrency across replicas, isolation, run history."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.queues import EXTERNAL_EPISODE_LINK, PODCAST_IMPORTS
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.lanes import LaneReport, run_lane
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.conftest import NOW, make_runtime

OLD = NOW - timedelta(hours=6)


async def _seed_every_kind_of_work(
    db: Database,
    *,
    imports: int = 6,
    items: int = 50,
    previews: int = 30,
    links: int = 40,
    media: int = 20,
) -> None:
    for _ in range(imports):
        imp = await f.podcast_import(db, await f.podcast(db), status="running", dispatch_end_at=OLD)
        await db.execute(
            "INSERT INTO public.import_items (import_id, status, attempts, updated_at)"
            " SELECT %(imp)s, CASE WHEN g %% 5 = 0 THEN 'processing' ELSE 'pending' END,"
            " g %% 7, %(at)s FROM generate_series(1, %(n)s) g",
            {"imp": imp, "at": OLD, "n": items},
        )
    for _ in range(previews):
        await f.podcast_import(
            db, await f.podcast(db), status="preview", is_hosting_migration=True, created_at=OLD
        )
    external = await f.podcast(db, hosting_type="external")
    await db.execute(
        "INSERT INTO public.episodes (podcast_id, status, published_at, external_link_status,"
        " external_link_next_attempt_at) SELECT %(p)s, 'published', %(at)s, 'pending', %(at)s"
        " FROM generate_series(1, %(n)s)",
        {"p": external, "at": OLD, "n": links},
    )
    for n in range(media):
        episode = await f.episode(db, external, title=f"media {n}")
        await f.media_job(db, episode, updated_at=OLD)


async def test_two_ticks_at_the_same_instant_do_no_double_work(
    db: Database, runtime: Runtime, clock: FrozenClock, fresh_db_url: str
) -> None:
    await _seed_every_kind_of_work(db)
    other_db = await Database.open(fresh_db_url)
    try:
        other = await make_runtime(other_db, clock, fresh_db_url)
        reports = await asyncio.gather(
            run_lane(runtime, clock, "minute"), run_lane(other, clock, "minute")
        )
    finally:
        await other_db.close()
    assert all(isinstance(r, LaneReport) and not r.errors for r in reports)

    items = Counter(
        m["body"]["import_item_id"] for m in await f.queue_messages(db, PODCAST_IMPORTS)
    )
    assert len(items) == 6 * 50 and set(items.values()) == {1}
    links = Counter(
        m["body"]["episode_id"] for m in await f.queue_messages(db, EXTERNAL_EPISODE_LINK)
    )
    assert len(links) == 40 and set(links.values()) == {1}

    def total(key: str) -> int:
        return sum(r.total(key) for r in reports if r is not None)

    assert total("items_requeued") == 300
    assert total("links_requeued") == 40
    assert total("previews_canceled") == 30
    assert total("media_jobs_flagged") == 20
    canceled = await db.fetch_one(
        "SELECT count(*) AS n FROM public.podcast_imports WHERE status = 'canceled'"
    )
    assert canceled == {"n": 30}


# Each sweep's claim UPDATE hits one table; a trigger there makes exactly that sweep throw.
BREAKERS = {
    "sweepStalledImports": ("public.import_items", "import_watchdog_failed"),
    "sweepStalledExternalLinks": ("public.episodes", "external_link_watchdog_failed"),
    "sweepStuckHostingMigrationPreviews": (
        "public.podcast_imports",
        "hosting_migration_preview_watchdog_failed",
    ),
    "sweepWedgedMediaJobs": ("public.media_jobs", "media_job_watchdog_failed"),
}


@pytest.mark.parametrize("broken", list(BREAKERS))
async def test_one_sweep_raising_never_stops_the_others(
    db: Database, runtime: Runtime, clock: FrozenClock, broken: str
) -> None:
    await _seed_every_kind_of_work(db, imports=1, items=10, previews=3, links=4, media=2)
    table, failed_event = BREAKERS[broken]
    await db.execute(
        "CREATE FUNCTION public.explode() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'disk on fire'; END $$"
    )
    await db.execute(
        f"CREATE TRIGGER explode BEFORE UPDATE ON {table}"
        " FOR EACH ROW EXECUTE FUNCTION public.explode()"
    )

    with capture_logs() as logs:
        report = await run_lane(runtime, clock, "minute")
    assert report is not None

    expected = {
        "sweepStalledImports": ("items_requeued", 10),
        "sweepStalledExternalLinks": ("links_requeued", 4),
        "sweepStuckHostingMigrationPreviews": ("previews_canceled", 3),
        "sweepWedgedMediaJobs": ("media_jobs_flagged", 2),
        "deliverEffects": ("effects_delivered", 0),
    }
    for outcome in report.jobs:
        key, count = expected[outcome.name]
        if outcome.name == broken:
            assert not outcome.ok and "disk on fire" in (outcome.crashed or "")
            assert outcome.errors == [{"event": failed_event, "error": outcome.crashed}]
        else:
            assert outcome.ok and outcome.count(key) == count, outcome
    assert report.errors == [
        {"job": broken, "event": failed_event, "error": "QueryError: disk on fire"}
    ]
    failures = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in failures] == [failed_event]
    completed = [e for e in logs if e["event"] == "import_watchdog_completed"]
    assert len(completed) == 1 and completed[0]["errors"] == 1
    started = [e for e in logs if e["event"] == "lifecycle_cron_started"]
    assert started[0]["cron"] == "* * * * *"


async def test_every_run_writes_a_run_history_row(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    await _seed_every_kind_of_work(db, imports=1, items=3, previews=1, links=1, media=1)
    report = await run_lane(runtime, clock, "minute")
    assert report is not None
    row = await db.fetch_one(
        "SELECT * FROM nightcrew.runs WHERE id = %(id)s", {"id": report.run_id}
    )
    assert row is not None
    assert row["lane"] == "minute" and row["trigger"] == "manual" and row["slot"] is None
    assert row["status"] == "completed" and row["started_at"] == NOW
    assert row["report"]["items_requeued"] == 3
    assert row["report"]["jobs"]["sweepWedgedMediaJobs"]["media_jobs_flagged"] == 1
    m = runtime.metrics
    assert m.value("nightcrew_lane_runs_total", lane="minute", status="completed") == 1
    assert m.value("nightcrew_job_items_total", lane="minute", count="items_requeued") == 3
    assert m.value("nightcrew_lane_last_success_timestamp_seconds", lane="minute") == (
        NOW.timestamp()
    )


async def test_a_scheduled_slot_runs_once_across_replicas(
    db: Database, runtime: Runtime, clock: FrozenClock, fresh_db_url: str
) -> None:
    await _seed_every_kind_of_work(db, imports=1, items=5, previews=0, links=0, media=0)
    slot = NOW.replace(second=0)
    dbs = [await Database.open(fresh_db_url) for _ in range(3)]
    try:
        replicas = [await make_runtime(d, clock, fresh_db_url) for d in dbs]
        results = await asyncio.gather(
            *(run_lane(r, clock, "minute", trigger="scheduled", slot=slot) for r in replicas)
        )
    finally:
        for d in dbs:
            await d.close()
    ran = [r for r in results if r is not None]
    assert len(ran) == 1
    rows = await db.fetch("SELECT trigger, slot, status FROM nightcrew.runs")
    assert rows == [{"trigger": "scheduled", "slot": slot, "status": "completed"}]
    assert len(await f.queue_messages(db, PODCAST_IMPORTS)) == 5


async def _snapshot(db: Database) -> dict[str, str]:
    """A digest of every row of every table nightcrew could touch."""
    tables = await db.fetch(
        "SELECT schemaname || '.' || tablename AS t FROM pg_tables"
        " WHERE schemaname IN ('public', 'auth', 'nightcrew') ORDER BY 1"
    )
    digests = {}
    for row in tables:
        table = row["t"]
        digest = await db.fetch_one(
            f"SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) AS d"
            f" FROM {table} x"
        )
        assert digest is not None
        digests[table] = digest["d"]
    return digests


async def test_a_dry_run_reports_exactly_what_a_run_does_and_changes_nothing(
    db: Database, runtime: Runtime, clock: FrozenClock, fresh_db_url: str
) -> None:
    await _seed_every_kind_of_work(db, imports=2, items=10, previews=3, links=4, media=2)
    before = await _snapshot(db)
    with capture_logs() as logs:
        dry = await run_lane(runtime, clock, "minute", dry_run=True)
    assert dry is not None and dry.dry_run and dry.run_id is None
    assert await _snapshot(db) == before  # database and queue byte-for-byte unchanged
    assert next(e["event"] for e in logs) == "lifecycle_cron_started"

    real = await run_lane(runtime, clock, "minute")
    assert real is not None and not real.dry_run
    for key in ("items_requeued", "links_requeued", "previews_canceled", "media_jobs_flagged"):
        assert dry.total(key) == real.total(key) > 0, key
    assert await _snapshot(db) != before
    runs = await db.fetch("SELECT id FROM nightcrew.runs")
    assert [r["id"] for r in runs] == [real.run_id]  # the dry run left no history row


@pytest.mark.parametrize("short_statements", [False, True], ids=["daily", "minute"])
async def test_a_job_whose_connection_went_silent_fails_alone_in_the_daily_lane_only(
    db: Database, fresh_db_url: str, short_statements: bool
) -> None:
    """Spec 000: "a reconcile failure cannot block the rest of daily maintenance". A job whose
    own connection went silent (a NAT or firewall dropping the reconciler's long session; the
    client called it lost at its deadline) while the database still answers a fresh one: in
    the daily lane it fails alone, its *_failed event logged, and the next job runs; the
    minute lane, whose stop is bounded, stops at once without asking."""
    from nightcrew.errors import DatabaseUnavailableError
    from nightcrew.lifecycle.lanes import Job, Lane, run_jobs

    clock = FrozenClock(NOW)
    runtime = await make_runtime(db, clock, fresh_db_url)
    ran: list[str] = []

    async def silent(runtime: Runtime, clock: object) -> LaneReport:
        ran.append("silent")
        raise DatabaseUnavailableError("no reply from PostgreSQL within 135 s", silent=True)

    async def escalate(runtime: Runtime, clock: object) -> object:
        ran.append("escalate")
        row = await runtime.db.fetch_one("SELECT 1 AS answered")  # on a healthy connection
        assert row is not None and row["answered"] == 1
        return _Nothing()

    lane = Lane(
        name="test",
        cron="0 4 * * *",
        concurrent=False,
        short_statements=short_statements,
        completed_event="test_completed",
        jobs=(
            Job(name="runReconcile", failed_event="scheduled_reconcile_failed", run=silent),
            Job(name="runOverageEscalation", failed_event="overage_failed", run=escalate),
        ),
    )
    with capture_logs() as logs:
        if short_statements:
            with pytest.raises(DatabaseUnavailableError):
                await run_jobs(runtime, clock, lane)
        else:
            report = await run_jobs(runtime, clock, lane)
    if short_statements:
        assert ran == ["silent"]
        assert "scheduled_reconcile_failed" not in [e["event"] for e in logs]
        return
    assert ran == ["silent", "escalate"]
    assert [j.ok for j in report.jobs] == [False, True]
    [failed] = [e for e in logs if e["event"] == "scheduled_reconcile_failed"]
    assert "no reply from PostgreSQL" in failed["error"]


class _Nothing:
    errors: tuple[object, ...] = ()

    def counts(self) -> dict[str, int]:
        return {}

    def to_json(self) -> dict[str, object]:
        return {}
