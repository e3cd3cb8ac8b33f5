"""A pipeline message's attempt at its candidate, counted in PostgreSQL when a stage takes it.

Attempts are not the broker's delivery header: a take whose worker dies counts like one that
fails, and the count survives the candidate being parked behind a lease and sent again as a
fresh message. A take that finds the previous one unfinished records "worker died" (and the
candidate, a suspect, runs alone: ``Isolation``); one that finds NEWS_MAX_DELIVERIES attempts
spent runs nothing and dead-letters the candidate (``Exhausted``). A failure worth trying again
(``is_transient``) holds the candidate for a backoff — exponential, with jitter — after which a
worker's housekeeping sends it again; any other failure is dead-lettered at once with its
reason. A database outage spends nothing: the work waits for it (``patiently``), and a retry
resumes its own take rather than counting another.

Each message's ``Attempt`` is an explicit record: the worker makes one per message and passes it
to the stage, and the functions here that change it (``take``, ``finished``, ``untake``,
``retry_later``) are its methods.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from nightcrew.adapters.reviewer import ReviewError
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.database import Database, QueryError
from nightcrew.db.queries import load_queries
from nightcrew.db.records import as_record
from nightcrew.errors import (
    DatabaseUnavailableError,
    FetchError,
    NightcrewError,
    QueueError,
    StoreError,
)
from nightcrew.log import describe_error, warning
from nightcrew.news.steps.candidates import Candidate, CandidateRow

SQL = load_queries(__file__)
T = TypeVar("T")

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
class Fenced:
    """A candidate a stage worker took, and the fence its result must be saved under."""

    candidate: Candidate
    fence: int
    shard: str
    suspect: bool = False  # its previous attempt never finished: it runs alone (``Isolation``)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Decision:
    """The ``take`` query's decision; when it is "take", the same row is the candidate taken
    (a ``CandidateRow``) and its new fence and attempt count."""

    decision: str
    died: bool
    prior_attempts: int
    prior_taken_at: datetime | None
    prior_error: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Taken:
    fence: int
    stage_attempts: int


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

    @classmethod
    def resuming(cls, token: str | None) -> Attempt:
        """A message's attempt; ``token``: a handed-back copy's, to resume its original's take."""
        return cls(token=token) if token else cls()

    @property
    def counted(self) -> bool:
        """A take of a candidate is open: its attempts are PostgreSQL's count."""
        return self.open and self.fence is not None

    def closed(self) -> None:
        """The attempt finished (the row that moved the candidate on says so)."""
        self.open = False

    async def take(
        self,
        db: Database,
        clock: Clock,
        settings: Settings,
        url: str,
        stage: str,
        *,
        busy_for: float = 0.0,
    ) -> Fenced | None:
        """Take the candidate waiting for ``stage``, counting the attempt (None: it waits for
        no such thing). Exhausted when its attempts are spent; Busy when another take of the
        last ``busy_for`` seconds is under way."""
        row = await db.fetch_one(
            SQL["take"],
            {
                "url": url,
                "stage": stage,
                "now": clock.now(),
                "token": self.token,
                "max": settings.news_max_deliveries,
                "busy_for": float(busy_for),
                "died_error": WORKER_DIED,
            },
        )
        if row is None:
            return None
        decided = as_record(_Decision, row)
        if decided.decision == "exhausted":
            raise Exhausted(url, stage, decided.prior_attempts, decided.prior_error or "?")
        if decided.decision == "busy":
            raise Busy(decided.prior_taken_at or clock.now())
        if decided.died:
            warning(
                "news.attempt_unfinished",
                stage=stage,
                url=url,
                attempts=decided.prior_attempts,
                error=WORKER_DIED,
            )
        taken = as_record(_Taken, row)
        self.url, self.stage, self.fence = url, stage, taken.fence
        self.attempts, self.open = taken.stage_attempts, True
        taken_row = as_record(CandidateRow, row)
        return Fenced(
            taken_row.candidate(), taken.fence, taken_row.source_shard, suspect=decided.died
        )

    async def finished(self, db: Database, taken: Fenced, stage: str) -> None:
        """Ended without advancing the candidate (deferred, dropped): not unfinished."""
        if self.open:
            await db.execute(
                SQL["finished"], {"url": taken.candidate.url, "stage": stage, "fence": taken.fence}
            )
            self.open = False

    async def untake(
        self,
        db: Database,
        clock: Clock,
        taken: Fenced,
        stage: str,
        *,
        held_for: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Given back uncounted (the worker stopping, the lease lost): queued again for the copy
        a stopping worker hands back, or held for ``held_for`` seconds. Should the database
        refuse, the take stays open and the copy, with its token, resumes it (counted once)."""
        now = clock.now()
        try:
            await db.execute(
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
        self.open = False

    async def retry_later(self, db: Database, clock: Clock, error: str) -> float | None:
        """Failed for now: held for a backoff (its length returned) — the attempt counted —
        after which the housekeeping sends it again; None when the candidate moved on meanwhile
        (there is nothing to retry)."""
        delay, now = backoff_seconds(self.attempts), clock.now()
        row = await db.fetch_one(
            SQL["retry_later"],
            {
                "url": self.url,
                "stage": self.stage,
                "fence": self.fence,
                "reason": f"failed for now (attempt {self.attempts}); sent again after a backoff",
                "error": error[:2000],
                "not_before": now + timedelta(seconds=delay),
                "now": now,
            },
        )
        self.open = False
        return delay if row is not None else None


class Exhausted(NightcrewError):
    """NEWS_MAX_DELIVERIES attempts at this stage spent, none finished: the candidate is
    dead-lettered, and not run again. ``error`` is the last attempt's ("worker died…" when it
    never finished)."""

    def __init__(self, url: str, stage: str, attempts: int, error: str) -> None:
        super().__init__(f"{url}: {attempts} attempts at {stage} spent; the last: {error}")
        self.url, self.stage, self.attempts, self.error = url, stage, attempts, error


class Busy(NightcrewError):
    """Another take of the candidate is under way (the write stage, which has no lease)."""

    def __init__(self, since: datetime) -> None:
        super().__init__(f"taken at {since.isoformat()}")
        self.since = since


def is_transient(exc: BaseException) -> bool:
    """Whether a stage's failure is worth another attempt after a backoff (a deadlock, a
    serialization failure, resources short, a timeout, a network error, a model answering 5xx),
    or is the message's for good — dead-lettered at once, with the reason. Classified by the
    adapters' own error types: the outside systems' drivers stay behind them."""
    if isinstance(exc, QueryError):
        sqlstate = exc.sqlstate or ""
        return sqlstate[:2] in RETRYABLE_SQLSTATE_CLASSES or sqlstate in RETRYABLE_SQLSTATES
    if isinstance(exc, ReviewError):
        return exc.transient
    return isinstance(
        exc,
        DatabaseUnavailableError | QueueError | StoreError | FetchError | TimeoutError | OSError,
    )


def backoff_seconds(attempt: int) -> float:
    """How long a candidate whose ``attempt``-th take failed for now waits for the next."""
    ceiling = min(BACKOFF_BASE_SECONDS * 2.0 ** max(attempt - 1, 0), BACKOFF_CAP_SECONDS)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


async def patiently(
    stopping: asyncio.Event,
    step: Callable[[], Awaitable[T]],
    *,
    what: str,
    transient_tries: int = 0,
) -> T:
    """``step``, again and again while the database is unavailable (backing off to 10 s),
    until it succeeds or the worker stops (``stopping``); and up to ``transient_tries`` more
    times after a statement worth trying again (a deadlock, a serialization failure). A stage
    saves its result this way once its expensive step is done, so neither an outage nor a
    deadlock costs a second model call."""
    pause, tries = 0.5, 0
    while True:
        try:
            return await step()
        except DatabaseUnavailableError as exc:
            if stopping.is_set():
                raise
            warning("news.database_unavailable", step=what, error=describe_error(exc))
        except QueryError as exc:
            if tries >= transient_tries or not is_transient(exc):
                raise
            tries += 1
            warning("news.save_retried", step=what, attempt=tries, error=describe_error(exc))
        await asyncio.sleep(pause * random.uniform(0.5, 1.0))
        pause = min(pause * 2, 10.0)


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
