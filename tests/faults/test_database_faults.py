"""PostgreSQL going away under nightcrew, for real: a TCP proxy on 127.0.0.1 sits between
nightcrew and the server and is cut (connections closed, new ones refused) or blackholed
(connections held open, nothing forwarded) while a lane runs, then restored.

Most runs go through a Database with short bounds (``FAST``: 2 s to connect, 2 s to get a
pooled connection, 2 s of TCP user timeout, 5 s statement timeout), so a lost database has to
surface as ``DatabaseUnavailableError`` within ``BOUND`` seconds, measured; one runs a minute
slot with the default settings and holds it to the README's bound (``DEFAULT_MINUTE_BOUND``).
Set-up and checks use a direct (unproxied) connection. The server may be on 127.0.0.1:PORT or,
as the embedded pgserver is, on a Unix socket only: the proxy then forwards to the socket.
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
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from psycopg_pool.base import AttemptWithBackoff
from structlog.testing import capture_logs

from nightcrew import runs
from nightcrew.adapters.queues import PODCAST_IMPORTS, PostgresQueueProducer
from nightcrew.clock import FrozenClock
from nightcrew.db.connection import ConnectionPolicy
from nightcrew.db.database import Database
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.http import create_app
from nightcrew.lifecycle.lanes import lane_schedule, run_lane
from nightcrew.scheduler import Scheduler
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
    """The same database URL, through 127.0.0.1:port (a Unix socket's ``host=`` dropped)."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")])
    return urlunsplit(
        parts._replace(
            netloc=f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}", query=query
        )
    )


class UnixUpstreamProxy(TcpProxy):
    """The same proxy in front of a server that listens on a Unix socket only (the embedded
    pgserver, started with no TCP address): nightcrew still talks TCP to 127.0.0.1, so what
    the proxy does to that connection (cut, blackhole) is what a network does."""

    def __init__(self, socket_path: str) -> None:
        super().__init__(0)
        self._socket_path = socket_path

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self._socket_path)
        except OSError:
            writer.close()
            return
        self._open |= {writer, up_writer}
        for task in (
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


def _proxy_for(url: str) -> TcpProxy | None:
    """A proxy in front of the server at ``url``: on 127.0.0.1:PORT, or on a Unix socket
    (``?host=/dir``, as the embedded pgserver's URL has it); None for anything else."""
    parts = urlsplit(url)
    if parts.hostname in ("127.0.0.1", "localhost") and parts.port is not None:
        return TcpProxy(parts.port)
    options = dict(parse_qsl(parts.query))
    directory = options.get("host", "")
    if not parts.hostname and directory.startswith("/"):
        return UnixUpstreamProxy(f"{directory}/.s.PGSQL.{options.get('port', '5432')}")
    return None


@pytest.fixture
async def proxy(fresh_db_url: str) -> AsyncIterator[TcpProxy]:
    tcp = _proxy_for(fresh_db_url)
    if tcp is None:
        pytest.skip("the fault tests need PostgreSQL on 127.0.0.1:PORT or on a Unix socket")
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
        self.faulted_at: float | None = None  # time.monotonic() when the fault happened

    async def send(self, queue: str, body: Mapping[str, Any], delay_seconds: int = 0) -> None:
        await self._inner.send(queue, body, delay_seconds)
        self.sent += 1
        if self.sent == self._after:
            self.faulted_at = time.monotonic()
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


async def _any_sent(db: Database) -> bool:
    return bool(await _sent_item_ids(db))


async def _eventually(
    check: Callable[[], Awaitable[bool]], *, within: float, every: float = 0.1
) -> bool:
    """Whether ``check`` came true within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        if await check():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every)


def _reconnect_bound(outage: float, policy: ConnectionPolicy) -> float:
    """How long after the server is back a pool that lost it for ``outage`` seconds may take to
    hand out a connection again. psycopg_pool retries a failed connect on a backoff of its own
    (1 s ± 10 %, doubling): attempts at d, 3d, 7d, … after the loss, so the one pending when
    the server returns comes at most ``outage + d`` later. Then a connect (``connect_timeout``)
    and a checkout (``pool_timeout``, whose own check may back off once more). Doubled, plus
    10 s: on a busy 2-core machine every step runs late, and only a pool that never comes
    back should miss this."""
    first = AttemptWithBackoff.INITIAL_DELAY * (1 + AttemptWithBackoff.DELAY_JITTER)
    return 2 * (outage + first + policy.connect_timeout + policy.pool_timeout) + 10.0


async def _answers(db: Database) -> bool:
    try:
        await db.fetch_one("SELECT 1")
    except DatabaseUnavailableError:
        return False
    return True


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
    runtime = await make_runtime(pdb, clock, fresh_db_url, queues=producer)

    outcome, elapsed = await _bounded(
        run_lane(runtime, clock, "minute", trigger="scheduled", slot=NOW), BOUND, proxy.restore
    )
    assert elapsed < BOUND, f"the run did not fail within {BOUND:.0f} s of losing PostgreSQL"
    assert isinstance(outcome, DatabaseUnavailableError), outcome
    assert "lost PostgreSQL" in str(outcome)

    # Exactly the sends made before the fault landed; the claim bumped every item.
    sent = await _sent_item_ids(db)
    assert producer.sent == SENT_BEFORE_FAULT == sum(sent.values()) == len(sent)
    claimed = await db.fetch_one(
        "SELECT count(*) AS n FROM public.import_items WHERE updated_at = %(now)s", {"now": NOW}
    )
    assert claimed == {"n": ITEMS}
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

    # The database is back. The proxied pool reconnects on its own backoff, which grew with
    # the outage (the longer a busy machine took over the checks above, the later its next
    # try): the next run starts once the pool answers again, within a bound derived from
    # that backoff and FAST's timeouts — not within one pool timeout of the restore.
    await proxy.restore()
    assert producer.faulted_at is not None
    outage = time.monotonic() - producer.faulted_at
    bound = _reconnect_bound(outage, FAST)
    assert await _eventually(lambda: _answers(pdb), within=bound), (
        f"the pool did not reconnect within {bound:.0f} s of the end of a {outage:.1f} s outage"
    )
    # Two minutes on, past the 60 s resend cooldown of the first claim.
    clock.set(NOW + timedelta(minutes=2))
    again = await make_runtime(pdb, clock, fresh_db_url)
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


async def test_minute_lane_fails_fast_when_the_database_goes_silent_mid_run(
    db: Database, pdb: Database, proxy: TcpProxy, fresh_db_url: str
) -> None:
    """The proxy is blackholed (connections kept open, not a byte forwarded either way) after
    70 of 240 sends: the run must still raise DatabaseUnavailableError within BOUND, and the
    next run (proxy restored) sends exactly the rest."""

    async def go_silent() -> None:
        proxy.blackhole()

    await _minute_lane_loses_the_database(db, pdb, proxy, fresh_db_url, go_silent)


async def test_a_statement_cut_in_flight_names_the_database(pdb: Database, proxy: TcpProxy) -> None:
    """The proxy is cut while a statement (pg_sleep) is in flight: DatabaseUnavailableError at
    once, and its one line names where PostgreSQL was lost, like every other such error."""
    statement = asyncio.create_task(pdb.execute("SELECT pg_sleep(3)"))
    await asyncio.sleep(0.5)
    await proxy.cut()
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError) as lost:
        await statement
    assert time.monotonic() - started < BOUND
    assert str(lost.value).startswith(f"lost PostgreSQL at {pdb.target}: "), str(lost.value)


async def test_a_transaction_silenced_past_the_servers_idle_timeout_is_an_outage(
    pdb: Database, proxy: TcpProxy
) -> None:
    """A transaction whose next statement a silent network holds past the server's
    idle-in-transaction timeout (FAST: 5 s): the server ends the session (SQLSTATE 25P03), and
    the client hears it once the network is back. That is the database lost — an outage to wait
    out — not a statement refused, which the pipeline would dead-letter as its message's fault."""
    async with pdb.transaction() as tx:
        await tx.execute("SELECT 1")
        proxy.blackhole()
        statement = asyncio.create_task(tx.execute("SELECT 2"))
        await asyncio.sleep(FAST.idle_in_transaction_timeout + 1.5)
        await proxy.restore()
        with pytest.raises(DatabaseUnavailableError) as lost:
            await statement
    assert str(lost.value).startswith(f"lost PostgreSQL at {pdb.target}: "), str(lost.value)
    assert "idle-in-transaction timeout" in str(lost.value)


# --- 4: the CLI -----------------------------------------------------------------------------
async def test_cli_minute_run_cut_mid_run_exits_2_with_one_line(
    db: Database, proxy: TcpProxy, fresh_db_url: str, tmp_path: Path
) -> None:
    """`nightcrew lifecycle run minute` loses PostgreSQL mid-run: once the subprocess has logged
    import_watchdog_found_stalled (its claim of 500 items is committed) and its first messages
    are in the queue, the proxy is cut — mid-run for real: the test checks that some but not
    all of the 500 sends got through. It exits 2 within BOUND, its last stderr line naming the
    loss, and nothing before that line is anything but a structured log line."""
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
        assert await _eventually(lambda: _any_sent(db), within=BOUND, every=0.005)
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
    # "lost PostgreSQL at 127.0.0.1:PORT/DB: no connection within the pool timeout" when the
    # cut falls between two statements; "lost PostgreSQL: consuming input failed: server closed
    # the connection unexpectedly" when it falls on one in flight (which does not name where:
    # see test_a_statement_cut_in_flight_names_the_database)
    assert lines[-1].startswith("nightcrew: lost PostgreSQL"), stderr
    assert "Traceback" not in stderr
    for line in lines[:-1]:  # everything before it is a structured log line
        json.loads(line)
    sent = len(await _sent_item_ids(db))
    assert 0 < sent < 500, f"{sent} of 500 sent: the cut did not land mid-run"
    # started, and could not record its end: finish() needs the database it lost
    [run] = await db.fetch("SELECT status FROM nightcrew.runs WHERE lane = 'minute'")
    assert run["status"] == "running"


# --- 4b: default settings, the server going silent under a statement in flight ----------------
# The README's bound for the minute lane with the default settings: its statement deadline
# (NIGHTCREW_DB_MINUTE_STATEMENT_TIMEOUT_SECONDS, 10 s), a heartbeat in flight at that moment
# (bounded by its 10 s interval), one 5 s try to record the failure, and the pool's close.
DEFAULT_MINUTE_BOUND = 30.0


async def _lock_waiter(db: Database, dbname: str) -> bool:
    row = await db.fetch_one(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'nightcrew'"
        " AND datname = %(db)s AND state = 'active' AND wait_event_type = 'Lock'",
        {"db": dbname},
    )
    return row is not None and row["n"] > 0


@pytest.mark.slow
async def test_minute_slot_blackholed_in_flight_with_default_settings_stops_within_the_bound(
    db: Database, proxy: TcpProxy, fresh_db_url: str, tmp_path: Path
) -> None:
    """The minute lane's 04:00 slot runs in a process of its own with the DEFAULT database
    settings (no FAST), through the CLI's error handling. Its claim of the stalled items waits
    on a table lock the test holds — a statement provably in flight (pg_stat_activity says
    so) — when the proxy goes silent (blackhole: connections held open, the kernel still
    acknowledging, nothing answered, which no TCP keepalive or user timeout sees). The lock is
    then released, so the server answers into the void. The process exits 2 within the
    documented bound, its last stderr line naming the loss and every line before it JSON; once
    the database is back the run row is finished (failed, retry) or marked abandoned, and the
    next scheduler tick for the slot claims it again and completes it."""
    await _stalled_items(db, 50)
    dbname = urlsplit(fresh_db_url).path.lstrip("/")
    env = _env(DATABASE_URL=_via(fresh_db_url, proxy.port), NIGHTCREW_DATA_DIR=str(tmp_path))
    async with await psycopg.AsyncConnection.connect(fresh_db_url) as locker:
        await locker.execute("LOCK TABLE public.import_items IN ACCESS EXCLUSIVE MODE")
        worker = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.faults._minute_slot"),
            env=env,
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            waiting = await _eventually(lambda: _lock_waiter(db, dbname), within=60)
            assert waiting, "the minute lane never reached its claim of the stalled items"
            proxy.blackhole()
            lost_at = time.monotonic()
            await locker.rollback()  # the claim completes on the server; its answer is held
            async with asyncio.timeout(DEFAULT_MINUTE_BOUND + 60):
                stdout, stderr = await worker.communicate()
            elapsed = time.monotonic() - lost_at
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()

    lines = stderr.decode().splitlines()
    assert elapsed <= DEFAULT_MINUTE_BOUND, (elapsed, lines[-3:])
    assert worker.returncode == 2, stderr.decode()
    assert stdout == b""
    assert lines[-1].startswith("nightcrew: lost PostgreSQL at "), lines[-1]
    for line in lines[:-1]:
        json.loads(line)
    assert await _sent_item_ids(db) == Counter()  # the claim's answer never arrived

    await proxy.restore()
    first = await _run_row(db, "minute", NOW)
    assert first["status"] in ("running", "failed"), first
    if first["status"] == "failed":
        assert first["report"]["retry"] is True, first
    # The next tick for the slot, once the dead run's heartbeat is past the grace period
    # (a failed-for-retry row is re-claimable at once; a running one after the grace).
    clock = FrozenClock(NOW + timedelta(seconds=runs.ABANDON_AFTER_SECONDS + 30))
    rt = await make_runtime(db, clock, fresh_db_url)
    scheduler = Scheduler(rt, clock, (lane_schedule(rt, clock, "minute"),))
    async with asyncio.timeout(BOUND):
        assert await scheduler.fire("minute", NOW) is True
    again = await _run_row(db, "minute", NOW)
    assert again["id"] == first["id"] and again["attempts"] == 2, again
    assert again["status"] == "completed", again
    assert len(await _sent_item_ids(db)) == 50


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


class SlotWatch:
    """Reads nightcrew.runs over a direct connection of its own (not a 'nightcrew' one)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def slots(self, after: datetime) -> list[tuple[datetime, str, Any]]:
        cur = await self._conn.execute(
            "SELECT slot, status, report FROM nightcrew.runs"
            " WHERE lane = 'minute' AND slot > %(after)s ORDER BY slot",
            {"after": after},
        )
        return list(await cur.fetchall())

    async def completed(self, after: datetime, count: int, within: float) -> None:
        """Wait (at most ``within`` seconds) for ``count`` completed slots after ``after``."""

        async def enough() -> bool:
            rows = await self.slots(after)
            return sum(status == "completed" for _, status, _ in rows) >= count

        await _eventually(enough, within=within)


@contextlib.asynccontextmanager
async def _scheduler_every_2_s(
    pdb: Database, fresh_db_url: str
) -> AsyncIterator[tuple[FastClock, SlotWatch, list[Any]]]:
    """The minute lane's Scheduler on the proxied database, a slot every 2 s of real time
    (clock 30x), warmed up by two completed slots. Yields (clock, watch, captured logs)."""
    clock = FastClock(NOW - timedelta(seconds=5), factor=30)
    rt = await make_runtime(pdb, clock, fresh_db_url)
    scheduler = Scheduler(rt, clock, (lane_schedule(rt, clock, "minute"),), sleep=clock.sleep)
    async with await psycopg.AsyncConnection.connect(fresh_db_url, autocommit=True) as conn:
        watch = SlotWatch(conn)
        with capture_logs() as logs:
            loop = asyncio.create_task(scheduler.run())
            try:
                await watch.completed(NOW - timedelta(minutes=1), 2, within=10)
                yield clock, watch, logs
            finally:
                loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop


def _every_minute(rows: list[tuple[datetime, str, Any]], after: datetime) -> bool:
    """Whether the rows are the consecutive minute slots after ``after`` (none skipped: a slot
    whose claim failed has no row at all)."""
    first = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return [slot for slot, _, _ in rows] == [first + timedelta(minutes=n) for n in range(len(rows))]


def _fire_failures(logs: list[Any]) -> list[datetime]:
    return [
        datetime.fromisoformat(e["slot"]) for e in logs if e["event"] == "scheduler_fire_failed"
    ]


STALLED_IN_CUT = 120


async def _until(check: Callable[[], bool], *, within: float) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within:g} s"
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_scheduler_slots_all_complete_once_a_cut_database_is_back(
    db: Database, pdb: Database, proxy: TcpProxy, fresh_db_url: str
) -> None:
    """A scheduler whose minute slots come every 2 s (clock 30x real time) loses PostgreSQL:
    the proxy is cut until two slots have failed, and meanwhile 120 import items stall
    (written over a direct connection: the platform keeps working while nightcrew cannot reach
    the database). Restored: every slot after that completes — no dead pooled connection, no
    reconnection backoff fails one — and the first of them re-sends all 120 stalled items: the
    work of the slots lost to the cut is done by the next tick."""
    async with _scheduler_every_2_s(pdb, fresh_db_url) as (clock, watch, logs):
        cut = clock.now()
        await proxy.cut()
        await _stalled_items(db, STALLED_IN_CUT)
        await _until(lambda: len([s for s in _fire_failures(logs) if s > cut]) >= 2, within=60)
        assert await _sent_item_ids(db) == Counter()  # nothing got through the cut
        await proxy.restore()
        restored = clock.now()
        await watch.completed(restored, 4, within=20)

    failed = _fire_failures(logs)
    assert any(cut < slot < restored for slot in failed), "the outage failed no slot"
    after = await watch_slots(fresh_db_url, restored)
    assert len(after) >= 4 and _every_minute(after, restored), after
    assert [status for _, status, _ in after] == ["completed"] * len(after), after
    assert not [slot for slot in failed if slot > restored]
    # The first slot to complete since the cut (nothing got through before the restore, so it
    # ran after it: the slot that was waiting for a connection when the database came back, or
    # the next one) sent every item that stalled during the cut.
    since_cut = await watch_slots(fresh_db_url, cut)
    [(slot, report), *_] = [(sl, rep) for sl, status, rep in since_cut if status == "completed"]
    assert slot <= restored + timedelta(minutes=1), (slot, restored)
    assert report["items_requeued"] == STALLED_IN_CUT, report
    assert len(await _sent_item_ids(db)) == STALLED_IN_CUT


async def test_scheduler_slot_after_every_backend_is_terminated_completes(
    pdb: Database, proxy: TcpProxy, fresh_db_url: str, pg_admin_url: str
) -> None:
    """With the same 2 s scheduler warmed up, PostgreSQL terminates every nightcrew backend of
    the database (pg_terminate_backend over a direct admin connection, right after a slot
    completed, so none is in flight): the next slots must complete, on new connections."""
    dbname = urlsplit(fresh_db_url).path.lstrip("/")
    async with _scheduler_every_2_s(pdb, fresh_db_url) as (clock, watch, logs):
        await watch.completed(NOW, 1, within=6)  # right after a completion: nothing in flight
        accepted = proxy.accepted
        async with await psycopg.AsyncConnection.connect(pg_admin_url, autocommit=True) as admin:
            cur = await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'nightcrew' AND datname = %(db)s",
                {"db": dbname},
            )
            killed = len(await cur.fetchall())
        terminated = clock.now()
        await watch.completed(terminated, 2, within=8)

    assert killed >= 3, "the pool held fewer idle connections than this test needs"
    after = await watch_slots(fresh_db_url, terminated)
    assert len(after) >= 2 and _every_minute(after, terminated), (after, _fire_failures(logs))
    assert [status for _, status, _ in after] == ["completed"] * len(after), after
    assert not [slot for slot in _fire_failures(logs) if slot > terminated], [
        e for e in logs if e["event"] == "scheduler_fire_failed"
    ]
    assert proxy.accepted > accepted, "the terminated connections were not replaced"


async def watch_slots(url: str, after: datetime) -> list[tuple[datetime, str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await SlotWatch(conn).slots(after)


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
    rt = await make_runtime(db, clock, fresh_db_url)
    schedule = lane_schedule(rt, clock, "daily")
    scheduler = Scheduler(rt, clock, (schedule,))
    with capture_logs() as logs:
        async with asyncio.timeout(BOUND):
            assert await scheduler.catch_up(schedule) is True

    again = await _run_row(db, "daily", NOW)
    assert again["id"] == first["id"]
    assert again["attempts"] == 2 and again["status"] == "completed", again
    abandoned = [e for e in logs if e["event"] == "run_abandoned"]
    assert [(e["run_id"], e["slot"]) for e in abandoned] == [(first["id"], NOW.isoformat())]

    # /metrics of this replica (the one that marked it) counts the abandoned run beside the
    # completed re-run
    transport = httpx.ASGITransport(app=create_app(rt.metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        scraped = await client.get("/metrics")
    assert scraped.status_code == 200
    lines = scraped.text.splitlines()
    assert 'nightcrew_lane_runs_total{lane="daily",status="abandoned"} 1' in lines, lines
    assert 'nightcrew_lane_runs_total{lane="daily",status="completed"} 1' in lines, lines


@pytest.mark.parametrize("lane", ["daily", "minute"])
async def test_a_slot_whose_run_cannot_start_still_says_started_and_failed(
    pdb: Database, proxy: TcpProxy, fresh_db_url: str, lane: str
) -> None:
    """`serve`'s scheduler fires a slot while the database refuses every connection: no run
    record can be made, and still spec 000's lifecycle_cron_started and lifecycle_cron_failed
    are logged, with the cron and the reason (besides the scheduler's own line)."""
    clock = FrozenClock(NOW)
    runtime = await make_runtime(pdb, clock, fresh_db_url)
    scheduler = Scheduler(runtime, clock, (lane_schedule(runtime, clock, lane),))
    await proxy.cut()
    with capture_logs() as logs:
        won = await scheduler.fire(lane, NOW.replace(hour=4, minute=0, second=0, microsecond=0))
    assert won is False
    events = [e for e in logs if e["event"].startswith(("lifecycle_cron", "scheduler_fire"))]
    assert [e["event"] for e in events] == [
        "lifecycle_cron_started",
        "lifecycle_cron_failed",
        "scheduler_fire_failed",
    ]
    cron = {"daily": "0 4 * * *", "minute": "* * * * *"}[lane]
    assert events[0]["cron"] == events[1]["cron"] == cron
    assert events[0]["trigger"] == "scheduled" and events[0]["slot"].startswith(
        NOW.date().isoformat()
    )
    assert "PostgreSQL" in events[1]["error"] and events[1]["started"] is False


async def test_a_minute_sweep_whose_backend_is_terminated_fails_alone_and_the_others_run(
    db: Database, fresh_db_url: str
) -> None:
    """The stalled-import sweep's claim waits on a lock the test holds; an admin terminates its
    backend (pg_terminate_backend, found in pg_stat_activity). The database still answers, so
    that sweep fails alone with import_watchdog_failed, the lane's other sweeps and its
    effects drain report as usual, and the run completes with the failure counted."""
    await _stalled_items(db, 5)
    dbname = urlsplit(fresh_db_url).path.lstrip("/")
    clock = FrozenClock(NOW)
    runtime = await make_runtime(db, clock, fresh_db_url)
    async with await psycopg.AsyncConnection.connect(fresh_db_url) as locker:
        await locker.execute("LOCK TABLE public.import_items IN ACCESS EXCLUSIVE MODE")
        with capture_logs() as logs:
            lane = asyncio.create_task(run_lane(runtime, clock, "minute"))
            assert await _eventually(lambda: _lock_waiter(db, dbname), within=30)
            terminated = await db.fetch(
                "SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity"
                " WHERE datname = %(db)s AND wait_event_type = 'Lock'",
                {"db": dbname},
            )
            await locker.rollback()
            async with asyncio.timeout(BOUND):
                report = await lane
    assert terminated == [{"t": True}]
    assert report is not None
    outcomes = {j.name: j.status for j in report.jobs}
    assert outcomes == {
        "sweepStalledImports": "failed",
        "sweepStalledExternalLinks": "ok",
        "sweepStuckHostingMigrationPreviews": "ok",
        "sweepWedgedMediaJobs": "ok",
        "deliverEffects": "ok",
    }
    [failed] = [e for e in logs if e["event"] == "import_watchdog_failed"]
    assert "PostgreSQL" in failed["error"], failed
    [completed] = [e for e in logs if e["event"] == "import_watchdog_completed"]
    assert completed["errors"] == 1
    # the spec's summary, each 0 on this tick, the failed sweep's own count included
    assert completed["items_requeued"] == 0
    assert completed["links_requeued"] == completed["previews_canceled"] == 0
    assert await _sent_item_ids(db) == Counter()  # the claim never committed
    row = await db.fetch_one(
        "SELECT status FROM nightcrew.runs WHERE id = %(id)s", {"id": report.run_id}
    )
    assert row == {"status": "completed"}, row
