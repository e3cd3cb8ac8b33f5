"""The news pipeline across real processes, on a real RabbitMQ: several `nightcrew news worker`
processes share the work; one SIGKILLed mid-review loses nothing and repeats no review; the
broker connection cut and restored under them; a crash between the candidates' commit and
their publish. Every article written exactly once, every review once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline.message_outbox import broker_of
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.setting_parsers import STAGES
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_env,
    pipeline_runtime,
    wait_for,
    worker_running,
)
from tests.support.proxy import TcpProxy
from tests.support.services import AMQP_URL, host_port, needs_rabbitmq, with_port
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq


def _nightcrew() -> str:
    return str(Path(sys.executable).parent / "nightcrew")


@pytest.fixture
def model() -> Iterator[ModelStandIn]:
    with ModelStandIn(delay=0.02) as server:
        yield server


class Workers:
    """`nightcrew news worker` processes, each logging to its own file."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = {**os.environ, **env}
        self.logs = logs
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        log = (self.logs / f"worker-{len(self.procs)}.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            _nightcrew(),
            *("news", "worker", "--stage", "all", "--concurrency", "4", *args),
            env=self.env,
            stdout=log,
            stderr=log,
        )
        self.procs.append(proc)
        return proc

    async def stop_all(self) -> list[int]:
        codes = []
        for proc in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            codes.append(await asyncio.wait_for(proc.wait(), 60))
        return codes

    def tail(self, index: int, lines: int = 40) -> str:
        """The end of a worker's log, for an assertion that names why it stopped as it did."""
        text = (self.logs / f"worker-{index}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def events(self, index: int) -> list[dict[str, object]]:
        lines = (self.logs / f"worker-{index}.log").read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


@asynccontextmanager
async def workers(env: dict[str, str], logs: Path) -> AsyncIterator[Workers]:
    crew = Workers(env, logs)
    try:
        yield crew
    finally:
        for proc in crew.procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _articles(db: Database) -> list[str]:
    return [r["url"] for r in await db.fetch("SELECT url FROM news.articles ORDER BY url")]


async def _all_written(db: Database, n: int) -> bool:
    waiting = await count(db, "SELECT count(*) FROM news.candidates")
    return waiting == 0 and len(await _articles(db)) == n


async def _one_review_each(db: Database) -> None:
    assert (
        await count(
            db,
            "SELECT count(*) FROM (SELECT article_id FROM news.reviews GROUP BY article_id"
            " HAVING count(*) > 1) twice",
        )
        == 0
    )
    assert await count(db, "SELECT count(*) FROM news.reviews") == await count(
        db, "SELECT count(*) FROM news.articles"
    )


@pytest.mark.slow
async def test_three_worker_processes_write_every_article_once_and_the_snapshot(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    # a queue limit well under the 300 new items: each pass admits at most 60, and the passes
    # drain the backlog in bounded batches while three processes share the stages' work
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path / "store", INGESTION_BACKPRESSURE_QUEUE_LIMIT="60"
    )
    with FeedFarm(feeds=50, items=6) as farm:
        await add_farm_sources(db, farm)
        async with workers(env, tmp_path) as crew, pipeline_runtime(env, db) as runtime:
            for _ in range(3):
                await crew.start()
            reports = []

            async def passes_until_done() -> bool:
                reports.append((await run_pass(runtime, SystemClock(), "s")).to_json())
                return await _all_written(db, 300)

            await wait_for(passes_until_done, within=180, what="300 articles", poll=1.0)
            codes = await crew.stop_all()
        assert codes == [0, 0, 0], [crew.tail(i) for i, c in enumerate(codes) if c]
        first = reports[0]
        assert first["enqueuedSources"] == 50 and first["queuedCount"] == 300
        assert first["admittedCount"] == 60 and first["deferredCount"] == 240
        assert all(r["admittedCount"] <= 60 for r in reports)
        assert await _articles(db) == sorted(farm.article_urls())
        assert set(model.reviews) == farm.article_urls() and max(model.reviews.values()) == 1
        await _one_review_each(db)
        handled = [
            sum(1 for e in crew.events(i) if e.get("event") == "news.message") for i in range(3)
        ]
        assert all(n > 0 for n in handled), f"every worker took a share: {handled}"
        snapshot = json.loads((tmp_path / "store" / "news" / "snapshots" / "s.json").read_bytes())
        newest = await db.fetch(
            "SELECT url FROM news.articles WHERE status = 'accepted'"
            " ORDER BY created_at DESC, id DESC LIMIT 50"
        )
        assert [a["url"] for a in snapshot["articles"]] == [r["url"] for r in newest]


@pytest.mark.slow
async def test_a_silent_database_under_three_workers_dead_letters_nothing(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """PostgreSQL blackholed — connections accepted, nothing ever answered — for 60 s under
    three worker processes at work on 300 articles: every article written exactly once, no
    dead letter, and no delivery or attempt spent on the outage (no message failed, retried
    or redelivered)."""
    from urllib.parse import urlsplit

    from tests.faults.test_database_faults import _via

    port = urlsplit(fresh_db_url).port
    if port is None:
        pytest.skip("the fault tests need PostgreSQL on 127.0.0.1:PORT (DATABASE_URL)")
    proxy = TcpProxy(port)
    await proxy.start()
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path / "store")
    silent = {**env, "DATABASE_URL": _via(fresh_db_url, proxy.port)}
    try:
        with FeedFarm(feeds=50, items=6) as farm:
            await add_farm_sources(db, farm)
            async with workers(silent, tmp_path) as crew, pipeline_runtime(env, db) as runtime:
                for _ in range(3):
                    await crew.start()
                await run_pass(runtime, SystemClock(), "s")
                await wait_for(lambda: _written(db, 30), within=60, what="the first articles")
                proxy.blackhole()
                await asyncio.sleep(60)
                await proxy.restore()

                async def passes_until_done() -> bool:
                    await run_pass(runtime, SystemClock(), "s")
                    return await _all_written(db, 300)

                await wait_for(passes_until_done, within=180, what="300 articles", poll=1.0)
                broker = broker_of(runtime)
                dead = {stage: await broker.ready(stage, dlq=True) for stage in STAGES}
                codes = await crew.stop_all()
        assert codes == [0, 0, 0], [crew.tail(i) for i, c in enumerate(codes) if c]
        assert await _articles(db) == sorted(farm.article_urls())
        assert set(model.reviews) == farm.article_urls()
        await _one_review_each(db)
        assert dead == dict.fromkeys(STAGES, 0)
        messages = [e for i in range(3) for e in crew.events(i) if e.get("event") == "news.message"]
        spent = [e for e in messages if e.get("outcome") in ("dead_lettered", "failed", "retrying")]
        assert spent == [], spent[:5]
        assert max(int(str(e.get("delivery", 1))) for e in messages) == 1
    finally:
        await proxy.restore()
        await proxy.cut()


@pytest.mark.slow
async def test_a_worker_killed_mid_review_loses_nothing_and_no_article_is_reviewed_twice(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    with ModelStandIn(delay=1.0) as model, FeedFarm(feeds=4, items=5) as farm:
        env = pipeline_env(
            fresh_db_url,
            prefix,
            model,
            tmp_path / "store",
            UPSTASH_REDIS_AI_REVIEW_LOCK_TTL_SECONDS="5",
            NEWS_STAGE_LEASE_SECONDS="5",
        )
        await add_farm_sources(db, farm)
        async with workers(env, tmp_path) as crew, pipeline_runtime(env, db) as runtime:
            victim = await crew.start()
            await run_pass(runtime, SystemClock(), "s")
            await wait_for(lambda: _asked(model, 2), within=60, what="the victim mid-review")
            victim.kill()  # SIGKILL: its held messages go back to the queue, its leases stay
            await victim.wait()
            in_flight = {url for url, n in model.reviews.items() if n > model.answered[url]}
            asked_before = Counter(model.reviews)
            await crew.start()

            async def passes_until_done() -> bool:
                # a pass releases what the survivor had to hold (the victim's review leases
                # were still live when their messages came back)
                await run_pass(runtime, SystemClock(), "s")
                return await _all_written(db, 20)

            await wait_for(passes_until_done, within=120, what="20 articles", poll=1.0)
            codes = await crew.stop_all()
        assert codes[1] == 0, crew.tail(1)
        assert await _articles(db) == sorted(farm.article_urls())
        await _one_review_each(db)
        assert 1 <= len(in_flight) <= 4  # what the victim was asking the model when killed
        twice = {url for url, n in model.reviews.items() if n > 1}
        # only an article whose review the kill cut short was asked again — after its lease
        # ran out — and every article got exactly one answer that counted
        assert twice <= in_flight
        assert all(model.reviews[u] == asked_before[u] + 1 for u in twice)
        assert all(n == 1 for u, n in model.reviews.items() if u not in in_flight)


def _asked(model: ModelStandIn, n: int) -> Awaitable[bool]:
    async def check() -> bool:
        return sum(model.reviews.values()) >= n

    return check()


async def test_workers_reconnect_after_the_broker_connection_is_cut_and_nothing_is_repeated(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    broker_host, broker_port = host_port(AMQP_URL)
    proxy = TcpProxy(broker_port, broker_host)
    await proxy.start()
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path / "store")
    through_proxy = {**env, "QUEUE_URL": with_port(AMQP_URL, proxy.port)}
    model.delay = 0.05
    with FeedFarm(feeds=20, items=5) as farm:
        await add_farm_sources(db, farm)
        async with workers(through_proxy, tmp_path) as crew, pipeline_runtime(env, db) as rt:
            await crew.start()
            await crew.start()
            await run_pass(rt, SystemClock(), "s")
            await wait_for(lambda: _written(db, 15), within=60, what="the first articles")

            def losses(i: int) -> int:
                return sum(e.get("event") == "news.broker_connection_lost" for e in crew.events(i))

            before = [losses(i) for i in range(2)]
            await proxy.cut()  # every broker connection reset, new ones refused

            async def both_lost_the_broker() -> bool:
                return all(losses(i) > before[i] for i in range(2))

            await wait_for(both_lost_the_broker, within=30, what="both workers to lose the broker")
            await proxy.restore()
            await wait_for(lambda: _all_written(db, 100), within=120, what="100 articles")
            codes = await crew.stop_all()
            await proxy.cut()
        assert codes == [0, 0], [crew.tail(i) for i, c in enumerate(codes) if c]
        assert await _articles(db) == sorted(farm.article_urls())
        assert max(model.reviews.values()) == 1  # no review ran twice
        await _one_review_each(db)


async def _written(db: Database, n: int) -> bool:
    return await count(db, "SELECT count(*) FROM news.articles") >= n


async def test_a_crash_between_the_candidates_commit_and_their_publish_is_relayed(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path / "store")
    with FeedFarm(feeds=1, items=8) as farm:
        await add_farm_sources(db, farm)
        await db.execute("UPDATE news.sources SET fetch_queued_at = now()")
        source = await count(db, "SELECT id FROM news.sources")
        crash = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "tests.faults._fetch_then_crash", json.dumps(env), str(source)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(crash.communicate(), 60)
        assert crash.returncode == 137, out.decode()
        assert b"crashing before publishing 8 message(s)" in out
        # committed: the candidates, queued, with their messages owed in the outbox
        assert await count(db, "SELECT count(*) FROM news.candidates WHERE state = 'queued'") == 8
        assert await count(db, "SELECT count(*) FROM news.outbox WHERE stage = 'enrich'") == 8
        async with pipeline_runtime(env, db) as runtime:
            from nightcrew.news.engines.pipeline.message_outbox import broker_of

            assert await broker_of(runtime).ready("enrich") == 0  # the broker has none of them
            async with worker_running(runtime):  # its housekeeping relays the outbox
                await wait_for(lambda: _all_written(db, 8), within=60, what="8 articles")
        assert await _articles(db) == sorted(farm.article_urls())
        assert max(model.reviews.values()) == 1
        assert await count(db, "SELECT count(*) FROM news.outbox") == 0


async def test_a_database_cut_mid_review_is_waited_out_without_a_second_model_call(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    from urllib.parse import urlsplit

    from tests.faults.test_database_faults import FAST, _via

    port = urlsplit(fresh_db_url).port
    if port is None:
        pytest.skip("the fault tests need PostgreSQL on 127.0.0.1:PORT (DATABASE_URL)")
    proxy = TcpProxy(port)
    await proxy.start()
    pdb = await Database.open(_via(fresh_db_url, proxy.port), policy=FAST)
    try:
        with ModelStandIn(delay=1.5) as model, FeedFarm(feeds=1, items=4) as farm:
            env = pipeline_env(fresh_db_url, prefix, model, tmp_path / "store")
            await add_farm_sources(db, farm)
            async with pipeline_runtime(env, pdb) as runtime, worker_running(runtime) as summary:
                await run_pass(runtime, SystemClock(), "s")
                await wait_for(lambda: _asked(model, 4), within=30, what="4 reviews under way")
                await proxy.cut()  # PostgreSQL gone while the model thinks

                async def answered() -> bool:  # every answer is in; nowhere to save it
                    return sum(model.answered.values()) >= 4 and model.in_flight == 0

                await wait_for(answered, within=30, what="the 4 answers")
                assert await count(db, "SELECT count(*) FROM news.articles") == 0
                await proxy.restore()
                await wait_for(lambda: _all_written(db, 4), within=60, what="4 articles")
        assert await _articles(db) == sorted(farm.article_urls())
        assert dict(model.reviews) == {url: 1 for url in farm.article_urls()}
        assert summary.failed == {} and summary.dead_lettered == {}
        await _one_review_each(db)
    finally:
        await proxy.restore()
        await pdb.close()
        await proxy.cut()
