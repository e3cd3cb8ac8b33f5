"""A message that kills its worker every time before its stage takes anything (no lease, no
attempt counted in PostgreSQL): no worker lives to fail it, so RabbitMQ's own delivery limit
(x-delivery-limit = NEWS_MAX_DELIVERIES) — the backstop — dead-letters it; `news dlq list` shows
it, and `news dlq replay` re-drives it once the cause is gone. Meanwhile the queue flows. (One
that kills its worker mid-stage, lease held and attempt counted, is
test_news_pipeline_attempts.py's.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    worker_running,
)
from tests.support.services import needs_rabbitmq
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq

MAX_DELIVERIES = 2


async def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        _nightcrew(),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


@pytest.mark.slow
async def test_a_message_that_kills_its_worker_is_dead_lettered_by_the_delivery_limit(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    import os

    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, NEWS_MAX_DELIVERIES=str(MAX_DELIVERIES)
    )
    cli_env = {**os.environ, **env}
    with FeedFarm(feeds=1, items=3) as farm:
        poison = f"{farm.url}/articles/0-1"
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            broker = broker_of(runtime)
            deaths = 0
            # the other stages in this process; review only in the poisoned worker processes,
            # one message at a time, so each death returns the poison alone
            async with worker_running(runtime, ["fetch", "enrich", "write"]):
                await run_pass(runtime, SystemClock(), "s")
                while await broker.ready("review", dlq=True) == 0:
                    assert deaths <= MAX_DELIVERIES, "the broker never dead-lettered it"
                    proc = await asyncio.create_subprocess_exec(
                        sys.executable,
                        *("-m", "tests.faults._poison_worker", json.dumps(env), poison),
                        env=cli_env,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.STDOUT,
                    )
                    out, _ = await asyncio.wait_for(proc.communicate(), 90)
                    assert proc.returncode == -9, out.decode()[-2000:]
                    assert f"killed by {poison}".encode() in out
                    deaths += 1
                    if deaths > MAX_DELIVERIES:
                        # the limit is spent: the broker dead-letters it, a moment after the
                        # death (the healthy reviews still ready would not say it had)
                        await wait_for(
                            lambda: _dead_lettered(runtime), within=30, what="the poison's letter"
                        )
                    else:
                        await wait_for(
                            lambda: _letter_or_ready(runtime), within=30, what="the poison back"
                        )
                # the healthy articles were not held up by it
                healthy = farm.article_urls() - {poison}
                async with worker_running(runtime, ["review"]):
                    await wait_for(lambda: _articles(db, 2), within=60, what="2 healthy written")
            assert deaths == MAX_DELIVERIES + 1  # the first delivery, and the limit's returns
            assert set(model.reviews) == healthy

            listed = await _cli(cli_env, "news", "dlq", "list", "--stage", "review", "--json")
            assert listed.returncode == 0, listed.stderr
            [letter] = json.loads(listed.stdout)
            assert letter["stage"] == "review" and letter["body"]["url"] == poison
            assert letter["reason"] == "delivery_limit"
            assert "dead-lettered by the broker (delivery_limit)" in letter["error"]
            text = await _cli(cli_env, "news", "dlq", "list")
            assert poison in text.stdout and letter["id"] in text.stdout

            # the cause gone (ordinary workers now), the letter re-driven once
            replayed = await _cli(cli_env, "news", "dlq", "replay", "--id", letter["id"])
            assert replayed.returncode == 0, replayed.stderr
            assert replayed.stdout.strip() == "replayed 1 dead letter"
            async with worker_running(runtime):
                await wait_for(lambda: _articles(db, 3), within=60, what="the poison written")
            assert await broker.ready("review", dlq=True) == 0
            empty = await _cli(cli_env, "news", "dlq", "list", "--json")
            assert json.loads(empty.stdout) == []
        assert model.reviews[poison] == 1
        assert await count(db, "SELECT count(*) FROM news.reviews") == 3
        assert await count(db, "SELECT count(*) FROM news.candidates") == 0


async def _letter_or_ready(runtime: object) -> bool:
    from nightcrew.runtime import Runtime

    assert isinstance(runtime, Runtime)
    broker = broker_of(runtime)
    return await broker.ready("review", dlq=True) + await broker.ready("review") > 0


async def _articles(db: Database, n: int) -> bool:
    return await count(db, "SELECT count(*) FROM news.articles") >= n


async def _dead_lettered(runtime: object) -> bool:
    from nightcrew.runtime import Runtime

    assert isinstance(runtime, Runtime)
    return await broker_of(runtime).ready("review", dlq=True) > 0
