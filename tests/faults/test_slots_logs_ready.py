"""Faults at the edges of time, logging and storage.

* Scheduled ticks whose timers jitter: a scheduled run decides as of its slot instant, so the
  60 s resend cooldown means "every other slot" whether two ticks fire 59.9 s or 60.1 s apart.
* ``nightcrew serve`` fed malformed HTTP: every stderr line stays one JSON object (uvicorn's
  own warnings included), /ready and /metrics answer, SIGTERM exits 0.
* A hard deletion whose storage cleanup dies after its first page: the per-page count survives
  the crash, and the retry brings ``objects_deleted`` / ``bytes_deleted`` to the true totals —
  also when the process is SIGKILLed between the store's delete and the page's count (the
  page in flight is written on the deletion's record first, and settled by the next run).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from nightcrew.adapters.queues import PODCAST_IMPORTS
from nightcrew.adapters.storage import (
    LIST_PAGE_SIZE,
    DeleteOutcome,
    ObjectStore,
    StoredObject,
    open_store,
)
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.deletions import hard_delete_expired_podcasts, podcast_prefix
from nightcrew.lifecycle.lanes import lifecycle_schedules
from nightcrew.lifecycle.watchdogs import STALLED_IMPORT_RESEND_COOLDOWN_SECONDS
from nightcrew.runtime import Runtime
from nightcrew.scheduler import Scheduler
from tests import factories as f
from tests.acceptance.test_cli import _env, _nightcrew
from tests.conftest import NOW, make_runtime
from tests.support.servers import free_port

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
REPO = Path(__file__).resolve().parents[2]


# --- 1. the resend cooldown is counted in slots, not in timer jitter -------------------------
def _at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "fired_at",
    [
        # ticks 59.9 s, 60.1 s, 59.9 s apart: slot k at +0.05 s, slot k+1 at +59.95 s (early)
        pytest.param((0.05, 59.95, 120.05, 179.95), id="ticks-59.9s-apart"),
        # ticks 60.1 s apart, drifting later each minute: a cooldown measured from the tick's
        # own instant would let every tick resend (each stamp is 60.1 s old at the next tick)
        pytest.param((0.0, 60.1, 120.2, 180.3), id="ticks-60.1s-apart"),
    ],
)
async def test_the_resend_cooldown_spans_two_slots_whatever_the_timer_jitter(
    db: Database, runtime: Runtime, clock: FrozenClock, fired_at: tuple[float, ...]
) -> None:
    assert STALLED_IMPORT_RESEND_COOLDOWN_SECONDS == 60
    podcast = await f.podcast(db)
    imp = await f.podcast_import(db, podcast, status="running", dispatch_end_at=NOW - HOUR)
    # attempts 0..2: due again 120 s after a resend (thresholds 30 s grace / 67 s / 85 s), so
    # only the cooldown decides between slot k+1 and slot k+2.
    items = [await f.import_item(db, imp, attempts=a, updated_at=NOW - HOUR) for a in (0, 1, 2)]
    scheduler = Scheduler(runtime, clock, lifecycle_schedules(runtime, clock))

    sent_per_tick: list[list[str]] = []
    stamps: list[set[datetime]] = []
    seen = 0
    for k, offset in enumerate(fired_at):
        slot = NOW + k * MINUTE
        clock.set(_at(offset))
        assert await scheduler.fire("minute", slot) is True
        messages = await f.queue_messages(db, PODCAST_IMPORTS)
        sent_per_tick.append(sorted(m["body"]["import_item_id"] for m in messages[seen:]))
        seen = len(messages)
        rows = await db.fetch(
            "SELECT updated_at FROM public.import_items WHERE id = ANY(%(ids)s::uuid[])",
            {"ids": items},
        )
        stamps.append({r["updated_at"] for r in rows})

    # Sent at slot k, held at k+1 (stamped exactly 60 s before it: not "older than" 60 s),
    # sent again at k+2, held at k+3: every other minute, never two ticks in a row.
    assert sent_per_tick == [sorted(items), [], sorted(items), []]
    # The claim stamps the slot instant, not the instant the timer happened to fire.
    assert stamps == [{NOW}, {NOW}, {NOW + 2 * MINUTE}, {NOW + 2 * MINUTE}]
    runs = await db.fetch(
        "SELECT slot, status, report FROM nightcrew.runs WHERE lane = 'minute' ORDER BY slot"
    )
    assert [(r["slot"], r["status"]) for r in runs] == [
        (NOW + k * MINUTE, "completed") for k in range(4)
    ]
    assert [r["report"]["jobs"]["sweepStalledImports"]["items_requeued"] for r in runs] == [
        3,
        0,
        3,
        0,
    ]
    assert runtime.metrics.value("nightcrew_scheduler_slots_total", lane="minute", outcome="ran")
    assert (
        runtime.metrics.value("nightcrew_scheduler_last_tick_timestamp_seconds")
        == _at(fired_at[-1]).timestamp()
    )


# --- 2. `nightcrew serve`: malformed HTTP, /ready, /metrics, JSON-only stderr, clean stop -----
def _raw_request(port: int, payload: bytes) -> bytes:
    """Send bytes as they are and read the answer until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = conn.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_serve_survives_malformed_http_and_logs_only_json(fresh_db_url: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [_nightcrew(), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=_env(DATABASE_URL=fresh_db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(f"{base}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health is not None and health.status_code == 200, "serve never answered /health"

        garbage = _raw_request(port, b"GARBAGE\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400"), garbage
        bad_header = _raw_request(
            port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nNo Colon In This Header\r\n\r\n"
        )
        assert bad_header.startswith(b"HTTP/1.1 400"), bad_header

        # Still serving; ready at once (the start counts as the scheduler's first tick).
        ready = httpx.get(f"{base}/ready", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready"}
        metrics = httpx.get(f"{base}/metrics", timeout=10)
        assert metrics.status_code == 200
        assert "nightcrew_db_up 1" in metrics.text.splitlines()
        assert "# TYPE nightcrew_scheduler_last_tick_timestamp_seconds gauge" in metrics.text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr

    lines = stderr.splitlines()
    assert lines, "serve logged nothing"
    logs: list[dict[str, Any]] = []
    for line in lines:
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"a stderr line is not JSON: {line!r}\n--- stderr ---\n{stderr}")
        assert isinstance(parsed, dict), line
        logs.append(parsed)
    invalid = [e for e in logs if str(e.get("event", "")).startswith("Invalid HTTP request")]
    assert len(invalid) == 2, stderr  # one per malformed request
    assert all(e["level"] == "warning" and e["logger"] == "uvicorn.error" for e in invalid)
    events = [e.get("event") for e in logs]
    assert "serve_started" in events and events[-1] == "serve_stopped"


# --- 4. objects_deleted across a crash mid-cleanup -------------------------------------------
class Crash(BaseException):
    """The process dying mid-cleanup: nothing in nightcrew catches it."""


class DiesOnSecondPage:
    """The real store; the second delete call dies (raises, or hangs until cancelled)."""

    def __init__(self, inner: ObjectStore, how: str) -> None:
        self._inner = inner
        self._how = how
        self.description = inner.description
        self.stats = inner.stats
        self.delete_calls = 0
        self.dying = asyncio.Event()

    def list_prefix(self, prefix: str) -> AsyncIterator[list[StoredObject]]:
        return self._inner.list_prefix(prefix)

    async def head(self, key: str) -> StoredObject | None:
        return await self._inner.head(key)

    async def put(self, key: str, data: bytes) -> None:
        await self._inner.put(key, data)

    async def get(self, key: str) -> bytes | None:
        return await self._inner.get(key)

    async def delete(self, keys: Sequence[str]) -> DeleteOutcome:
        self.delete_calls += 1
        if self.delete_calls == 2:
            self.dying.set()
            if self._how == "raises":
                raise Crash("killed between two pages")
            await asyncio.Event().wait()  # hangs until the task is cancelled
        return await self._inner.delete(keys)


async def _deletion(db: Database, podcast: str) -> dict[str, Any]:
    row = await db.fetch_one(
        "SELECT objects_deleted, bytes_deleted, objects_left, storage_cleaned_at, attempts"
        " FROM nightcrew.podcast_deletions WHERE podcast_id = %(p)s",
        {"p": podcast},
    )
    assert row is not None
    return row


async def _sizes(store: ObjectStore, prefix: str) -> dict[str, int]:
    return {o.key: o.size async for page in store.list_prefix(prefix) for o in page}


@pytest.mark.parametrize("how", ["raises", "cancelled"])
async def test_objects_deleted_is_exact_across_a_crash_mid_cleanup(
    db: Database, clock: FrozenClock, fresh_db_url: str, how: str
) -> None:
    store = open_store("memory://")
    doomed = await f.podcast(db, status="pending_deletion", deletion_scheduled_at=NOW - HOUR)
    bystander = await f.podcast(db)
    total = 2 * LIST_PAGE_SIZE + 345  # three listing pages
    for n in range(total):
        await store.put(f"{podcast_prefix(doomed)}e/{n:05d}.mp3", b"x" * (1 + n % 7))
    await store.put(f"{podcast_prefix(bystander)}cover.jpg", b"keep")
    before = await _sizes(store, podcast_prefix(doomed))
    assert len(before) == total
    total_bytes = sum(before.values())

    dying = DiesOnSecondPage(store, how)
    job = asyncio.create_task(
        hard_delete_expired_podcasts(
            await make_runtime(db, clock, fresh_db_url, store=dying), clock
        )
    )
    if how == "raises":
        with pytest.raises(Crash):
            await job
    else:
        await asyncio.wait_for(dying.dying.wait(), timeout=10)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    # The row and its record were committed before the cleanup; the first page is gone and
    # counted, nothing else is.
    assert await db.fetch("SELECT id FROM public.podcasts WHERE id = %(p)s", {"p": doomed}) == []
    left = await _sizes(store, podcast_prefix(doomed))
    assert len(left) == total - LIST_PAGE_SIZE
    crashed = await _deletion(db, doomed)
    assert crashed["objects_deleted"] == LIST_PAGE_SIZE
    assert crashed["bytes_deleted"] == total_bytes - sum(left.values())
    assert crashed["storage_cleaned_at"] is None and crashed["attempts"] == 0

    # The next daily run retries the cleanup of the earlier deletion, with a healthy store.
    clock.advance(timedelta(days=1))
    report = await hard_delete_expired_podcasts(
        await make_runtime(db, clock, fresh_db_url, store=store), clock
    )
    assert report.errors == [] and report.deleted == []
    [retried] = report.retried
    assert retried.podcast_id == doomed and retried.storage_cleaned is True
    assert retried.objects_deleted == total - LIST_PAGE_SIZE  # what this run deleted
    assert await _sizes(store, podcast_prefix(doomed)) == {}
    assert await _sizes(store, podcast_prefix(bystander)) == {
        f"{podcast_prefix(bystander)}cover.jpg": 4
    }

    settled = await _deletion(db, doomed)
    assert settled["objects_deleted"] == total  # every object that existed, once
    assert settled["bytes_deleted"] == total_bytes
    assert settled["objects_left"] == 0
    assert settled["storage_cleaned_at"] == clock.now() and settled["attempts"] == 1


async def test_objects_deleted_is_exact_after_a_sigkill_between_the_delete_and_its_count(
    db: Database, clock: FrozenClock, fresh_db_url: str, tmp_path: Path
) -> None:
    """A process cleaning a deleted podcast's storage (a file:// store both processes share) is
    SIGKILLed right after the store answered its second page's delete, before that page's
    count was written. The page is gone and uncounted; the next daily run asks the store which
    of the in-flight keys are gone, counts them, and finishes: objects_deleted and
    bytes_deleted equal exactly what existed."""
    storage_url = f"file://{tmp_path / 'media'}"
    store = open_store(storage_url)
    doomed = await f.podcast(db, status="pending_deletion", deletion_scheduled_at=NOW - HOUR)
    prefix = podcast_prefix(doomed)
    total = 2 * LIST_PAGE_SIZE + 345
    for n in range(total):
        await store.put(f"{prefix}e/{n:05d}.mp3", b"x" * (1 + n % 7))
    before = await _sizes(store, prefix)
    assert len(before) == total
    total_bytes = sum(before.values())

    worker = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tests.faults._delete_then_crash"),
        *(fresh_db_url, storage_url, "2"),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(120):
            output, _ = await worker.communicate()
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == -signal.SIGKILL, output.decode()
    assert b"killed after delete 2" in output, output.decode()

    # Inside the window: two pages are gone from the store, only the first is counted, and the
    # second is the record's page in flight.
    left = await _sizes(store, prefix)
    gone = {k: s for k, s in before.items() if k not in left}
    crashed = await _deletion(db, doomed)
    in_flight = await db.fetch_one(
        "SELECT in_flight FROM nightcrew.podcast_deletions WHERE podcast_id = %(p)s",
        {"p": doomed},
    )
    assert in_flight is not None and in_flight["in_flight"], "no page in flight at the kill"
    second_page = set(in_flight["in_flight"])
    assert crashed["objects_deleted"] == len(gone) - len(second_page) > 0
    assert second_page <= set(gone), "the kill came before the second page's delete"
    assert crashed["objects_deleted"] < len(gone)  # a page the old count would have lost

    clock.advance(timedelta(days=1))
    report = await hard_delete_expired_podcasts(
        await make_runtime(db, clock, fresh_db_url, store=store), clock
    )
    assert report.errors == []
    [retried] = report.retried
    assert retried.storage_cleaned is True
    # what this run counted: the settled page, and what was still there
    assert retried.objects_deleted == total - crashed["objects_deleted"]
    assert await _sizes(store, prefix) == {}
    settled = await _deletion(db, doomed)
    assert settled["objects_deleted"] == total  # every object that existed, exactly once
    assert settled["bytes_deleted"] == total_bytes
    assert settled["objects_left"] == 0
    cleared = await db.fetch_one(
        "SELECT in_flight FROM nightcrew.podcast_deletions WHERE podcast_id = %(p)s",
        {"p": doomed},
    )
    assert cleared == {"in_flight": None}
