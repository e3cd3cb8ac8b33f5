"""SIGTERM to a `nightcrew news worker` holding messages, on a real RabbitMQ with a slow model
stand-in: what it holds is finished within the grace period, or — past it — cancelled (its
leases released) and handed back as a fresh copy, which spends none of the message's
deliveries. A quorum queue counts every plain return toward x-delivery-limit (a reject, and a
closed channel's unacknowledged messages alike), so without that a few restarts would
dead-letter healthy messages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline.message_outbox import broker_of
from nightcrew.news.engines.pipeline.passes import run_pass
from tests.faults.test_news_pipeline_faults import _nightcrew
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_env,
    pipeline_runtime,
    wait_for,
)
from tests.support.services import needs_rabbitmq
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq


class Worker:
    """One `nightcrew news worker --stage all` process, its events in its own log file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.env, self.log, self.args = {**os.environ, **env}, log, args
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Worker:
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                _nightcrew(),
                *("news", "worker", "--stage", "all", *self.args),
                env=self.env,
                stdout=out,
                stderr=out,
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), 90)

    def events(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


def _asked(model: ModelStandIn, n: int) -> Any:
    async def check() -> bool:
        return sum(model.reviews.values()) >= n

    return check


async def _all_written(db: Database, n: int) -> bool:
    waiting = await count(db, "SELECT count(*) FROM news.candidates")
    return waiting == 0 and await count(db, "SELECT count(*) FROM news.articles") == n


async def _one_review_per_article(db: Database, n: int) -> None:
    assert await count(db, "SELECT count(*) FROM news.articles") == n
    assert await count(db, "SELECT count(DISTINCT article_id) FROM news.reviews") == n
    assert await count(db, "SELECT count(*) FROM news.reviews") == n


async def test_sigterm_mid_review_finishes_the_reviews_in_hand_and_exits_0(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    with ModelStandIn(delay=3.0) as model, FeedFarm(feeds=2, items=2) as farm:
        env = pipeline_env(fresh_db_url, prefix, model, tmp_path / "store")
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            async with Worker(env, tmp_path / "first.log", "--concurrency", "2") as first:
                await run_pass(runtime, SystemClock(), "s")
                await wait_for(_asked(model, 2), within=60, what="two reviews under way")
                in_hand = set(model.reviews)
                code = await first.terminate()
            assert code == 0
            events = first.events()
            reviewed = {e["url"] for e in events if e.get("outcome") == "reviewed"}
            assert in_hand <= reviewed  # finished within the grace, not given back
            assert not [e for e in events if e.get("outcome") == "handed_back"]
            assert events[-1]["event"] == "news.worker_stopped"

            async with Worker(env, tmp_path / "second.log", "--concurrency", "2") as second:
                await wait_for(lambda: _all_written(db, 4), within=90, what="4 articles")
                assert await second.terminate() == 0
        assert dict(model.reviews) == {url: 1 for url in farm.article_urls()}
        await _one_review_per_article(db, 4)


async def test_past_the_grace_held_messages_go_back_without_spending_their_deliveries(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    restarts = 3  # more graceful stops than NEWS_MAX_DELIVERIES allows plain returns
    with ModelStandIn(delay=8.0) as model, FeedFarm(feeds=1, items=2) as farm:
        env = pipeline_env(fresh_db_url, prefix, model, tmp_path / "store", NEWS_MAX_DELIVERIES="2")
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            for n in range(restarts):
                log = tmp_path / f"stopped-{n}.log"
                args = ("--concurrency", "2", "--grace", "0.5")
                async with Worker(env, log, *args) as worker:
                    if n == 0:  # the pass waits for the first worker's fetch, then admits
                        await run_pass(runtime, SystemClock(), "s")
                    await wait_for(
                        _asked(model, 2 * (n + 1)), within=90, what=f"review round {n + 1}"
                    )
                    assert await worker.terminate() == 0
                back = [e for e in worker.events() if e.get("outcome") == "handed_back"]
                assert sorted(e["stage"] for e in back) == ["review", "review"]
                assert all(e["acked"] for e in back)
                # a fresh copy each time: the first delivery again, nothing spent
                assert [e["delivery"] for e in back] == [1, 1]
                stopped = worker.events()[-1]
                assert stopped["event"] == "news.worker_stopped" and not stopped["failed"]

            async with Worker(env, tmp_path / "last.log", "--concurrency", "2") as last:
                await wait_for(lambda: _all_written(db, 2), within=120, what="2 articles")
                assert await last.terminate() == 0
            broker = broker_of(runtime)
            assert await broker.ready("review", dlq=True) == 0  # nothing dead-lettered
            assert await broker.ready("review") == 0
        # each stop cut its reviews short (the model was asked again, its lease released at
        # once); only the last answer counted: one review and one article per URL
        assert dict(model.reviews) == {url: restarts + 1 for url in farm.article_urls()}
        await _one_review_per_article(db, 2)
