"""``nightcrew news worker``: consume the pipeline's stage queues until told to stop.

Each message is handled by its stage (``stages.py``) and acknowledged only after the
stage's effect is committed; one JSON event per message says what it came to. A candidate's
attempts are counted in PostgreSQL when its stage takes it (a worker that dies mid-stage counts
too, see ``attempts``). A failure worth trying again (``attempts.is_transient``) holds the candidate
for a backoff — exponential, with jitter — and acknowledges the message; the housekeeping sends
it again once the backoff has passed (a message with no candidate taken — a fetch — waits out
its backoff here and is requeued). Any other failure, and the NEWS_MAX_DELIVERIES-th, is
dead-lettered at once to ``{prefix}.{stage}.dlq`` with the error in ``x-last-error``. A
database that goes away is waited for, as long as it takes (the message held, not failed: an
outage must not spend deliveries and dead-letter the whole queue); a stopping worker gives its
message back.
Alongside, every few seconds, the worker re-sends admitted candidates whose backoff is over
(admitting new work is the passes' alone), relays the outbox, refreshes stale snapshots (write
stage) and adds its counts to ``news.stage_counters`` for /metrics.

Each stage is consumed on its own channel with its own prefetch: ``--concurrency`` for every
stage, or what NEWS_STAGE_PREFETCH (``fetch=8,enrich=8,review=2,write=16``) names.

SIGTERM (or SIGINT): every consumer is cancelled at once (basic.cancel: nothing new arrives);
the messages in hand — the stage work under way — get the grace period to finish and be
acknowledged. What is still unfinished then is cancelled (its lease released) and handed back
as a fresh copy published before the original is acknowledged: a quorum queue counts every
return toward its delivery limit — a reject and a closed channel's unacknowledged messages
alike (measured on RabbitMQ 3.10) — so plain returns at each restart would dead-letter healthy
messages. The copy carries the deliveries its original had spent, and its attempt's token (a
take that could not be given back uncounted is resumed by the next worker, not counted twice).
The default grace covers a review in hand to its end — the model's timeout, for the verdict and
for the translation after it — so a stop never throws away a model call already paid for; a
review not yet begun is not begun (its message goes back at once). Exit 0.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nightcrew.adapters.broker import Delivery, Outgoing
from nightcrew.adapters.reviewer import CALL_SECONDS
from nightcrew.clock import Clock
from nightcrew.errors import DatabaseUnavailableError, NightcrewError, QueueError
from nightcrew.jsonable import Jsonable, JsonObject, omitted
from nightcrew.log import SecretValues, describe_error, event, warning
from nightcrew.news.engines.pipeline import message_outbox, metrics, notes, stages
from nightcrew.news.engines.pipeline.attempts import (
    Attempt,
    Exhausted,
    backoff_seconds,
    is_transient,
    patiently,
)
from nightcrew.news.engines.pipeline.heartbeat import Stopping
from nightcrew.runtime import Runtime
from nightcrew.setting_parsers import STAGES, parse_stage_prefetch

HOUSEKEEPING_SECONDS = 5.0
# One model call at most, its retries included (reviewer.CALL_SECONDS). A review in hand makes
# two (the verdict, then the translation of an accepted one's summary); the default grace lets
# both end, so a SIGTERM never pays for a call twice.
MODEL_CALL_SECONDS = CALL_SECONDS
STOP_GRACE_SECONDS = 2 * MODEL_CALL_SECONDS + 10.0
# a handed-back copy's header: its original's attempt token (an open take is resumed with it)
ATTEMPT_TOKEN_HEADER = "x-attempt-token"
CANCEL_WAIT_SECONDS = 10.0  # past the grace: for cancelled stage work to release its leases


@dataclass
class WorkerSummary(Jsonable):
    stages: list[str]
    processed: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    # housekeeping rounds completed (relay, re-sends, counters): what a caller waits on to know
    # the worker has had its chance to act — not part of the summary it prints
    housekeeping_rounds: int = omitted(default=0)


def _broker_event(name: str, detail: str) -> None:
    (event if name == "news.broker_connected" else warning)(name, detail=detail)


class Worker:
    def __init__(
        self, runtime: Runtime, clock: Clock, stage_names: list[str], concurrency: int
    ) -> None:
        unknown = [s for s in stage_names if s not in STAGES]
        if unknown or not stage_names:
            raise NightcrewError(f"unknown stage {unknown or stage_names}; expected {STAGES}")
        self._stopping = asyncio.Event()
        self.ctx = stages.StageContext(
            runtime=runtime,
            clock=clock,
            broker=message_outbox.broker_of(runtime),
            stopping=self._stopping,
        )
        self.stage_names = stage_names
        self.concurrency = concurrency
        self._redis_since: float | None = None  # the breaker's clock at the last look
        self._secrets = SecretValues(runtime.settings.secret_values())
        named = parse_stage_prefetch(runtime.settings.news_stage_prefetch)
        self.prefetch = {stage: named.get(stage, concurrency) for stage in stage_names}
        self.summary = WorkerSummary(stages=stage_names)
        self._unflushed: dict[str, Counter[str]] = {
            "processed": Counter(),
            "failed": Counter(),
            "dead": Counter(),
        }
        # the stage work under way, and the message each one settles
        self._inflight: dict[asyncio.Task[Any], Delivery] = {}
        # messages to hand back at the stop rather than return (see the module's docstring)
        self._give_back: list[Delivery] = []
        self._attempts: dict[Delivery, Attempt] = {}  # each message's take, while held

    async def run(self, stop: asyncio.Event, *, grace: float = STOP_GRACE_SECONDS) -> WorkerSummary:
        await self.ctx.broker.connect()  # a broker that is not there at all: exit 2, one line
        consumers = self.ctx.broker.consumers(
            {stage: self._handler(stage) for stage in self.stage_names}, self.prefetch
        )
        event(
            "news.worker_started",
            stages=self.stage_names,
            concurrency=self.concurrency,
            prefetch=self.prefetch,
        )
        housekeeping = asyncio.create_task(self._housekeeping())
        try:
            await consumers.run(stop, _broker_event)  # returns with every consumer cancelled
        finally:
            self._stopping.set()
            if self._inflight:
                await asyncio.wait(set(self._inflight), timeout=grace)
            await self._cancel_unfinished()
            await self._hand_back()
            await consumers.close()  # returns only what could not be handed back
            housekeeping.cancel()
            await asyncio.gather(housekeeping, return_exceptions=True)
            await self._housekeep_once(final=True)
        event("news.worker_stopped", connections=consumers.connections, **self.summary.to_json())
        return self.summary

    def _handler(self, stage: str) -> Callable[[Delivery], Awaitable[None]]:
        async def handle(delivery: Delivery) -> None:
            # A task of our own, shielded: when the broker connection drops, aio-pika cancels
            # the callback, but the stage must still finish what it started (its model call,
            # its commit) — else the redelivered message would pay for that step again.
            task = asyncio.create_task(self._handle(stage, delivery))
            self._inflight[task] = delivery
            task.add_done_callback(lambda done: self._inflight.pop(done, None))
            await asyncio.shield(task)

        return handle

    async def _cancel_unfinished(self) -> None:
        """Stage work still running after the grace: cancelled, so its leases are released
        now (not when their TTL runs out) for whoever gets the message next."""
        unfinished = dict(self._inflight)
        if not unfinished:
            return
        for task, delivery in unfinished.items():
            task.cancel()
            self._give_back.append(delivery)
        await asyncio.wait(set(unfinished), timeout=CANCEL_WAIT_SECONDS)

    async def _hand_back(self) -> None:
        """Every message held but not settled: a fresh copy published (confirmed), then the
        original acknowledged. Should the broker refuse, the original stays unacknowledged
        and the closing channel returns it (spending one delivery)."""
        # an unreadable body is returned as it came (its copy would lose the original bytes)
        held = [d for d in self._give_back if not d.settled and d.channel_open and d.readable]
        self._give_back.clear()
        if not held:
            return
        try:
            await self.ctx.broker.publish([self._copy(d) for d in held])
        except QueueError as exc:
            warning("news.hand_back_failed", messages=len(held), error=describe_error(exc))
            return
        for delivery in held:
            acked = await delivery.ack()
            event(
                "news.message",
                stage=delivery.stage,
                outcome="handed_back",
                message_id=delivery.message_id,
                delivery=delivery.deliveries,
                acked=acked,
            )

    def _copy(self, delivery: Delivery) -> Outgoing:
        """The fresh copy of a message handed back, with its attempt's token."""
        copy = delivery.handed_back()
        attempt = self._attempts.get(delivery)
        if attempt is None:
            return copy
        headers = {**copy.headers, ATTEMPT_TOKEN_HEADER: attempt.token}
        return Outgoing(
            message_id=copy.message_id, stage=copy.stage, body=copy.body, headers=headers
        )

    async def _handle(self, stage: str, delivery: Delivery) -> None:
        if self._stopping.is_set():
            # arrived after the stop (a consumer's cancel raced it): someone else's now
            self._give_back.append(delivery)
            return
        token = delivery.headers.get(ATTEMPT_TOKEN_HEADER)
        # this task's own: the stage counts its take there
        attempt = Attempt.resuming(str(token) if token else None)
        self._attempts[delivery] = attempt
        try:
            await self._settle(stage, delivery, attempt)
        finally:
            if delivery not in self._give_back:
                self._attempts.pop(delivery, None)

    async def _settle(self, stage: str, delivery: Delivery, attempt: Attempt) -> None:
        started = time.perf_counter()
        try:
            outcome = await self._patiently(stage, attempt, delivery.body)
        except Exhausted as exc:  # its attempts were spent before: nothing runs
            await self._dead_letter(
                stage,
                delivery,
                exc.error,
                started,
                deliveries=exc.attempts,
                reason="delivery_limit",
            )
            return
        except Exception as exc:
            stopped = isinstance(exc, DatabaseUnavailableError | Stopping)
            if stopped and self._stopping.is_set():
                # ``patiently`` waits an outage out until the stop, and a stopping worker starts
                # no expensive step: not the message's failure
                self._give_back.append(delivery)
                return
            await self._failed(stage, delivery, exc, started, attempt)
            return
        acked = await delivery.ack()
        self.summary.processed[stage] += 1
        self.summary.outcomes[outcome.name] += 1
        self._unflushed["processed"][stage] += 1
        event(
            "news.message",
            stage=stage,
            outcome=outcome.name,
            message_id=delivery.message_id,
            delivery=delivery.deliveries,
            acked=acked,
            ms=round((time.perf_counter() - started) * 1000, 1),
            **outcome.detail,
        )

    async def _patiently(self, stage: str, attempt: Attempt, body: JsonObject) -> stages.Outcome:
        """The stage, run again while the database is unavailable before its expensive step
        (after it, the stage itself waits to save its result: see ``attempts.patiently``)."""
        return await patiently(
            self.ctx.stopping,
            lambda: stages.HANDLERS[stage](self.ctx, attempt, body),
            what=stage,
        )

    async def _failed(
        self,
        stage: str,
        delivery: Delivery,
        exc: Exception,
        started: float,
        attempt: Attempt,
    ) -> None:
        """A failure worth trying again is tried again after a backoff, until the delivery
        limit; any other is dead-lettered at once. A candidate's attempts are PostgreSQL's
        count (its take counted them); a message that took none (a fetch, a failure before the
        take) goes by the broker's."""
        error = describe_error(exc)
        transient = is_transient(exc)
        self.summary.failed[stage] += 1
        self._unflushed["failed"][stage] += 1
        counted = attempt.counted
        spent = attempt.attempts if counted else delivery.deliveries
        fields = {
            "stage": stage,
            "message_id": delivery.message_id,
            "delivery": delivery.deliveries,
            "attempt": spent,
            "transient": transient,
            "error": error,
            "ms": round((time.perf_counter() - started) * 1000, 1),
        }
        if not transient or spent >= self.ctx.runtime.settings.news_max_deliveries:
            reason = "delivery_limit" if transient else "failed"
            await self._dead_letter(
                stage, delivery, error, started, deliveries=spent, reason=reason
            )
            return
        if counted:
            try:
                delay = await attempt.retry_later(self.ctx.runtime.db, self.ctx.clock, error)
            except NightcrewError as hold_error:  # not held: the broker retries it instead
                await delivery.requeue()
                warning("news.message", outcome="failed", retried=True, **fields)
                warning("news.retry_unrecorded", error=describe_error(hold_error), **fields)
                return
            acked = await delivery.ack()
            warning(
                "news.message",
                outcome="retrying" if delay is not None else "skipped",
                retry_in=round(delay, 1) if delay is not None else None,
                acked=acked,
                **fields,
            )
            return
        delay = backoff_seconds(spent)
        warning("news.message", outcome="retrying", retry_in=round(delay, 1), **fields)
        try:
            async with asyncio.timeout(delay):
                await self._stopping.wait()
            self._give_back.append(delivery)  # stopping: handed back, nothing spent
            return
        except TimeoutError:
            pass
        await delivery.requeue()

    async def _dead_letter(
        self,
        stage: str,
        delivery: Delivery,
        error: str,
        started: float,
        *,
        deliveries: int,
        reason: str,
    ) -> None:
        """To ``{prefix}.{stage}.dlq`` with the error, the candidate marked ``dead``; should the
        broker refuse the letter, the message is requeued instead."""
        fields = {
            "stage": stage,
            "message_id": delivery.message_id,
            "delivery": delivery.deliveries,
            "attempts": deliveries,
            "error": error,
            "ms": round((time.perf_counter() - started) * 1000, 1),
        }
        letter = Outgoing(
            message_id=delivery.message_id,
            stage=stage,
            body=delivery.body,
            headers={
                # a dead letter is kept and shown (`news dlq list`): no secret in it, even
                # one an upstream echoed, whole or cut at the 2,000th character
                "x-last-error": self._secrets.redact(error[:2000]),
                "x-deliveries": deliveries,
                "x-dead-reason": reason,
            },
        )
        try:
            await self.ctx.broker.publish([letter], dead=True)
        except QueueError as publish_error:  # not dead-lettered: stays in its queue
            await delivery.requeue()
            warning(
                "news.message",
                outcome="failed",
                retried=True,
                dead_letter_error=describe_error(publish_error),
                **fields,
            )
            return
        try:
            await stages.on_dead(self.ctx, stage, delivery.body, error)
        except NightcrewError as mark_error:
            warning("news.dead_letter_unrecorded", error=describe_error(mark_error), **fields)
        await delivery.ack()
        self.summary.dead_lettered[stage] += 1
        self._unflushed["dead"][stage] += 1
        warning("news.message", outcome="dead_lettered", reason=reason, **fields)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            await self._housekeep_once()

    async def _housekeep_once(self, *, final: bool = False) -> None:
        """Relay the outbox, refresh stale snapshots, flush the counters: each on its own,
        so one failing does not stop the others (nor the worker)."""
        jobs: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("counters", self._flush),
            ("redis", self._note_redis),
        ]
        if not final:
            jobs.insert(0, ("release and relay", self._relay))
        if "write" in self.stage_names:
            jobs.append(("snapshots", lambda: stages.refresh_snapshots(self.ctx, force=final)))
        for name, job in jobs:
            try:
                await job()
            except (NightcrewError, QueueError) as exc:
                warning("news.housekeeping_failed", job=name, error=describe_error(exc))
        self.summary.housekeeping_rounds += 1

    async def _note_redis(self) -> None:
        """A Redis failure this process saw since the last look, noted for the passes'
        redisEnabled (a pass runs in another process, which cannot see this one's breaker)."""
        self._redis_since = await notes.note_redis_trouble(
            self.ctx.runtime.db,
            self.ctx.runtime.news_adapters(),
            since=self._redis_since,
            now=self.ctx.clock.now(),
        )

    async def _relay(self) -> None:
        """Re-send admitted candidates whose backoff is over, then relay the outbox."""
        db, now = self.ctx.runtime.db, self.ctx.clock.now()
        await message_outbox.send_owed(
            self.ctx.broker, db, await message_outbox.resend_due(db, now)
        )
        await message_outbox.relay(self.ctx.broker, db, now)

    async def _flush(self) -> None:
        snapshot = {k: Counter(v) for k, v in self._unflushed.items()}
        for c in self._unflushed.values():
            c.clear()
        try:
            await metrics.add_counters(self.ctx.runtime.db, snapshot)
        except NightcrewError:
            for key, c in snapshot.items():  # kept for the next flush
                self._unflushed[key].update(c)
            raise
