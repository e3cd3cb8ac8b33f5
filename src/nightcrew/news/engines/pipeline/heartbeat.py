"""Stage leases kept while their work runs, and the model asked only while one is held.

**Stage leases are short and bound to a live worker** (``Heartbeat``): NEWS_STAGE_LEASE_SECONDS
(30), renewed every third of it while the work runs, so a dead worker's candidates are taken
over within that long. A renewal refused (or none confirmed for a whole TTL) stops the work
before its next expensive step: no model is asked without the lease (``guarded``). The inline
run's review lock (UPSTASH_REDIS_AI_REVIEW_LOCK_TTL_SECONDS, spec 001's 1,800 s) is the inline
run's alone; the review stage takes the same lock by name with the short, renewed TTL.
"""

from __future__ import annotations

import asyncio
import time

from nightcrew.adapters.locks import Lease, Leases
from nightcrew.adapters.reviewer import Article, CallScope, Reviewer, ReviewError, Verdict
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error, warning
from nightcrew.news.steps.review import calls_a_model


class LeaseLost(NightcrewError):
    """The stage lease could not be renewed: the work stops before its next expensive step."""


class Stopping(NightcrewError):
    """The worker is stopping: the work stops before its next expensive step and its message
    goes back to the queue (as the stopping worker's fresh copy)."""


class Heartbeat:
    """A stage lease kept while its work runs (``async with``): renewed every third of its TTL,
    so a worker that dies leaves it behind for one TTL at most. A renewal refused — or none
    confirmed within a TTL (its backend unreachable: a lease that cannot be proven is lost) —
    means lost; ``check``, called before each expensive step, then stops the work. It stops it
    too when the worker is stopping (the message goes back, nothing more is spent on it)."""

    def __init__(
        self, held_by: Leases, lease: Lease, ttl: float, stopping: asyncio.Event | None = None
    ) -> None:
        self._held_by, self._lease, self._ttl = held_by, lease, ttl
        self._stopping = stopping
        self._refused = False
        self._until = time.monotonic() + ttl
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def lost(self) -> bool:
        return self._refused or time.monotonic() > self._until

    def check(self) -> None:
        """Before an expensive step: Stopping or LeaseLost when it must not start."""
        if self._stopping is not None and self._stopping.is_set():
            raise Stopping(f"{self._lease.name}: the worker is stopping")
        if self.lost:
            raise LeaseLost(f"{self._lease.name}: the lease could not be renewed")

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._ttl / 3)
            asked = time.monotonic()
            try:
                held = await self._held_by.extend(self._lease, self._ttl)
            except NightcrewError as exc:  # unconfirmed: lost if a whole TTL passes so
                warning(
                    "news.stage_lease_unconfirmed",
                    lease=self._lease.name,
                    error=describe_error(exc),
                )
                continue
            if not held:
                self._refused = True
                warning("news.stage_lease_lost", lease=self._lease.name)
                return
            self._until = asked + self._ttl


class _Guarded:
    """A model reviewer asked only while the stage lease is held: a lost lease (or a stopping
    worker) stops the review before the model is called — checked again once the call has its
    slot (NEWS_AI_CONCURRENCY), since it may have waited for one — and a translation is left to
    the translation backlog rather than asked for without the lease."""

    def __init__(self, inner: Reviewer, beat: Heartbeat) -> None:
        self._inner, self._beat = inner, beat
        self.name = inner.name
        self.translation_enabled = inner.translation_enabled

    async def aclose(self) -> None:
        return None  # the inner reviewer is the runtime's to close

    async def review(self, article: Article, scope: CallScope | None = None) -> Verdict:
        scope = scope or CallScope()
        self._beat.check()

        def ready() -> None:
            scope.ready()
            self._beat.check()

        return await self._inner.review(article, CallScope(spend=scope.spend, ready=ready))

    async def translate(
        self, text: str, language: str, scope: CallScope | None = None
    ) -> str | None:
        scope = scope or CallScope()

        def ready() -> None:
            scope.ready()
            if self._beat.lost:
                raise ReviewError(
                    "the review lease was lost: translation left for later", transient=True
                )

        ready()
        return await self._inner.translate(
            text, language, CallScope(spend=scope.spend, ready=ready)
        )


def guarded(reviewer: Reviewer, beat: Heartbeat) -> Reviewer:
    # the offline rules cost nothing: no guard
    return _Guarded(reviewer, beat) if calls_a_model(reviewer) else reviewer
