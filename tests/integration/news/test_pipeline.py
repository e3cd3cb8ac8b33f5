"""The news pipeline on a real RabbitMQ and PostgreSQL, in one process: the pass, the stages,
backpressure owned by the backend, dead letters and replay, the outbox relay, and switching a
shard between the inline run and the pipeline without losing or repeating an article."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nightcrew.adapters.broker import Outgoing, PipelineBroker
from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.errors import QueueError
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline import dlq, message_outbox, metrics
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.steps.leases import shard_lock_name
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


async def _articles(db: Database) -> list[str]:
    return [r["url"] for r in await db.fetch("SELECT url FROM news.articles ORDER BY url")]


async def _candidates(db: Database) -> int:
    return await count(db, "SELECT count(*) FROM news.candidates WHERE state <> 'rejected'")


async def test_a_pass_and_a_worker_write_every_article_once_with_its_review_and_snapshot(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path / "store")
    with FeedFarm(feeds=20, items=5) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            async with worker_running(runtime) as summary:
                report = (await run_pass(runtime, SystemClock(), "s")).to_json()
                assert report["pipeline"] == "rabbitmq" and report["enqueuedSources"] == 20
                assert report["queuedCount"] == 100 and report["admittedCount"] == 100
                await wait_for(
                    lambda: _done(db, 100), within=60, what="100 articles written, none waiting"
                )
            # a second pass enqueues nothing: every source was fetched and is not due yet
            again = (await run_pass(runtime, SystemClock(), "s")).to_json()
            await metrics.collect_metrics(runtime, SystemClock())
            processed = runtime.metrics.value("nightcrew_news_stage_processed_total", stage="write")

        assert await _articles(db) == sorted(farm.article_urls())
        assert set(model.reviews) == farm.article_urls()
        assert max(model.reviews.values()) == 1
        assert await count(db, "SELECT count(*) FROM news.reviews") == 100
        assert summary.processed["write"] == 100 and summary.processed["fetch"] == 20
        assert again["enqueuedSources"] == 0 and again["queuedCount"] == 0
        # the workers' writes, each reported once: by the first pass (those noted before it
        # read, as it ran beside the worker) or by the second
        assert report["workers"]["processedCount"] + again["workers"]["processedCount"] == 100
        assert processed == 100
        assert await count(db, "SELECT count(*) FROM news.outbox") == 0
        # the stages' leases (one per source or article) went with their rows: only the
        # shard's lock is left (its row keeps the shard's fence)
        leases = await db.fetch("SELECT name FROM nightcrew.leases")
        assert [r["name"] for r in leases] == [shard_lock_name("s")]
        snapshot = json.loads((tmp_path / "store" / "news" / "snapshots" / "s.json").read_bytes())
        newest = await db.fetch(
            "SELECT url FROM news.articles WHERE status = 'accepted'"
            " ORDER BY created_at DESC, id DESC LIMIT 50"
        )
        assert [a["url"] for a in snapshot["articles"]] == [r["url"] for r in newest]


async def _done(db: Database, articles: int) -> bool:
    return len(await _articles(db)) >= articles and await _candidates(db) == 0


async def test_with_the_queue_full_a_pass_admits_nothing_and_no_model_is_called(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """Five candidates an earlier pass admitted are still in flight: with the queue limit 5,
    a pass that fetches 12 new items admits none of them (nothing expensive runs) and says
    why; once the five are gone, each pass admits the next five, oldest first."""
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, INGESTION_BACKPRESSURE_QUEUE_LIMIT="5"
    )
    with FeedFarm(feeds=2, items=6, thumbnails=True) as farm:
        await add_farm_sources(db, farm)
        source = await db.fetch_one("SELECT id FROM news.sources ORDER BY id LIMIT 1")
        assert source is not None
        for n in range(5):
            await db.execute(
                "INSERT INTO news.candidates (url, source_id, shard, title, summary, stage,"
                " state, reason, admitted_at, created_at, updated_at) VALUES (%(u)s, %(s)s,"
                " 's', 't', 's', 'review', 'queued', 'backlog', now(), now(), now())",
                {"u": f"http://127.0.0.1:1/backlog-{n}", "s": source["id"]},
            )
        async with pipeline_runtime(env, db) as runtime:
            async with worker_running(runtime, ["fetch"]):
                report = (await run_pass(runtime, SystemClock(), "s")).to_json()
            held = await db.fetch(
                "SELECT stage, reason FROM news.candidates WHERE shard = 's' AND state = 'held'"
            )
            assert len(held) == 12 and {h["stage"] for h in held} == {"enrich"}
            why = (
                "backlog over the queue limit: processing 0 of 12 (5 admitted earlier still in"
                " flight in shard s, INGESTION_BACKPRESSURE_QUEUE_LIMIT 5)"
            )
            assert all(h["reason"] == why for h in held)
            assert report["deferredCount"] == 12 and report["admittedCount"] == 0
            assert report["queuedCount"] == 17 and report["deferredReasons"] == [why]
            assert model.reviews == {} and farm.page_requests == 0  # nothing expensive ran

            await db.execute("DELETE FROM news.candidates WHERE url LIKE '%%/backlog-%%'")
            async with worker_running(runtime) as summary:
                for _ in range(3):  # each pass admits what fits (5), the workers take them
                    await run_pass(runtime, SystemClock(), "s")
                    await wait_for(
                        lambda: _queued(db, 0), within=30, what="the admitted batch worked off"
                    )
        assert len(await _articles(db)) == 12 and await _candidates(db) == 0
        assert max(model.reviews.values()) == 1 and len(model.reviews) == 12
        assert summary.processed["write"] == 12


async def _held(db: Database, shard: str, n: int) -> bool:
    held = await count(
        db,
        "SELECT count(*) FROM news.candidates WHERE shard = %(s)s AND state = 'held'",
        {"s": shard},
    )
    return held >= n


async def _queued(db: Database, n: int) -> bool:
    return await count(db, "SELECT count(*) FROM news.candidates WHERE state = 'queued'") == n


async def test_a_poison_article_is_dead_lettered_then_replayed_once_fixed(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path, NEWS_MAX_DELIVERIES="3")
    with FeedFarm(feeds=1, items=3) as farm:
        poison = f"{farm.url}/articles/0-1"
        # the database refuses this one article for a reason that is not its data (a trigger
        # raising P0001 stands for a bug the team will fix): every write of it fails, and no
        # retry would help — not a deadlock, a timeout or resources short — so it is
        # dead-lettered on its first failure, with the reason (permanent failures go
        # to the DLQ at once; it used to spend all NEWS_MAX_DELIVERIES first)
        await db.execute(
            "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.url = '{poison}' THEN RAISE EXCEPTION 'refused for the test'; END IF;"
            " RETURN NEW; END $$"
        )
        await db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON news.articles"
            " FOR EACH ROW EXECUTE FUNCTION public.refuse()"
        )
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            async with worker_running(runtime) as summary:
                await run_pass(runtime, SystemClock(), "s")
                await wait_for(lambda: _dead(db, 1), within=30, what="the poison dead-lettered")
                await wait_for(lambda: _done_but(db, 2), within=30, what="the others written")
            letters = await dlq.list_dead(runtime)
            assert [(x.stage, x.body["url"], x.deliveries, x.reason) for x in letters] == [
                ("write", poison, 1, "failed")
            ]
            assert "refused for the test" in letters[0].error
            assert summary.failed["write"] == 1 and summary.dead_lettered["write"] == 1
            assert await _articles(db) == sorted(farm.article_urls() - {poison})

            await db.execute("DROP TRIGGER refuse ON news.articles")  # fixed
            done = await dlq.replay(runtime, SystemClock(), message_id=letters[0].message_id)
            assert [x.message_id for x in done.replayed] == [letters[0].message_id]
            assert done.dropped == []
            async with worker_running(runtime):
                await wait_for(lambda: _done(db, 3), within=30, what="the replayed article")
            assert await dlq.list_dead(runtime) == []
        assert await _articles(db) == sorted(farm.article_urls())
        assert model.reviews[poison] == 1  # replayed at its own stage: not reviewed again
        assert await count(db, "SELECT count(*) FROM news.reviews") == 3


async def _dead(db: Database, n: int) -> bool:
    return await count(db, "SELECT count(*) FROM news.candidates WHERE state = 'dead'") == n


async def _done_but(db: Database, n: int) -> bool:
    return len(await _articles(db)) == n and await _queued(db, 0)


async def test_purge_rejects_the_dead_letters_candidates_and_empties_the_queue(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path, NEWS_MAX_DELIVERIES="1")
    async with pipeline_runtime(env, db) as runtime:
        broker = message_outbox.broker_of(runtime)
        # a message no stage can read: dead-lettered on its first (and only) delivery
        await broker.publish([Outgoing(message_id="m-1", stage="enrich", body={"nope": 1})])
        async with worker_running(runtime, ["enrich"]) as summary:
            await wait_for(
                lambda: _letters(broker, 1), within=30, what="the unreadable message's letter"
            )
        assert summary.dead_lettered["enrich"] == 1
        [letter] = await dlq.list_dead(runtime, "enrich")
        assert letter.message_id == "m-1" and "KeyError" in letter.error
        purged = await dlq.purge(runtime, SystemClock(), "enrich")
        assert [x.message_id for x in purged] == ["m-1"]
        assert await dlq.list_dead(runtime) == []


async def _letters(broker: PipelineBroker, n: int) -> bool:
    return sum([await broker.ready(s, dlq=True) for s in ("enrich",)]) == n


class _RefusingBroker(PipelineBroker):
    """The broker refuses every publish while ``down`` (a crash, or an outage, right after the
    database committed what it owes)."""

    down = True

    async def publish(self, messages: Any, *, dead: bool = False) -> None:
        if self.down:
            raise QueueError("the broker is away (test)")
        await super().publish(messages, dead=dead)


async def test_messages_owed_when_the_broker_refused_are_relayed_from_the_outbox(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=3, items=2) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            real = message_outbox.broker_of(runtime)
            refusing = _RefusingBroker(
                real.url, prefix=real.prefix, max_deliveries=real.max_deliveries
            )
            news = runtime.news_adapters()
            from dataclasses import replace

            down = replace(runtime, news=replace(news, pipeline=refusing))
            report = (await run_pass(down, SystemClock(), "s")).to_json()
            assert report["enqueuedSources"] == 3
            assert await count(db, "SELECT count(*) FROM news.outbox WHERE stage = 'fetch'") == 3
            assert await real.ready("fetch") == 0  # nothing reached the broker

            # the relay (here: an old enough outbox, on a worker's housekeeping) sends them
            await db.execute("UPDATE news.outbox SET created_at = created_at - interval '1 min'")
            refusing.down = False
            assert await message_outbox.relay(refusing, db, SystemClock().now()) == 3
            async with worker_running(runtime):
                # fetched by the worker, held for a pass: the next one admits them
                await wait_for(lambda: _held(db, "s", 6), within=30, what="6 candidates held")
                await run_pass(runtime, SystemClock(), "s")
                await wait_for(lambda: _done(db, 6), within=30, what="6 articles written")
            await refusing.close()
        assert await _articles(db) == sorted(farm.article_urls())
        assert max(model.reviews.values()) == 1


async def test_switching_a_shard_inline_to_rabbitmq_and_back_loses_and_repeats_nothing(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    inline_env = {
        **pipeline_env(fresh_db_url, prefix, model, tmp_path),
        "NEWS_PIPELINE": "inline",
        "MAX_AI_REVIEWS": "7",
    }
    rabbit_env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=4, items=5) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(inline_env, db) as runtime:
            first = (await run_shard(runtime, SystemClock(), "s")).to_json()
        assert first["processedCount"] == 7 and first["deferredCount"] == 13

        farm.grow(3)  # the feeds move on while the operator switches
        await db.execute("UPDATE news.sources SET next_check_at = NULL")
        async with pipeline_runtime(rabbit_env, db) as runtime:
            # workers only for fetch, enrich and review: candidates pile up at write, reviewed
            async with worker_running(runtime, ["fetch", "enrich", "review"]):
                passed = (await run_pass(runtime, SystemClock(), "s")).to_json()
                # the inline run's 13 deferred and the 12 the feeds have since
                assert passed["queuedCount"] == 25 and passed["admittedCount"] == 25
                assert passed["enqueuedSources"] == 4
                await wait_for(
                    lambda: _at_write(db, 25), within=60, what="25 reviewed, waiting for write"
                )

        farm.grow(2)
        await db.execute("UPDATE news.sources SET next_check_at = NULL")
        async with pipeline_runtime({**inline_env, "MAX_AI_REVIEWS": "100"}, db) as runtime:
            back = (await run_shard(runtime, SystemClock(), "s")).to_json()
        assert back["processedCount"] == 25 + 8  # the pipeline's reviewed 25 and 8 new
        assert await _articles(db) == sorted(farm.article_urls())
        assert await _candidates(db) == 0
        assert len(model.reviews) == 40 and max(model.reviews.values()) == 1
        assert await count(db, "SELECT count(*) FROM news.reviews") == 40


async def _at_write(db: Database, n: int) -> bool:
    at_write = await count(
        db, "SELECT count(*) FROM news.candidates WHERE stage = 'write' AND state = 'queued'"
    )
    return at_write >= n and await _queued(db, n)
