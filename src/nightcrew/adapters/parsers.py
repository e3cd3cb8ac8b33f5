"""The parser worker processes: untrusted feed bytes are parsed in a pool of worker
processes, each task under a hard time limit — a worker past it is killed and replaced (a
thread could not be stopped). Workers are never forked from the process that runs threads (the
database pool's, the scheduler's): they are forked from multiprocessing's fork server, a
single-threaded process started once per process with the news fetch step and the process's
other nightcrew modules imported (``_worker_context``), so a new worker costs a fork, not a
Python start and nightcrew's imports (~0.5 s of CPU each when they were spawned; a killed
worker is replaced at once). The pool is an object the runtime owns (``ParserPool``, on
``NewsAdapters``), started on first use and stopped when the runtime closes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import pebble

from nightcrew.errors import FetchError
from nightcrew.log import describe_error
from nightcrew.turns import RankedTurns

T = TypeVar("T")

# At least two, so one hostile feed holding a worker for its whole budget never stops every
# other feed's parse; at most four: parsing is a small share of a run (the database is most).
PARSE_WORKERS = max(2, min(4, os.cpu_count() or 1))
# Smallest first, but a waiting document's place improves by this many bytes each second it
# waits: a 5 MB feed goes before any newly arrived one within 25 s, whatever smaller documents
# keep arriving (a long-lived pipeline worker could otherwise keep a large feed waiting for ever).
TURN_AGING_BYTES_PER_SECOND = 200_000


def _cancel_scheduled(scheduling: asyncio.Future[Future[Any]]) -> None:
    """The task a cancelled caller had scheduled, cancelled (its worker killed) once the
    scheduling thread hands it over."""
    if not scheduling.cancelled() and scheduling.exception() is None:
        scheduling.result().cancel()


def _ignore_interrupts() -> None:
    """A worker's first step: Ctrl-C reaches the whole process group, and the parent stops its
    workers itself (``close``); a worker that took the SIGINT printed a KeyboardInterrupt
    traceback of its own (3 of 4 Ctrl-Cs during `nightcrew demo`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ParseOverBudget(FetchError):
    """Parsing one document took longer than its budget; the worker doing it was killed."""


class ParserDied(FetchError):
    """The worker process parsing a document ended (a crash in native code, out of memory)."""


def _worker_context(*, spawn: bool) -> multiprocessing.context.BaseContext:
    """multiprocessing's fork server, with what a parse task needs imported before it forks
    (taken by the server when it starts: the first pool of the process starts it), and every
    nightcrew module this process has imported: multiprocessing prepares each new worker by
    running the parent's main script again (the ``nightcrew`` command's imports the whole CLI),
    and preloading ``__main__`` in the server did not spare the workers that on Python 3.11 —
    with its imports already done, the script costs a worker next to nothing.
    ``spawn``: a new Python per worker instead, for when the fork server cannot serve this
    process (a process forked from the one that started it inherits a server that is not its
    child; a sandbox without Unix sockets never starts one)."""
    if spawn:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    ours = sorted(name for name in sys.modules if name.startswith("nightcrew."))
    context.set_forkserver_preload(["nightcrew.news.steps.fetch", *ours])
    return context


class ParserPool:
    """The parser worker processes of one runtime (``NewsAdapters.parsers``, closed with it).

    ``run`` puts a function in a worker, under a hard time limit. The workers are started on the
    first ``run`` (a command that never parses a feed never starts one), ``PARSE_WORKERS`` of
    them, and stopped by ``close``/``aclose``; a run after that is ParserDied."""

    def __init__(self, workers: int = PARSE_WORKERS) -> None:
        self._workers = workers
        self._pool: pebble.ProcessPool | None = None
        self._pid = 0  # the process that started ``_pool``
        self._retired: list[pebble.ProcessPool] = []  # broken pools whose workers await close
        self._spawn = False  # the fork server failed this process: spawn workers instead
        self._in_flight: set[Future[Any]] = set()
        self._closed = False
        # one per event loop that parses here (the scheduler's threads run loops of their own)
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RankedTurns] = (
            weakref.WeakKeyDictionary()
        )
        # a runtime's jobs may run on more than one thread (the scheduler's): one pool for all
        self._lock = threading.Lock()

    async def __aenter__(self) -> ParserPool:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    @property
    def started(self) -> bool:
        """Whether this process has worker processes of this pool (that ``close`` stops)."""
        with self._lock:
            return self._pool is not None and self._pid == os.getpid()

    @contextlib.asynccontextmanager
    async def turn(
        self, size: int, *, aging: float = TURN_AGING_BYTES_PER_SECOND
    ) -> AsyncIterator[None]:
        """A worker's turn for a document of ``size`` bytes: at most one task per worker is
        handed to the pool at once, and the waiting documents go smallest first — an ordinary
        feed is not queued behind hostile ones that use their whole parse budget (8 such in a
        shard of 16 failed 15 of its feeds, first come first served) — less ``aging`` bytes
        for each second a document has waited, so none waits for ever."""
        loop = asyncio.get_running_loop()
        gate = self._turns.setdefault(loop, RankedTurns(self._workers))
        arrived = loop.time()
        async with gate.turn(lambda: size - aging * (loop.time() - arrived)):
            yield

    async def run(self, function: Callable[..., T], *args: Any, budget_seconds: float) -> T:
        """``function(*args)`` in a parser worker process, at most ``budget_seconds`` once a
        worker has taken it. ParseOverBudget past that (the worker is killed and replaced),
        ParserDied if the worker ended or the pool broke; the function's own exception is
        raised as it was. A caller that is cancelled (a run stopping) cancels the task, which
        kills its worker."""
        # Scheduled from a thread: the first task of a process starts the workers, and the fork
        # server imports its preloads before it forks the first one (~0.5-0.8 s) — time the
        # event loop must not spend waiting.
        scheduling = asyncio.ensure_future(
            asyncio.to_thread(self._schedule, function, args, budget_seconds)
        )
        try:
            future = await asyncio.shield(scheduling)
        except asyncio.CancelledError:
            scheduling.add_done_callback(_cancel_scheduled)  # its task, once it has one
            raise
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._settled)
        try:
            return await asyncio.wrap_future(future)
        except TimeoutError as exc:  # pebble's: the task's own limit, not an asyncio timeout
            raise ParseOverBudget(
                f"parsing took longer than the {budget_seconds:g} s parse budget"
            ) from exc
        except pebble.ProcessExpired as exc:
            raise ParserDied(f"the parser process died (exit code {exc.exitcode})") from exc
        except BrokenProcessPool as exc:
            raise ParserDied(f"the parser pool broke: {describe_error(exc)}") from exc

    def _schedule(
        self, function: Callable[..., Any], args: tuple[Any, ...], budget_seconds: float
    ) -> Future[Any]:
        try:
            return self._running().schedule(function, args=args, timeout=budget_seconds)
        except RuntimeError:  # the pool stopped between the check and the call: once more
            try:
                return self._running().schedule(function, args=args, timeout=budget_seconds)
            except RuntimeError as exc:
                raise ParserDied(f"the parser pool broke: {describe_error(exc)}") from exc

    def _settled(self, future: Future[Any]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def _running(self) -> pebble.ProcessPool:
        with self._lock:
            if self._closed:
                raise ParserDied("the parser pool is closed")
            pool = self._pool
            if pool is not None and self._pid != os.getpid():
                # a forked child inherits the object but not the threads that run it, and the
                # workers are its parent's to stop: a pool of its own, and the parent's left be
                pool, self._retired, self._in_flight = None, [], set()
                self._spawn = True
            if pool is not None and pool.active:
                return pool
            if pool is not None:  # broken (pebble lost a thread or a worker's pipe)
                pool.stop()  # type: ignore[no-untyped-call]  # pebble leaves stop() unannotated
                self._retired.append(pool)  # joined at close: joining blocks, this is the loop
                # a pool that could not start its workers would break the same way again
                self._spawn = True
            self._pool = pebble.ProcessPool(
                max_workers=self._workers,
                context=_worker_context(spawn=self._spawn),
                initializer=_ignore_interrupts,
            )
            self._pid = os.getpid()
            # The safety net for an owner that never closes this (a script stopped mid-run, a
            # test that forgets): pebble's workers are not daemons, and multiprocessing's exit
            # handler joins every live non-daemon child — idle workers wait for work, so the
            # process would wait at exit forever. Pebble 5 stops its workers in an exit hook of
            # its own, but that is no documented promise, so the pool does not lean on it.
            # Registered now, after the handlers both register at import, so it runs before
            # them (atexit is last in, first out); ``close`` takes it off again.
            atexit.register(self.close)
            return self._pool

    def close(self) -> None:
        """Stop the workers now (a task in flight ends as ParserDied); blocks until they are
        gone, a few tenths of a second. Idempotent."""
        with self._lock:
            self._closed = True
            mine = self._pid == os.getpid()
            pools = [*self._retired, *([self._pool] if self._pool is not None else [])]
            in_flight = list(self._in_flight)
            self._pool, self._retired, self._in_flight = None, [], set()
        atexit.unregister(self.close)
        if not mine:  # a forked child's copy: the workers are the parent's
            return
        for pool in pools:
            pool.stop()  # type: ignore[no-untyped-call]  # pebble leaves stop() unannotated
            pool.join(timeout=10)
        # a stopped pebble pool leaves its tasks' futures pending for ever: a caller still
        # awaiting one (a fetch racing the runtime's close) would never return
        for future in in_flight:
            try:
                future.set_exception(ParserDied("the parser pool closed during the parse"))
            except InvalidStateError:  # it settled while the pool stopped
                pass

    async def aclose(self) -> None:
        """``close`` without holding the event loop while the workers are joined."""
        if self.started:
            await asyncio.to_thread(self.close)
        else:
            self.close()
