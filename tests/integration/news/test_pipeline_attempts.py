"""A candidate's attempts, counted in PostgreSQL when a stage takes it, in one process
on a real RabbitMQ: a take left unfinished by a dead worker counts, across the candidate being
parked behind that worker's lease and released as a fresh message; spent attempts dead-letter
it with "worker died" and no model is asked; a lease that cannot be renewed stops the work
before the next model call; which failures are tried again, and how far apart; `dlq replay`
counts only what it replayed."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from nightcrew.adapters.broker import Outgoing
from nightcrew.adapters.locks import Lease, Leases
from nightcrew.adapters.reviewer import ReviewError
from nightcrew.clock import SystemClock
from nightcrew.db.database import Database, QueryError
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.news.engines.pipeline import attempts, dlq
from nightcrew.news.engines.pipeline.message_outbox import broker_of
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.steps.review import review_lock_name
from nightcrew.runtime import Runtime
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


async def _at_review(db: Database, n: int) -> bool:
    at_review = "SELECT count(*) FROM news.candidates WHERE stage = 'review' AND state = 'queued'"
    return await count(db, at_review) == n


async def _done(db: Database, written: int) -> bool:
    waiting = await count(db, "SELECT count(*) FROM news.candidates WHERE state <> 'dead'")
    return waiting == 0 and await count(db, "SELECT count(*) FROM news.articles") == written


async def _fetched_to_review(runtime: Runtime, db: Database, n: int) -> None:
    """A pass and the fetch stage alone: ``n`` candidates queued for review, their messages
    waiting in the review queue (the feeds carry thumbnails: no enrich)."""
    async with worker_running(runtime, ["fetch"]):
        await run_pass(runtime, SystemClock(), "s")
        await wait_for(lambda: _at_review(db, n), within=30, what=f"{n} queued for review")


async def test_a_take_left_unfinished_counts_across_parking_and_its_last_is_dead_lettered(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(
        fresh_db_url,
        prefix,
        model,
        tmp_path,
        NEWS_MAX_DELIVERIES="1",
        NEWS_STAGE_LEASE_SECONDS="5",
    )
    with FeedFarm(feeds=1, items=3, thumbnails=True) as farm:
        poison = f"{farm.url}/articles/0-1"
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            await _fetched_to_review(runtime, db, 3)
            # a worker that took the poison's review and died: its lease stays (5 s), its
            # take is counted — the one attempt NEWS_MAX_DELIVERIES=1 allows
            dead = await runtime.news_adapters().leases.acquire(review_lock_name(poison), 5)
            assert dead is not None
            await db.execute(
                "UPDATE news.candidates SET fence = fence + 1, stage_attempts = 1,"
                " stage_taken_at = now() WHERE url = %(u)s",
                {"u": poison},
            )
            async with worker_running(runtime, ["review", "write"]) as summary:
                # its message finds the lease held: parked; released once the lease ran out
                # (by the housekeeping, as a fresh message whose broker count starts again);
                # then the take finds the attempt spent and runs nothing
                await wait_for(lambda: _done(db, 2), within=40, what="2 written, 1 dead")
            letters = await dlq.list_dead(runtime, "review")
        assert [(x.body["url"], x.reason, x.deliveries) for x in letters] == [
            (poison, "delivery_limit", 1)
        ]
        assert letters[0].error == attempts.WORKER_DIED
        assert summary.outcomes["parked"] == 1 and summary.dead_lettered == {"review": 1}
        assert poison not in model.reviews  # no worker ran it again
        assert set(model.reviews) == farm.article_urls() - {poison}
        row = await db.fetch_one(
            "SELECT state, last_error FROM news.candidates WHERE url = %(u)s", {"u": poison}
        )
        assert row == {"state": "dead", "last_error": attempts.WORKER_DIED}


async def test_an_unfinished_take_within_the_limit_is_counted_and_the_article_written(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path, NEWS_MAX_DELIVERIES="3")
    with FeedFarm(feeds=1, items=2, thumbnails=True) as farm:
        died = f"{farm.url}/articles/0-0"
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            await _fetched_to_review(runtime, db, 2)
            await db.execute(  # two takes that never finished, their leases long gone
                "UPDATE news.candidates SET fence = fence + 2, stage_attempts = 2,"
                " stage_taken_at = now() - interval '1 hour' WHERE url = %(u)s",
                {"u": died},
            )
            async with worker_running(runtime, ["review"]):
                await wait_for(lambda: _at_write(db, 2), within=30, what="both reviewed")
            row = await db.fetch_one(
                "SELECT stage, stage_attempts, stage_taken_at FROM news.candidates"
                " WHERE url = %(u)s",
                {"u": died},
            )
        # the third take ran (and finished: the count starts again at its next stage)
        assert row == {"stage": "write", "stage_attempts": 0, "stage_taken_at": None}
        assert dict(model.reviews) == {u: 1 for u in farm.article_urls()}


async def _at_write(db: Database, n: int) -> bool:
    return await count(db, "SELECT count(*) FROM news.candidates WHERE stage = 'write'") == n


class _Timed(ModelStandIn):
    """A model that notes when it was asked about each article and when it answered."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.timed: list[tuple[str, float, float]] = []

    def respond(self, method: str, path: str, body: bytes) -> Any:
        started = time.monotonic()
        answer = super().respond(method, path, body)
        url = str(json.loads(json.loads(body)["messages"][-1]["content"])["url"])
        with self.lock:
            self.timed.append((url, started, time.monotonic()))
        return answer


async def test_a_suspect_runs_alone_so_a_poison_takes_no_companion_down_with_it_twice(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    with _Timed(delay=0.4) as model, FeedFarm(feeds=1, items=6, thumbnails=True) as farm:
        env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
        suspects = {f"{farm.url}/articles/0-1", f"{farm.url}/articles/0-4"}
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            await _fetched_to_review(runtime, db, 6)
            await db.execute(  # their previous takes died with their worker (leases gone)
                "UPDATE news.candidates SET fence = fence + 1, stage_attempts = 1,"
                " stage_taken_at = now() - interval '1 hour' WHERE url = ANY(%(u)s)",
                {"u": sorted(suspects)},
            )
            async with worker_running(runtime, ["review"], concurrency=4):
                await wait_for(lambda: _at_write(db, 6), within=30, what="all six reviewed")
        assert sorted(u for u, _, _ in model.timed) == sorted(farm.article_urls())
        for url, start, end in model.timed:
            if url in suspects:  # nothing else was asked while a suspect was
                others = [(u, s, e) for u, s, e in model.timed if u != url]
                assert all(e <= start or s >= end for _, s, e in others), (url, model.timed)
        ordinary = [(s, e) for u, s, e in model.timed if u not in suspects]
        overlapping = any(
            s1 < e2 and s2 < e1 for i, (s1, e1) in enumerate(ordinary) for s2, e2 in ordinary[:i]
        )
        assert overlapping  # the others ran side by side, as usual


class _Summarising(ModelStandIn):
    """A model that gives every verdict a summary, so an accepted article's summary is then
    translated (a second call, with no "URL:" line: counted under "")."""

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        status, ctype, payload = super().respond(method, path, body)
        if status != 200:
            return status, ctype, payload
        answer = json.loads(payload)
        verdict = {"accept": True, "reason": "news", "summary": "Le conseil se réunit."}
        answer["choices"][0]["message"]["content"] = json.dumps(verdict)
        return status, ctype, json.dumps(answer).encode()


class _Unrenewable:
    """Leases granted, but never renewed: as if the backend refused every heartbeat."""

    def __init__(self, inner: Leases) -> None:
        self._inner = inner
        self.backend = inner.backend
        self.refused = 0

    async def acquire(self, name: str, ttl_seconds: float) -> Lease | None:
        return await self._inner.acquire(name, ttl_seconds)

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        return await self._inner.acquire_many(names, ttl_seconds)

    async def release_many(self, leases: list[Lease], *, forget: bool = False) -> None:
        await self._inner.release_many(leases, forget=forget)

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        self.refused += 1
        return False

    async def renew(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        return await self.extend(lease, ttl_seconds)

    async def release(self, lease: Lease, *, forget: bool = False) -> bool:
        return await self._inner.release(lease, forget=forget)


async def test_a_lease_lost_mid_review_keeps_the_verdict_and_asks_the_model_nothing_more(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    with _Summarising(delay=2.5) as model, FeedFarm(feeds=1, items=1, thumbnails=True) as farm:
        env = pipeline_env(fresh_db_url, prefix, model, tmp_path, NEWS_STAGE_LEASE_SECONDS="5")
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            await _fetched_to_review(runtime, db, 1)
            news = runtime.news_adapters()
            unrenewable = _Unrenewable(news.leases)
            lossy = replace(runtime, news=replace(news, leases=unrenewable))
            async with worker_running(lossy, ["review", "write"]):
                await wait_for(lambda: _done(db, 1), within=30, what="the article written")
        assert unrenewable.refused >= 1  # the heartbeat at 1.7 s: refused, during the call
        [url] = farm.article_urls()
        assert model.reviews == {url: 1}  # the verdict paid for was kept; no translation asked
        translated = await db.fetch_one("SELECT translation FROM news.reviews")
        assert translated == {"translation": None}  # left for the translation backlog


def test_which_failures_are_tried_again_and_how_far_apart() -> None:
    transient = [
        QueryError("deadlock detected", sqlstate="40P01"),
        QueryError("could not serialize access", sqlstate="40001"),
        QueryError("too many connections", sqlstate="53300"),
        QueryError("canceling statement due to statement timeout", sqlstate="57014"),
        QueryError("lock not available", sqlstate="55P03"),
        DatabaseUnavailableError("lost PostgreSQL"),
        ReviewError("the model answered 503", transient=True),
        TimeoutError(),
        ConnectionResetError(),
    ]
    permanent = [
        QueryError("refused for the test", sqlstate="P0001"),
        QueryError("column does not exist", sqlstate="42703"),
        QueryError("no code", sqlstate=None),
        ReviewError("the model answered 400", transient=False),
        KeyError("url"),
        ValueError("bad"),
    ]
    assert [attempts.is_transient(e) for e in transient] == [True] * len(transient)
    assert [attempts.is_transient(e) for e in permanent] == [False] * len(permanent)
    base = attempts.BACKOFF_BASE_SECONDS
    for attempt in range(1, 12):
        ceiling = min(base * 2 ** (attempt - 1), attempts.BACKOFF_CAP_SECONDS)
        waits = [attempts.backoff_seconds(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert max(waits) - min(waits) > ceiling / 10  # spread out, not in step


async def test_dlq_replay_counts_only_the_letters_it_replayed(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    gone = {"url": "http://127.0.0.1:9/articles/written-meanwhile", "shard": "s"}
    async with pipeline_runtime(env, db) as runtime:
        broker = broker_of(runtime)
        letter = {"x-last-error": "boom", "x-deliveries": 5, "x-dead-reason": "failed"}
        await broker.publish(
            [
                Outgoing(message_id="gone-1", stage="write", body=gone, headers=letter),
                Outgoing(message_id="junk-1", stage="write", body={"nope": 1}, headers=letter),
            ],
            dead=True,
        )
        done = await dlq.replay(runtime, SystemClock(), message_id="gone-1")
        assert (done.replayed, [x.message_id for x in done.dropped], done.kept) == (
            [],
            ["gone-1"],
            [],
        )
        await broker.publish(
            [Outgoing(message_id="gone-2", stage="write", body=gone, headers=letter)], dead=True
        )
        cli = _run_cli(env, "news", "dlq", "replay", "--all")
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.splitlines() == [
            "replayed 0 dead letters",
            "dropped 1 dead letter whose candidate no longer waits (written or rejected meanwhile)",
            "kept 1 dead letter naming nothing to replay (unreadable): `news dlq purge`"
            " removes them",
        ]
        assert [x.message_id for x in await dlq.list_dead(runtime)] == ["junk-1"]


def _run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_nightcrew(), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class _ReleaseFailsOnce:
    """Leases whose first release of a review lock fails as if the database were gone."""

    def __init__(self, inner: Leases) -> None:
        self._inner = inner
        self.backend = inner.backend
        self.failed = 0

    async def acquire(self, name: str, ttl_seconds: float) -> Lease | None:
        return await self._inner.acquire(name, ttl_seconds)

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        return await self._inner.acquire_many(names, ttl_seconds)

    async def release_many(self, leases: list[Lease], *, forget: bool = False) -> None:
        await self._inner.release_many(leases, forget=forget)

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        return await self._inner.extend(lease, ttl_seconds)

    async def release(self, lease: Lease, *, forget: bool = False) -> bool:
        if lease.name.startswith("news:review:") and not self.failed:
            self.failed += 1
            raise DatabaseUnavailableError("lost PostgreSQL (the test's)")
        return await self._inner.release(lease, forget=forget)


class _OutageBeforeTheModel:
    """A reviewer that first finds the database gone (after the take, before the model)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.outages = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def review(self, article: Any, scope: Any = None) -> Any:
        if not self.outages:
            self.outages += 1
            raise DatabaseUnavailableError("lost PostgreSQL (the test's)")
        return await self._inner.review(article)


async def test_an_outage_between_the_take_and_the_model_spends_no_attempt(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """The database goes away after the review stage took its candidate and before the model is
    asked, and the worker cannot release its lease meanwhile: once it is back, the same message
    resumes its own take — it is not parked behind the worker's own lease, and no "worker
    died" attempt is counted later."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path, NEWS_MAX_DELIVERIES="1")
    with FeedFarm(feeds=1, items=1, thumbnails=True) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            await _fetched_to_review(runtime, db, 1)
            news = runtime.news_adapters()
            leases = _ReleaseFailsOnce(news.leases)
            reviewer = _OutageBeforeTheModel(news.reviewer)
            flaky = replace(runtime, news=replace(news, leases=leases, reviewer=reviewer))
            async with worker_running(flaky, ["review", "write"]) as summary:
                await wait_for(lambda: _done(db, 1), within=60, what="the article written")
    assert (leases.failed, reviewer.outages) == (1, 1)  # both faults happened
    [url] = farm.article_urls()
    assert model.reviews == {url: 1}
    assert summary.outcomes["parked"] == 0 and summary.dead_lettered == {}, summary.to_json()


async def test_a_review_failed_for_now_waits_for_a_pass_even_once_a_copy_parked_it(
    db: Database,
) -> None:
    """The model failed a review for now while a copy of the message (a redelivery) found the
    review lease held and parked the candidate: the failure still sends it back to waiting for
    a pass, its attempt counted — not left admitted, to be re-sent outside the cost bound — and
    a replayed dead letter is admitted, counted in its shard's load."""
    from nightcrew.news.engines.pipeline.stages import SQL as STAGES_SQL
    from nightcrew.news.sources.registry import add_source
    from nightcrew.news.steps.review import REVIEW_FAILED_FOR_NOW

    now = SystemClock().now()
    source = await add_source(db, url="https://feeds.example/a", name="a", shard="s", now=now)
    await db.execute(
        "INSERT INTO news.candidates (url, source_id, shard, title, summary, stage, state,"
        " reason, fence, admitted_at, not_before, created_at, updated_at) VALUES"
        " ('https://x.example/1', %(s)s, 's', 't', 's', 'review', 'held', 'parked', 3,"
        " %(now)s, %(now)s + interval '30 seconds', %(now)s, %(now)s)",
        {"s": source.id, "now": now},
    )
    saved = await db.fetch_one(
        STAGES_SQL["review_later"],
        {"url": "https://x.example/1", "fence": 3, "reason": REVIEW_FAILED_FOR_NOW, "now": now},
    )
    row = await db.fetch_one("SELECT state, admitted_at, attempts, reason FROM news.candidates")
    assert saved is not None and row == {
        "state": "held",
        "admitted_at": None,
        "attempts": 1,
        "reason": REVIEW_FAILED_FOR_NOW,
    }
    await db.execute("UPDATE news.candidates SET state = 'dead'")
    await db.fetch_one(dlq.SQL["requeue_candidate"], {"url": "https://x.example/1", "now": now})
    replayed = await db.fetch_one("SELECT state, admitted_at FROM news.candidates")
    assert replayed == {"state": "queued", "admitted_at": now}
