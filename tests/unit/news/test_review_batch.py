"""The inline run's review batch: concurrent within the process's slots, the shard lease renewed
while it runs, and cut short — calls in flight cancelled — when a renewal is refused."""

from __future__ import annotations

import asyncio
import time

import pytest

from nightcrew.adapters.model_calls import ModelCalls
from nightcrew.adapters.reviewer import Article, CallScope, Spend, Verdict
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.news.steps.candidates import Candidate
from nightcrew.news.steps.entries import FeedItem
from nightcrew.news.steps.review import ItemReview, review_batch

pytestmark = pytest.mark.unit


class SlowModel:
    """A reviewer the engines treat as a model: each review takes ``delay`` seconds in one of
    ``calls``' slots, spends 10 + 2 tokens, and is counted as it starts and as it ends. Past the
    first ``answered`` reviews (when given), a review never answers: it waits to be cancelled."""

    name = "chat:slow"
    translation_enabled = False

    def __init__(self, delay: float, calls: ModelCalls, *, answered: int | None = None) -> None:
        self.delay, self.calls, self.answered = delay, calls, answered
        self.started: list[str] = []
        self.finished: list[str] = []
        self._waits: dict[int, asyncio.Event] = {}  # n → set once n reviews have started

    async def until_started(self, n: int) -> None:
        if len(self.started) < n:
            await self._waits.setdefault(n, asyncio.Event()).wait()

    async def aclose(self) -> None:
        return None

    async def review(self, article: Article, scope: CallScope | None = None) -> Verdict:
        scope = scope or CallScope()
        async with self.calls.slot():
            scope.ready()
            self.started.append(article.url)
            for n, started in self._waits.items():
                if len(self.started) >= n:
                    started.set()
            if self.answered is not None and len(self.started) > self.answered:
                await asyncio.Event().wait()  # until cancelled
            await asyncio.sleep(self.delay)
            scope.spend.add(10, 2)
            self.finished.append(article.url)
        return Verdict(accepted=True, reviewer=self.name)

    async def translate(
        self, text: str, language: str, scope: CallScope | None = None
    ) -> str | None:
        return None


def batch(n: int) -> list[Candidate]:
    return [
        Candidate(
            source_id=1,
            source_label="S (s)",
            item=FeedItem(url=f"u{i}", title="t", summary="s", published=None, image_url=None),
            reason="new",
            attempts=0,
        )
        for i in range(n)
    ]


async def test_a_batch_runs_within_the_slots_and_keeps_its_order() -> None:
    calls = ModelCalls(4)
    model = SlowModel(0.05, calls)
    spend = Spend()
    renewals = 0

    async def keep_alive() -> bool:
        nonlocal renewals
        renewals += 1
        return True

    started = time.monotonic()
    done = await review_batch(
        model, batch(20), spend=spend, keep_alive=keep_alive, renew_every=0.04
    )
    elapsed = time.monotonic() - started
    assert [r.candidate.url for r in done.done] == [f"u{i}" for i in range(20)]
    assert done.cut_off == [] and calls.most_in_flight == 4
    # 20 calls of 0.05 s over 4 slots take 0.25 s at the least; that they ran 4 at a time, not
    # one after another, is most_in_flight's to say (a busy machine only stretches the time)
    assert elapsed >= 0.25
    assert (spend.prompt_tokens, spend.completion_tokens) == (200, 40)
    assert renewals >= 3  # renewed while it ran, not after


async def test_a_lease_lost_mid_batch_cancels_the_calls_in_flight() -> None:
    calls = ModelCalls(4)
    model = SlowModel(0.0, calls, answered=4)  # the second wave never answers by itself

    async def lost() -> bool:
        await model.until_started(8)  # refused once the second wave is in flight
        return False

    done = await review_batch(model, batch(12), spend=Spend(), keep_alive=lost, renew_every=0.01)
    # the first wave of 4 finished, the second was cut by the refused renewal; the third never
    # began
    assert [r.candidate.url for r in done.done] == ["u0", "u1", "u2", "u3"]
    assert [c.url for c in done.cut_off] == [f"u{i}" for i in range(4, 12)]
    assert len(model.started) == 8 and model.finished == ["u0", "u1", "u2", "u3"]
    assert calls.in_flight == 0  # every slot given back


class TranslatingModel(SlowModel):
    """A model whose every review is accepted with a summary at once, and whose translations
    never answer by themselves (they wait to be cancelled)."""

    translation_enabled = True

    def __init__(self, calls: ModelCalls) -> None:
        super().__init__(0.0, calls)
        self.translating = 0
        self.slots_full = asyncio.Event()  # every slot holds a translation

    async def review(self, article: Article, scope: CallScope | None = None) -> Verdict:
        await super().review(article, scope)
        return Verdict(accepted=True, summary=f"about {article.url}", reviewer=self.name)

    async def translate(
        self, text: str, language: str, scope: CallScope | None = None
    ) -> str | None:
        async with self.calls.slot():
            self.translating += 1
            if self.translating == self.calls.concurrency:
                self.slots_full.set()
            await asyncio.Event().wait()  # until cancelled
        return None


async def test_a_lease_lost_while_translations_are_in_flight_keeps_the_paid_reviews() -> None:
    """A review is paid for when it answers: losing the lease while its translation is in
    flight cancels the translation, not the review. The batch hands every answered review on,
    untranslated (the translation backlog asks for it later), and cuts off none of them."""
    calls = ModelCalls(4)
    model = TranslatingModel(calls)

    async def lost() -> bool:
        await model.slots_full.wait()  # 4 translations in flight that never answer
        return False

    done = await review_batch(model, batch(6), spend=Spend(), keep_alive=lost, renew_every=0.01)
    assert [r.candidate.url for r in done.done] == [f"u{i}" for i in range(6)]
    assert all(r.verdict is not None and r.translation is None for r in done.done)
    assert done.cut_off == [] and calls.in_flight == 0


async def test_a_cancelled_batch_cancels_its_calls_and_propagates() -> None:
    calls = ModelCalls(2)
    model = SlowModel(0.5, calls)

    async def alive() -> bool:
        return True

    task = asyncio.create_task(
        review_batch(model, batch(6), spend=Spend(), keep_alive=alive, renew_every=1.0)
    )
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(model.started) == 2 and model.finished == [] and calls.in_flight == 0


async def test_a_stop_wins_over_a_renewal_that_fails_as_it_is_cancelled() -> None:
    """SIGTERM while a renewal is on its way to a database that is going away: the renewal,
    cancelled, fails in its own way (a driver's lost connection). The batch still ends as
    cancelled, so the caller keeps the reviews that arrived and the process ends as stopped."""
    calls = ModelCalls(2)
    model = SlowModel(0.0, calls, answered=2)  # two answer, the rest never do
    renewing = asyncio.Event()

    async def renewal_cut_by_the_stop() -> bool:
        renewing.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise DatabaseUnavailableError("lost PostgreSQL while renewing") from None
        return True

    arrived: dict[int, ItemReview] = {}
    task = asyncio.create_task(
        review_batch(
            model,
            batch(6),
            spend=Spend(),
            keep_alive=renewal_cut_by_the_stop,
            renew_every=0.0,
            arrived=arrived,
        )
    )
    await model.until_started(4)  # two answered, two in flight for ever
    await renewing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(arrived) == [0, 1] and calls.in_flight == 0
