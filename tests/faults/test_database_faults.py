"""PostgreSQL going away under nightcrew, for real: a TCP proxy on 127.0.0.1 sits between
nightcrew and the server and is cut (connections closed, new ones refused) or blackholed
(connections held open, nothing forwarded) while a lane runs, then restored.

Every run goes through a Database with short bounds (``FAST``: 2 s to connect, 2 s to get a
pooled connection, 2 s of TCP user timeout, 5 s statement timeout), so a lost database has to
surface as ``DatabaseUnavailableError`` within ``BOUND`` seconds, measured. Set-up and checks
use a direct (unproxied) connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from structlog.testing import capture_logs

from nightcrew import runs
from nightcrew.adapters.queues import PODCAST_IMPORTS, PostgresQueueProducer
from nightcrew.clock import FrozenClock
from nightcrew.db.database import ConnectionPolicy, Database
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.lifecycle.lanes import DAILY, MINUTE, run_lane
from nightcrew.scheduler import Schedule, Scheduler
from tests import factories as f
from tests.acceptance.test_cli import _env, _nightcrew
from tests.conftest import NOW, make_runtime
from tests.integration.lifecycle.test_pauses import _paused_podcast
from tests.support.proxy import TcpProxy

T = TypeVar("T")

# How long nightcrew may take to notice that PostgreSQL is gone and say so.
BOUND = 30.0
FAST = ConnectionPolicy(
    connect_timeout=2,
    pool_timeout=2,
    tcp_user_timeout=2,
    keepalives_idle=1,
    keepalives_interval=1,
    keepalives_count=2,
    statement_timeout=5,
    idle_in_transaction_timeout=5,
    max_size=4,
)
STALE = NOW - timedelta(hours=1)
REPO = Path(__file__).resolve().parents[2]


# --- plumbing --------------------------------------------------------------------------------
def _via(url: str, port: int) -> str:
    """The same database URL, through 127.0.0.1:port."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(
        parts._replace(netloc=f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}")
    )


@pytest.fixture
async def proxy(fresh_db_url: str) -> AsyncIterator[TcpProxy]:
    parts = urlsplit(fresh_db_url)
    if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        pytest.skip("the fault tests need PostgreSQL on 127.0.0.1:PORT (DATABASE_URL)")
    tcp = TcpProxy(parts.port)
    await tcp.start()
    try:
        yield tcp
    finally:
        await tcp.restore()  # nothing of this test left hanging on a silent proxy
        await tcp.cut()


@pytest.fixture
async def pdb(proxy: TcpProxy, fresh_db_url: str) -> AsyncIterator[Database]:
    """The test's database, through the proxy, with FAST bounds."""
    database = await Database.open(_via(fresh_db_url, proxy.port), policy=FAST)
    try:
        yield database
    finally:
        await proxy.restore()
        await database.close()


class FaultAfterSends:
    """PostgresQueueProducer (through the proxied database) that makes the fault happen once
    ``after`` messages are in: the next send meets the database gone."""

    def __init__(
        self, db: Database, clock: FrozenClock, *, after: int, fault: Callable[[], Awaitable[None]]
    ) -> None:
        self._inner = PostgresQueueProducer(db, clock)
        self._after = after
        self._fault = fault
        self.sent = 0

    async def send(self, queue: str, body: Mapping[str, Any], delay_seconds: int = 0) -> None:
        await self._inner.send(queue, body, delay_seconds)
        self.sent += 1
        if self.sent == self._after:
            await self._fault()


async def _bounded(
    work: Awaitable[T], bound: float, rescue: Callable[[], Awaitable[None]]
) -> tuple[T | BaseException, float]:
    """Await ``work`` for at most ``bound`` seconds. If it is still running then, ``rescue``
    (bring the database back) so it can unwind, and report a TimeoutError instead of its
    outcome. Returns (result or exception, seconds it took)."""
    started = time.monotonic()
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=bound)
    elapsed = time.monotonic() - started
    if not done:
        await rescue()
        try:
            async with asyncio.timeout(BOUND):
                await task
        except BaseException:  # its outcome does not matter any more: it overran
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        return TimeoutError(f"still running after {bound:.0f} s"), elapsed
    try:
        return task.result(), elapsed
    except BaseException as exc:
        return exc, elapsed


async def _stalled_items(db: Database, count: int) -> str:
    """A running import, dispatched long ago, with ``count`` pending items due for a resend."""
    imp = await f.podcast_import(db, await f.podcast(db), status="running", dispatch_end_at=STALE)
    await db.execute(
        "INSERT INTO public.import_items (import_id, status, attempts, created_at, updated_at)"
        " SELECT %(imp)s, 'pending', 1, %(at)s, %(at)s FROM generate_series(1, %(n)s)",
        {"imp": imp, "at": STALE, "n": count},
    )
    return imp


async def _sent_item_ids(db: Database) -> Counter[str]:
    return Counter(m["body"]["import_item_id"] for m in await f.queue_messages(db, PODCAST_IMPORTS))


async def _run_row(db: Database, lane: str, slot: datetime) -> dict[str, Any]:
    row = await db.fetch_one(
        "SELECT id, status, attempts, report, heartbeat_at FROM nightcrew.runs"
        " WHERE lane = %(lane)s AND slot = %(slot)s",
        {"lane": lane, "slot": slot},
    )
    assert row is not None, f"no {lane} run for slot {slot}"
    return row


# --- 2 and 3: the minute lane loses the database mid-run ---------------------------------------
ITEMS = 240
SENT_BEFORE_FAULT = 70


async def _minute_lane_loses_the_database(
    db: Database,
    pdb: Database,
    proxy: TcpProxy,
    fresh_db_url: str,
    fault: Callable[[], Awaitable[None]],
) -> None:
    await _stalled_items(db, ITEMS)
    clock = FrozenClock(NOW)
    producer = FaultAfterSends(pdb, clock, after=SENT_BEFORE_FAULT, fault=fault)
    runtime = make_runtime(pdb, clock, fresh_db_url, queues=producer)

    outcome, elapsed = await _bounded(
        run_lane(runtime, clock, "minute", trigger="scheduled", slot=NOW), BOUND, proxy.restore
    )
    assert elapsed < BOUND, f"the run did not fail within {BOUND:.0f} s of losing PostgreSQL"
    assert isinstance(outcome, DatabaseUnavailableError), outcome
    assert "lost PostgreSQL" in str(outcome)

    # Exactly the sends made before the fault landed; the claim bumped every item.
    sent = await _sent_item_ids(db)
    assert producer.sent == SENT_BEFORE_FAULT == sum(sent.values()) == len(sent)
    # The run cannot record its failure (failed, retry: true): finish() goes through the same
    # lost database. So the row stays running, with the heartbeat of its claim, for the next
    # run to mark abandoned.
    first = await _run_row(db, "minute", NOW)
    assert first["status"] == "running" and first["heartbeat_at"] == NOW, first

    # The executor consumed what did get through (a consumed item leaves 'pending').
    await db.execute(
        "UPDATE public.import_items SET status = 'completed', updated_at = %(at)s"
        " WHERE id = ANY(%(ids)s::uuid[])",
        {"at": NOW, "ids": list(sent)},
    )

    # The database is back; two minutes on, past the 60 s resend cooldown of the first claim.
    await proxy.restore()
    clock.set(NOW + timedelta(minutes=2))
    again = make_runtime(pdb, clock, fresh_db_url)
    with capture_logs() as logs:
        async with asyncio.timeout(BOUND):
            report = await run_lane(again, clock, "minute", trigger="scheduled", slot=clock.now())
    assert report is not None and report.errors == []
    assert report.total("items_requeued") == ITEMS - SENT_BEFORE_FAULT

    every = await _sent_item_ids(db)
    assert len(every) == ITEMS, "an item that was not sent was not re-sent"
    assert set(every.values()) == {1}, "an item's message is in the queue twice"

    assert (await _run_row(db, "minute", NOW))["status"] == "abandoned"
    assert [e["run_id"] for e in logs if e["event"] == "run_abandoned"] == [first["id"]]
    second = await _run_row(db, "minute", NOW + timedelta(minutes=2))
    assert second["status"] == "completed" and second["attempts"] == 1


async def test_minute_lane_fails_fast_when_the_database_refuses_mid_run_and_the_next_run_resends(
    db: Database, pdb: Database, proxy: TcpProxy, fresh_db_url: str
) -> None:
    """The proxy is cut (every connection closed, new ones refused) after 70 of 240 claimed
    import items were sent: the run raises DatabaseUnavailableError within BOUND, and the next
    run, once the database is back and the cooldown has passed, sends exactly the other 170."""
    await _minute_lane_loses_the_database(db, pdb, proxy, fresh_db_url, proxy.cut)


BLACKHOLE_BUG = (
    "src: nothing bounds a statement waiting for a reply from a peer that acknowledges but never "
    "answers (a frozen server or proxy): tcp_user_timeout only counts unacknowledged bytes, "
    "keepalives are answered by the kernel, statement_timeout is server-side, and the pool's "
    "check_connection() runs unbounded — the run hangs until the proxy is restored"
)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=BLACKHOLE_BUG)
async def test_minute_lane_fails_fast_when_the_database_goes_silent_mid_run(
    db: Database, pdb: Database, proxy: TcpProxy, fresh_db_url: str
) -> None:
    """The proxy is blackholed (connections kept open, not a byte forwarded either way) after
    70 of 240 sends: the run must still raise DatabaseUnavailableError within BOUND, and the
    next run (proxy restored) sends exactly the rest."""

    async def go_silent() -> None:
        proxy.blackhole()

    await _minute_lane_loses_the_database(db, pdb, proxy, fresh_db_url, go_silent)


# --- 4: the CLI -----------------------------------------------------------------------------
async def test_cli_minute_run_cut_mid_run_exits_2_with_one_line(
    db: Database, proxy: TcpProxy, fresh_db_url: str, tmp_path: Path
) -> None:
    """`nightcrew lifecycle run minute` loses PostgreSQL mid-run: the proxy is cut as soon as the
    subprocess logs import_watchdog_found_stalled (its claim of 500 items is committed and its
    500 sends are starting — the test checks that not all of them got through, so the cut did
    land mid-run). It exits 2 within BOUND, its last stderr line naming the loss."""
    await _stalled_items(db, 500)
    env = _env(
        DATABASE_URL=_via(fresh_db_url, proxy.port),
        NIGHTCREW_DATA_DIR=str(tmp_path),
        NIGHTCREW_DB_CONNECT_TIMEOUT_SECONDS="2",
        NIGHTCREW_DB_POOL_TIMEOUT_SECONDS="2",
        NIGHTCREW_DB_TCP_USER_TIMEOUT_SECONDS="2",
        NIGHTCREW_DB_STATEMENT_TIMEOUT_SECONDS="5",
    )
    cli = await asyncio.create_subprocess_exec(
        _nightcrew(),
        *("lifecycle", "run", "minute", "--json", "--now", NOW.isoformat()),
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert cli.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(BOUND):
            while line := (await cli.stderr.readline()).decode():
                lines.append(line.rstrip("\n"))
                if '"import_watchdog_found_stalled"' in line:
                    break
        assert lines and '"import_watchdog_found_stalled"' in lines[-1], lines
        await proxy.cut()
        cut_at = time.monotonic()
        async with asyncio.timeout(BOUND):
            stdout, rest = await cli.communicate()
        elapsed = time.monotonic() - cut_at
    finally:
        if cli.returncode is None:
            cli.kill()
            await cli.wait()
    lines += rest.decode().splitlines()
    stderr = "\n".join(lines)

    assert elapsed < BOUND
    assert cli.returncode == 2, stderr
    assert stdout == b""
    dbname = urlsplit(fresh_db_url).path.lstrip("/")
    assert lines[-1].startswith(f"nightcrew: lost PostgreSQL at 127.0.0.1:{proxy.port}/{dbname}")
    assert "\n" not in lines[-1] and "Traceback" not in stderr
    for line in lines[:-1]:  # everything before it is a structured log line
        json.loads(line)
    sent = len(await _sent_item_ids(db))
    print(f"CLI: {sent} of 500 sent before the cut; last line: {lines[-1]}")
    assert sent < 500, "the cut came after the run had finished"
    # started, and could not record its end: finish() needs the database it lost
    [run] = await db.fetch("SELECT status FROM nightcrew.runs WHERE lane = 'minute'")
    assert run["status"] == "running"


# --- 5: the scheduler rides out an outage --------------------------------------------------------
class FastClock:
    """Real time from ``start``, ``factor`` times faster; ``sleep`` waits accordingly."""

    def __init__(self, start: datetime, factor: float) -> None:
        self._start = start
        self._factor = factor
        self._t0 = time.monotonic()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._t0) * self._factor)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self._factor)


async def _slots(db: Database, after: datetime) -> list[dict[str, Any]]:
    return await db.fetch(
        "SELECT slot, status, report FROM nightcrew.runs"
        " WHERE lane = 'minute' AND slot > %(after)s ORDER BY slot",
        {"after": after},
    )


async def _until_completed(db: Database, after: datetime, count: int, within: float) -> None:
    """Wait (at most ``within`` seconds) for ``count`` completed slots after ``after``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        rows = await _slots(db, after)
        if sum(r["status"] == "completed" for r in rows) >= count:
            return
        await asyncio.sleep(0.1)


async def test_scheduler_slots_complete_after_an_outage_and_after_backends_are_killed(
    db: Database, pdb: Database, proxy: TcpProxy, fresh_db_url: str, pg_admin_url: str
) -> None:
    """A scheduler whose minute slots come every 2 s (clock 30x real time) loses PostgreSQL:
    the proxy is cut for 5 s (the slots in between fail), then restored — every slot after
    that completes: no dead pooled connection fails one. Then the server terminates every
    nightcrew backend of the database (pg_terminate_backend, between two slots): the next
    slots complete too, on new connections."""
    clock = FastClock(NOW - timedelta(seconds=5), factor=30)
    runtime = make_runtime(pdb, clock, fresh_db_url)
    schedule = Schedule(lane="minute", cron=MINUTE.cron)
    scheduler = Scheduler(runtime, clock, (schedule,), sleep=clock.sleep)
    dbname = urlsplit(fresh_db_url).path.lstrip("/")
    with capture_logs() as logs:
        loop = asyncio.create_task(scheduler.run())
        try:
            await _until_completed(db, NOW - timedelta(minutes=1), 2, within=10)

            cut = clock.now()
            await proxy.cut()
            await asyncio.sleep(5)
            await proxy.restore()
            restored = clock.now()
            # Right after a slot completed: the next one is ~2 s away, nothing is in flight.
            await _until_completed(db, restored, 3, within=12)

            accepted = proxy.accepted
            async with await psycopg.AsyncConnection.connect(
                pg_admin_url, autocommit=True
            ) as admin:
                cur = await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = 'nightcrew' AND datname = %(db)s",
                    {"db": dbname},
                )
                assert len(await cur.fetchall()) >= 2  # the proxied pool's and the test's
            terminated = clock.now()
            await _until_completed(db, terminated, 2, within=8)
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    failed = [
        datetime.fromisoformat(e["slot"]) for e in logs if e["event"] == "scheduler_fire_failed"
    ]
    assert any(cut < slot < restored for slot in failed), "the outage failed no slot"
    assert not [slot for slot in failed if slot > restored], logs

    after_restore = await _slots(db, restored)
    assert [r["status"] for r in after_restore] == ["completed"] * len(after_restore), [
        (r["slot"].isoformat(), r["status"], r["report"]) for r in after_restore
    ]
    assert len(after_restore) >= 5, after_restore
    assert sum(r["slot"] > terminated for r in after_restore) >= 2
    assert proxy.accepted > accepted, "the killed pooled connections were not replaced"


# --- 6: a daily run SIGKILLed mid-run ------------------------------------------------------------
@contextlib.asynccontextmanager
async def _silent_http() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """An HTTP server on 127.0.0.1 that accepts and reads, and never answers."""
    called = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        called.set()
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", called
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_sigkilled_daily_run_is_abandoned_and_its_slot_run_again(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    """A process runs the daily lane's 04:00 slot and is SIGKILLed inside it (waiting on a
    Stripe that never answers, resuming billing for an expired pause): its row stays
    `running`. Past ABANDON_AFTER_SECONDS the scheduler's catch-up marks it abandoned,
    re-claims the same row (attempts 2) and runs it to completed."""
    podcast, _ = await _paused_podcast(db, expires=NOW - timedelta(days=1))
    log = tmp_path / "worker.log"
    async with _silent_http() as (stripe_url, called):
        with log.open("wb") as sink:
            worker = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "tests.faults._daily_claim", fresh_db_url, stripe_url),
                cwd=REPO,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
            )
        try:
            try:
                async with asyncio.timeout(BOUND):
                    await called.wait()  # inside the daily run, waiting on Stripe
            except TimeoutError:
                pytest.fail(f"the worker never called Stripe:\n{log.read_text()}")
            first = await _run_row(db, "daily", NOW)
            assert first["status"] == "running" and first["attempts"] == 1
            worker.send_signal(signal.SIGKILL)
            async with asyncio.timeout(10):
                assert await worker.wait() == -signal.SIGKILL
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()

    assert (await _run_row(db, "daily", NOW))["status"] == "running"  # nobody finished it
    reactivated = await db.fetch_one(
        "SELECT status FROM public.podcasts WHERE id = %(id)s", {"id": podcast}
    )
    assert reactivated == {"status": "active"}  # the killed run got that far, and committed it

    clock = FrozenClock(NOW + timedelta(seconds=runs.ABANDON_AFTER_SECONDS + 60))
    schedule = Schedule(lane="daily", cron=DAILY.cron, catch_up=DAILY.catch_up)
    scheduler = Scheduler(make_runtime(db, clock, fresh_db_url), clock, (schedule,))
    with capture_logs() as logs:
        async with asyncio.timeout(BOUND):
            assert await scheduler.catch_up(schedule) is True

    again = await _run_row(db, "daily", NOW)
    assert again["id"] == first["id"]
    assert again["attempts"] == 2 and again["status"] == "completed", again
    abandoned = [e for e in logs if e["event"] == "run_abandoned"]
    assert [(e["run_id"], e["slot"]) for e in abandoned] == [(first["id"], NOW.isoformat())]
