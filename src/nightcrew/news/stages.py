"""The pipeline's four stages, one message at a time: fetch → enrich → review → write.

Each stage takes its candidate under a new fence (``take``), does its one expensive thing, and
saves the result with the next stage's admission and outgoing message in one transaction —
only under the fence it drew. So a message delivered twice (a consumer that died or lost its
channel, a relay that republished) finds the work done and is acknowledged as ``skipped``;
a second consumer of the same candidate while the first still works on it is kept out by the
stage lease (the review lease is the inline run's review lock), and an older holder's result is
refused by the fence. Writes are idempotent on the normalised URL.

This is the pipeline engine's half that consumes messages: each stage calls spec 001's steps —
the same modules the inline run (``inline.py``) calls: ``fetch``, ``items``, ``admission``,
``hydrate``, ``review``, ``write``, ``snapshot``, ``leases`` — and keeps only the candidate's
state machine (take, hand on, park, dead) and its messages.

**Attempts are counted in PostgreSQL, when a stage takes its candidate** (``take``: issue 23),
not in the broker's delivery header: a take whose worker dies counts like one that fails, and
the count survives the candidate being parked behind a lease and released as a fresh message.
A take that finds the previous one unfinished records "worker died"; one that finds
NEWS_MAX_DELIVERIES attempts spent runs nothing and dead-letters the candidate (``Exhausted``).
A failure worth trying again (``is_transient``: a deadlock or serialization failure, resources
short, a timeout, a model answering 5xx) holds the candidate for a backoff — exponential, with
jitter — and the housekeeping sends it again; any other failure is dead-lettered at once with
its reason. A database outage spends nothing: the stage waits for it (``patiently``), and a
retry resumes its own take rather than counting another.

**Stage leases are short and bound to a live worker** (``Heartbeat``): NEWS_STAGE_LEASE_SECONDS
(30), renewed every third of it while the work runs, so a dead worker's candidates are taken
over within that long. A renewal refused (or none confirmed for a whole TTL) stops the work
before its next expensive step: no model is asked without the lease. The inline run's review
lock (UPSTASH_REDIS_AI_REVIEW_LOCK_TTL_SECONDS, spec 001's 1,800 s) is the inline run's alone;
the review stage takes the same lock by name with the short, renewed TTL.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import httpx

from nightcrew.adapters.broker import PipelineBroker
from nightcrew.adapters.locks import Lease, Leases
from nightcrew.adapters.reviewer import Article, Reviewer, ReviewError, Verdict
from nightcrew.clock import Clock
from nightcrew.db.database import QueryError, json_param
from nightcrew.db.queries import load_queries
from nightcrew.errors import (
    DatabaseUnavailableError,
    FetchError,
    NightcrewError,
    QueueError,
    StoreError,
)
from nightcrew.log import describe_error, warning
from nightcrew.news import admission, hydrate, items, leases, notes, pipeline, snapshot
from nightcrew.news import sources as news_sources
from nightcrew.news.candidates import Candidate, refused_for_its_data, verdict_to_json
from nightcrew.news.fetch import FetchResult, feed_rules, fetch_source
from nightcrew.news.leases import Superseded

# (by name: the stages ``review`` and ``write`` below are this module's own)
from nightcrew.news.review import (
    REVIEW_FAILED_FOR_NOW,
    Reviewed,
    calls_a_model,
    is_written,
    review_again_later,
    review_item,
    review_lock_name,
)
from nightcrew.news.write import write_candidate
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# A take that failed for now goes again after BACKOFF_BASE_SECONDS · 2^(attempt-1), capped,
# of which a random part up to half is waived ("equal jitter"): failures that came together
# (a deadlock's two sides, a database short of connections) do not come back together.
BACKOFF_BASE_SECONDS = 4.0
BACKOFF_CAP_SECONDS = 600.0
# PostgreSQL's SQLSTATEs worth trying again: class 40 (serialization failure, deadlock), 53
# (insufficient resources), 57 (a statement timeout, an administrator's cancel or shutdown), 08
# (connection), and 55P03 (lock not available). The rest are the message's for good.
RETRYABLE_SQLSTATE_CLASSES = ("40", "53", "57", "08")
RETRYABLE_SQLSTATES = ("55P03",)
SAVE_TRIES = 5  # a stage whose expensive step is done retries its save this often in place
WORKER_DIED = "worker died: its previous attempt at this stage never finished"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a message came to, for the worker's one event per message."""

    name: str  # fetched, enriched, reviewed, written, skipped, parked, deferred, rejected, …
    detail: dict[str, Any]


class Isolation:
    """A suspect — a candidate whose previous attempt never finished: its worker died — runs
    alone in its process. The takes under way finish first, and no other take starts until the
    suspect is done; so a poison article that kills its worker takes no other candidate's
    attempts with it again (its companions of the first death are retried beside no suspect,
    and are not dead-lettered with it)."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._alone = asyncio.Lock()

    @asynccontextmanager
    async def work(self) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """Around a take and its work, waiting first while a suspect runs; yields ``isolate``,
        which a suspect awaits (once taken) to run alone."""
        await self._open.wait()
        self._active += 1
        self._idle.clear()
        counted, alone = True, False

        async def isolate() -> None:
            nonlocal counted, alone
            if alone:
                return
            self._leave()
            counted = False
            await self._alone.acquire()
            alone = True
            self._open.clear()
            await self._idle.wait()

        try:
            yield isolate
        finally:
            if counted:
                self._leave()
            if alone:
                self._open.set()
                self._alone.release()

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()


@dataclass(frozen=True, kw_only=True)
class StageContext:
    runtime: Runtime
    clock: Clock
    broker: PipelineBroker
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # the worker is stopping
    isolation: Isolation = field(default_factory=Isolation)  # suspects run alone
    # leases this worker could not release (the database was gone): released before it takes
    # one of those names again, so its own retry after the outage is not parked behind its own
    # lease (and later counted as a worker that died)
    unreleased: dict[str, Lease] = field(default_factory=dict)

    @property
    def leases(self) -> Leases:
        return self.runtime.news_adapters().leases


Stage = Callable[[StageContext, dict[str, Any]], Awaitable[Outcome]]
T = TypeVar("T")


# --- attempts -------------------------------------------------------------------------------------
@dataclass
class Attempt:
    """One message's take of its candidate, for the worker that handles it: the candidate, the
    fence the take drew and the attempts counted (this one included), and the message's token:
    while its take is open, taking the candidate again with the same token — after a database
    outage lost the answer to the take, or as the copy a stopping worker handed back — resumes
    it instead of counting another (or passing for a dead worker's)."""

    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    url: str | None = None
    stage: str | None = None
    fence: int | None = None
    attempts: int = 0
    open: bool = False


_ATTEMPT: ContextVar[Attempt | None] = ContextVar("nightcrew_news_attempt", default=None)


def begin_attempt(token: str | None = None) -> Attempt:
    """The bookkeeping of the message this task handles (the worker starts each with it);
    ``token``: a handed-back copy's, to resume its original's take."""
    attempt = Attempt(token=token) if token else Attempt()
    _ATTEMPT.set(attempt)
    return attempt


def current_attempt() -> Attempt:
    attempt = _ATTEMPT.get()
    return attempt if attempt is not None else begin_attempt()


class Exhausted(NightcrewError):
    """NEWS_MAX_DELIVERIES attempts at this stage spent, none finished: the candidate is
    dead-lettered, and not run again. ``error`` is the last attempt's ("worker died…" when it
    never finished)."""

    def __init__(self, url: str, stage: str, attempts: int, error: str) -> None:
        super().__init__(f"{url}: {attempts} attempts at {stage} spent; the last: {error}")
        self.url, self.stage, self.attempts, self.error = url, stage, attempts, error


class LeaseLost(NightcrewError):
    """The stage lease could not be renewed: the work stops before its next expensive step."""


class Stopping(NightcrewError):
    """The worker is stopping: the work stops before its next expensive step and its message
    goes back to the queue (as the stopping worker's fresh copy)."""


class _Busy(NightcrewError):
    """Another take of the candidate is under way (the write stage, which has no lease)."""

    def __init__(self, since: datetime) -> None:
        super().__init__(f"taken at {since.isoformat()}")
        self.since = since


def is_transient(exc: BaseException) -> bool:
    """Whether a stage's failure is worth another attempt after a backoff (a deadlock, a
    serialization failure, resources short, a timeout, a network error, a model answering 5xx),
    or is the message's for good — dead-lettered at once, with the reason."""
    if isinstance(exc, QueryError):
        sqlstate = exc.sqlstate or ""
        return sqlstate[:2] in RETRYABLE_SQLSTATE_CLASSES or sqlstate in RETRYABLE_SQLSTATES
    if isinstance(exc, ReviewError):
        return exc.transient
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    return isinstance(
        exc,
        DatabaseUnavailableError
        | QueueError
        | StoreError
        | FetchError
        | TimeoutError
        | OSError
        | httpx.TransportError,
    )


def backoff_seconds(attempt: int) -> float:
    """How long a candidate whose ``attempt``-th take failed for now waits for the next."""
    ceiling = min(BACKOFF_BASE_SECONDS * 2.0 ** max(attempt - 1, 0), BACKOFF_CAP_SECONDS)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


async def patiently(
    ctx: StageContext, step: Callable[[], Awaitable[T]], *, what: str, transient_tries: int = 0
) -> T:
    """``step``, again and again while the database is unavailable (backing off to 10 s),
    until it succeeds or the worker stops; and up to ``transient_tries`` more times after a
    statement worth trying again (a deadlock, a serialization failure). A stage saves its
    result this way once its expensive step is done, so neither an outage nor a deadlock
    costs a second model call."""
    pause, tries = 0.5, 0
    while True:
        try:
            return await step()
        except DatabaseUnavailableError as exc:
            if ctx.stopping.is_set():
                raise
            warning("news.database_unavailable", step=what, error=describe_error(exc))
        except QueryError as exc:
            if tries >= transient_tries or not is_transient(exc):
                raise
            tries += 1
            warning("news.save_retried", step=what, attempt=tries, error=describe_error(exc))
        await asyncio.sleep(pause * random.uniform(0.5, 1.0))
        pause = min(pause * 2, 10.0)


# --- leases ---------------------------------------------------------------------------------------
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
    worker) stops the review before the model is called, and a translation is left to the
    translation backlog rather than asked for without the lease."""

    def __init__(self, inner: Reviewer, beat: Heartbeat) -> None:
        self._inner, self._beat = inner, beat
        self.name = inner.name
        self.translation_enabled = inner.translation_enabled

    async def review(self, article: Article) -> Verdict:
        self._beat.check()
        return await self._inner.review(article)

    async def translate(self, text: str, language: str) -> str | None:
        if self._beat.lost:
            raise ReviewError(
                "the review lease was lost: translation left for later", transient=True
            )
        return await self._inner.translate(text, language)


def _guarded(reviewer: Reviewer, beat: Heartbeat) -> Reviewer:
    # the offline rules cost nothing: no guard
    return _Guarded(reviewer, beat) if calls_a_model(reviewer) else reviewer


# --- fetch ----------------------------------------------------------------------------------------
async def fetch(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    db, settings, now = ctx.runtime.db, ctx.runtime.settings, ctx.clock.now()
    source_id = int(body["source_id"])
    source = await db.fetch_one(SQL["source_for_fetch"], {"id": source_id})
    if source is None or source["fetch_queued_at"] is None:
        return Outcome("skipped", {"source_id": source_id, "why": "fetched already"})
    if not source["enabled"] or source["parked_at"] is not None:
        await db.execute(SQL["unqueue_source"], {"id": source_id})
        return Outcome("skipped", {"source_id": source_id, "why": "disabled or parked"})
    ttl = float(settings.news_stage_lease_seconds)
    name = f"news:fetch:{source_id}"
    lease = await _acquire_own(ctx, name, ttl)
    if lease is None:
        await db.execute(
            SQL["refetch_later"],
            {
                "id": source_id,
                "now": now,
                "resend_after": settings.news_resend_after_seconds,
                "ttl": ttl,
            },
        )
        await notes.note_fetch_locked(db, shard=source["shard"], now=now)
        return Outcome("skipped", {"source_id": source_id, "why": "another worker fetches it"})
    try:
        async with Heartbeat(ctx.leases, lease, ttl, ctx.stopping) as beat:
            beat.check()
            return await _fetch_source(ctx, source, now)
    finally:
        await _release(ctx, name, lease)


async def _fetch_source(ctx: StageContext, source: dict[str, Any], now: datetime) -> Outcome:
    db, settings = ctx.runtime.db, ctx.runtime.settings
    adapters = ctx.runtime.news_adapters()
    # a feed never kills its worker: whatever goes wrong is that source's failed fetch
    result = await fetch_source(
        adapters.http, feed_rules(settings, adapters.policy, adapters.parsers), source, now
    )
    ids = {"source_id": source["id"]}
    if result.outcome in ("failed", "retry_later"):
        await news_sources.record_fetch(db, source, result, now)
        await db.execute(SQL["unqueue_source"], {"id": source["id"]})
        return Outcome("fetch_failed", {**ids, "error": result.error, "status": result.status})
    # new by the inline run's rule (the processed-URL set), held with the fetch state, waiting
    # for the pass to admit them
    _, fetched = await items.unseen(
        adapters.processed,
        adapters.fallback_processed,
        [(source, result)],
        lambda exc: warning("worker.redis.unavailable", error=str(exc)),
    )
    held = await items.hold_fetched(db, source["shard"], fetched, now)
    if held.fetch_errors:  # not held for a reason not the items': fetched again later
        await db.execute(SQL["unqueue_source"], {"id": source["id"]})
        return Outcome("fetch_failed", {**ids, "error": held.fetch_errors[0]["error"]})
    async with db.transaction() as tx:
        # the pass that sent the fetch reports these as its droppedItems
        await notes.note_dropped(
            tx, shard=source["shard"], source=source["name"], dropped=result.dropped, now=now
        )
        await tx.execute(SQL["unqueue_source"], {"id": source["id"]})
    new = fetched[0][2]
    return Outcome("fetched", {**ids, "items": len(result.items), "new": len(new)})


# --- the candidate stages ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Fenced:
    """A candidate a stage worker took, and the fence its result must be saved under."""

    candidate: Candidate
    fence: int
    shard: str
    suspect: bool = False  # its previous attempt never finished: it runs alone (``Isolation``)


async def _taken(
    ctx: StageContext, url: str, stage: str, *, busy_for: float = 0.0
) -> _Fenced | None:
    """Take the candidate waiting for ``stage``, counting the attempt (None: it waits for no
    such thing). Exhausted when its attempts are spent; _Busy when another take of the last
    ``busy_for`` seconds is under way."""
    attempt = current_attempt()
    row = await ctx.runtime.db.fetch_one(
        SQL["take"],
        {
            "url": url,
            "stage": stage,
            "now": ctx.clock.now(),
            "token": attempt.token,
            "max": ctx.runtime.settings.news_max_deliveries,
            "busy_for": float(busy_for),
            "died_error": WORKER_DIED,
        },
    )
    if row is None:
        return None
    if row["decision"] == "exhausted":
        raise Exhausted(url, stage, int(row["prior_attempts"]), str(row["prior_error"] or "?"))
    if row["decision"] == "busy":
        raise _Busy(row["prior_taken_at"])
    if row["died"]:
        warning(
            "news.attempt_unfinished",
            stage=stage,
            url=url,
            attempts=int(row["prior_attempts"]),
            error=WORKER_DIED,
        )
    attempt.url, attempt.stage, attempt.fence = url, stage, int(row["fence"])
    attempt.attempts, attempt.open = int(row["stage_attempts"]), True
    candidate = Candidate.from_row({**row, "source_name": "", "source_shard": row["shard"]})
    return _Fenced(candidate, int(row["fence"]), row["shard"], suspect=bool(row["died"]))


async def _finished(ctx: StageContext, taken: _Fenced, stage: str) -> None:
    """The attempt ended without advancing the candidate (deferred, dropped): not unfinished."""
    attempt = current_attempt()
    if attempt.open:
        await ctx.runtime.db.execute(
            SQL["finished"], {"url": taken.candidate.url, "stage": stage, "fence": taken.fence}
        )
        attempt.open = False


async def _untake(
    ctx: StageContext,
    taken: _Fenced,
    stage: str,
    *,
    held_for: float | None = None,
    reason: str | None = None,
) -> None:
    """A take given back uncounted (the worker stopping, the lease lost): queued again for the
    copy a stopping worker hands back, or held for ``held_for`` seconds. Should the database
    refuse, the take stays open and the copy, with its token, resumes it (counted once)."""
    attempt, now = current_attempt(), ctx.clock.now()
    try:
        await ctx.runtime.db.execute(
            SQL["untake"],
            {
                "url": taken.candidate.url,
                "stage": stage,
                "fence": taken.fence,
                "state": "queued" if held_for is None else "held",
                "reason": reason,
                "not_before": None if held_for is None else now + timedelta(seconds=held_for),
                "now": now,
            },
        )
    except NightcrewError as exc:
        warning("news.untake_failed", url=taken.candidate.url, error=describe_error(exc))
        return
    attempt.open = False


async def _hand_on(
    ctx: StageContext,
    taken: _Fenced,
    stage: str,
    next_stage: str,
    *,
    image_url: str | None = None,
    verdict: dict[str, Any] | None = None,
    translation: str | None = None,
) -> None:
    """Save this stage's result under the fence and queue the candidate, with its message, for
    ``next_stage``. It was admitted by its pass: it is not admitted again."""
    db, now = ctx.runtime.db, ctx.clock.now()
    async with db.transaction() as tx:
        saved = await tx.fetch_one(
            SQL["advance"],
            {
                "url": taken.candidate.url,
                "stage": stage,
                "fence": taken.fence,
                "next": next_stage,
                "reason": f"{stage}ed",
                "image_url": image_url,
                "verdict": json_param(verdict) if verdict is not None else None,
                "translation": translation,
                "now": now,
            },
        )
        if saved is None:
            raise Superseded(f"{taken.candidate.url}: taken over while in {stage}")
        owed = await tx.fetch(
            pipeline.SQL["enqueue"],
            {"stage": next_stage, "url": taken.candidate.url, "shard": taken.shard, "now": now},
        )
    current_attempt().open = False  # the attempt finished (``advance`` says so in the row)
    await pipeline.send_owed(ctx.broker, db, owed)


async def _under_lease(
    ctx: StageContext,
    stage: str,
    url: str,
    lease_name: str,
    work: Callable[[_Fenced, Heartbeat], Awaitable[Outcome]],
) -> Outcome:
    async with ctx.isolation.work() as isolate:
        return await _leased(ctx, stage, url, lease_name, work, isolate)


async def _leased(
    ctx: StageContext,
    stage: str,
    url: str,
    lease_name: str,
    work: Callable[[_Fenced, Heartbeat], Awaitable[Outcome]],
    isolate: Callable[[], Awaitable[None]],
) -> Outcome:
    ttl = float(ctx.runtime.settings.news_stage_lease_seconds)
    lease = await _acquire_own(ctx, lease_name, ttl)
    if lease is None:
        await ctx.runtime.db.execute(
            SQL["park"],
            {
                "url": url,
                "stage": stage,
                "reason": f"its {stage} lease is held elsewhere; sent again once it is free",
                "wait": ttl,  # by then the lease is free, whoever held it
                "now": ctx.clock.now(),
            },
        )
        return Outcome("parked", {"url": url, "why": "lease held elsewhere"})
    try:
        async with Heartbeat(ctx.leases, lease, ttl, ctx.stopping) as beat:
            taken = await _taken(ctx, url, stage)
            if taken is None:
                return Outcome("skipped", {"url": url, "why": f"not waiting for {stage}"})
            try:
                if taken.suspect:
                    await isolate()
                outcome = await work(taken, beat)
            except Superseded:
                return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
            except LeaseLost:
                reason = f"its {stage} lease is held elsewhere (this worker's was not renewed)"
                await _untake(ctx, taken, stage, held_for=ttl, reason=reason)
                return Outcome("parked", {"url": url, "why": "lease lost"})
            except (Stopping, asyncio.CancelledError):
                await _untake(ctx, taken, stage)
                raise
            await _finished(ctx, taken, stage)
            return outcome
    finally:
        await _release(ctx, lease_name, lease)


async def _acquire_own(ctx: StageContext, name: str, ttl: float) -> Lease | None:
    """The lease ``name``, after releasing this worker's own of that name that a database
    outage kept it from releasing (the outage is over if this gets that far)."""
    stale = ctx.unreleased.pop(name, None)
    if stale is not None:
        await _release(ctx, name, stale)
    return await ctx.leases.acquire(name, ttl)


async def _release(ctx: StageContext, name: str, lease: Lease) -> None:
    """Released, or remembered for ``_acquire_own`` when the database cannot answer now (the
    lease runs out its TTL meanwhile). A stage's lease is on one source or one candidate, and
    its fence in ``nightcrew.leases`` is not read (the candidate's own is): its row goes."""
    if not await leases.release_quietly(ctx.leases, lease, forget=True):
        ctx.unreleased[name] = lease


async def enrich(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    url = str(body["url"])

    async def work(taken: _Fenced, beat: Heartbeat) -> Outcome:
        image = taken.candidate.item.image_url
        if image is None:
            beat.check()
            image = await hydrate.hydrate_one(ctx.runtime.news_adapters(), url)
        await patiently(
            ctx,
            lambda: _hand_on(ctx, taken, "enrich", "review", image_url=image),
            what="enrich",
            transient_tries=SAVE_TRIES,
        )
        return Outcome("enriched", {"url": url, "image": image is not None})

    return await _under_lease(
        ctx,
        "enrich",
        url,
        leases.stage_lease_name("enrich", url),
        work,
    )


async def review(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    url = str(body["url"])
    db = ctx.runtime.db

    async def work(taken: _Fenced, beat: Heartbeat) -> Outcome:
        if await is_written(db, url):
            await db.execute(SQL["drop"], {"url": url})
            return Outcome("skipped", {"url": url, "why": "written already"})
        reviewer = ctx.runtime.news_adapters().reviewer
        # no model call without the lease (nor once the worker is stopping)
        beat.check()
        verdict, translation, transient = await review_item(
            _guarded(reviewer, beat), taken.candidate.item
        )
        if review_again_later(taken.candidate, transient):
            # the inline run's rule: a later pass admits it again, within its cost bound
            waits = {"url": url, "fence": taken.fence, "reason": REVIEW_FAILED_FOR_NOW}
            saved = await patiently(
                ctx,
                lambda: db.fetch_one(SQL["review_later"], {**waits, "now": ctx.clock.now()}),
                what="review",
            )
            current_attempt().open = False
            return Outcome("deferred" if saved else "skipped", {"url": url, "why": "model"})
        await patiently(
            ctx,
            lambda: _hand_on(
                ctx,
                taken,
                "review",
                "write",
                verdict=verdict_to_json(verdict) or {},
                translation=translation,
            ),
            what="review",
            transient_tries=SAVE_TRIES,
        )
        status = "unreviewed" if verdict is None else "accepted" if verdict.accepted else "rejected"
        return Outcome("reviewed", {"url": url, "verdict": status})

    return await _under_lease(
        ctx,
        "review",
        url,
        review_lock_name(url),  # the inline run's lock, by name; here short and renewed
        work,
    )


async def write(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    """No lease: a write is cheap and idempotent (the URL is unique, the candidate goes under
    its fence), so two writers of one candidate leave one article and one review."""
    async with ctx.isolation.work() as isolate:
        return await _write(ctx, body, isolate)


async def _write(
    ctx: StageContext, body: dict[str, Any], isolate: Callable[[], Awaitable[None]]
) -> Outcome:
    url = str(body["url"])
    db, now = ctx.runtime.db, ctx.clock.now()
    ttl = float(ctx.runtime.settings.news_stage_lease_seconds)
    try:  # the row is its lease: another take under way for less than a lease's TTL keeps it
        taken = await _taken(ctx, url, "write", busy_for=ttl)
    except _Busy as busy:
        wait = (busy.since + timedelta(seconds=ttl) - now).total_seconds()
        await db.execute(
            SQL["park"],
            {
                "url": url,
                "stage": "write",
                "reason": "its write is under way elsewhere; sent again if it does not finish",
                "wait": max(wait, 1.0),
                "now": now,
            },
        )
        return Outcome("parked", {"url": url, "why": "written elsewhere now"})
    if taken is None:
        return Outcome("skipped", {"url": url, "why": "not waiting for write"})
    if taken.suspect:
        await isolate()
    candidate = taken.candidate
    reviewed = Reviewed(candidate, candidate.verdict, candidate.translation)
    try:
        ids = await write_candidate(db, taken.shard, taken.fence, reviewed, now)
    except Superseded:
        return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
    except QueryError as exc:
        if not refused_for_its_data(exc):
            raise  # not this article's fault: tried again (a deadlock) or dead-lettered
        await db.execute(SQL["reject"], {"url": url, "reason": describe_error(exc), "now": now})
        current_attempt().open = False
        return Outcome("rejected", {"url": url, "error": describe_error(exc)})
    # the processed-URL set, as the inline run records its writes (a Redis that fails there
    # costs nothing: the written article is the record)
    adapters = ctx.runtime.news_adapters()
    await items.mark_processed(
        adapters.processed,
        adapters.fallback_processed,
        list(ids),
        lambda exc: warning("worker.redis.unavailable", error=str(exc)),
    )
    return Outcome("written" if ids else "skipped", {"url": url, "status": reviewed.status})


STAGES: dict[str, Stage] = {"fetch": fetch, "enrich": enrich, "review": review, "write": write}


async def on_dead(ctx: StageContext, stage: str, body: dict[str, Any], error: str) -> None:
    """A message given up on: its candidate waits as ``dead`` (for `news dlq replay`); a fetch
    counts as its source's failure (enough of them park it)."""
    db, now = ctx.runtime.db, ctx.clock.now()
    if stage == "fetch" and "source_id" in body:
        source = await db.fetch_one(SQL["source_for_fetch"], {"id": int(body["source_id"])})
        if source is not None:
            await news_sources.record_fetch(
                db, source, FetchResult(outcome="failed", error=error), now
            )
            await db.execute(SQL["unqueue_source"], {"id": source["id"]})
    elif "url" in body:
        await db.execute(
            SQL["mark_dead"], {"url": str(body["url"]), "stage": stage, "error": error, "now": now}
        )


async def retry_later(ctx: StageContext, attempt: Attempt, error: str) -> float | None:
    """The take of ``attempt``, failed for now, held for a backoff (its length returned) — the
    attempt counted — after which the housekeeping sends it again; None when the candidate
    moved on meanwhile (there is nothing to retry)."""
    delay, now = backoff_seconds(attempt.attempts), ctx.clock.now()
    row = await ctx.runtime.db.fetch_one(
        SQL["retry_later"],
        {
            "url": attempt.url,
            "stage": attempt.stage,
            "fence": attempt.fence,
            "reason": f"failed for now (attempt {attempt.attempts}); sent again after a backoff",
            "error": error[:2000],
            "not_before": now + timedelta(seconds=delay),
            "now": now,
        },
    )
    attempt.open = False
    return delay if row is not None else None


async def refresh_snapshots(ctx: StageContext, *, force: bool = False) -> int:
    """Publish every stale shard snapshot not published within NEWS_SNAPSHOT_DEBOUNCE_SECONDS
    (the write stage marks them stale): many writes, one snapshot per interval. ``force``: a
    stopping worker publishes what it made stale without waiting out the interval."""
    debounce = 0.0 if force else ctx.runtime.settings.news_snapshot_debounce_seconds
    if not await admission.allows_expensive(ctx.runtime.db, ctx.runtime.settings):
        # spec 001 defers snapshot refresh with every expensive step; they stay stale
        warning("worker.backpressure.snapshot_deferred")
        return 0
    return await snapshot.refresh_stale(
        ctx.runtime.db, ctx.runtime.store, ctx.clock.now(), debounce_seconds=debounce
    )
