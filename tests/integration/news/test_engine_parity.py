"""Parity, proven: spec 001's rules, each run through both engines — the inline run and the
RabbitMQ pipeline — so that a rule cannot exist in one engine only. Real PostgreSQL and
RabbitMQ, loopback feeds (``FeedFarm``), and the ``ModelStandIn`` as the model, so every model
call is counted.

Every test is parametrised by the ``engine`` fixture, which exposes one operation, ``await
engine.round(shard)``: the report JSON (spec 001's camelCase fields) of one round of work.

* **inline**: one ``run_shard``; its report.
* **pipeline**: a worker runs throughout, on its default housekeeping (every 5 s it re-sends
  admitted candidates whose backoff is over, and relays the outbox); a round is one pass
  (``run_pass``), then the worker until the stages are idle for the shard. *Idle* means: no
  candidate of the shard ``queued`` (waiting in a stage's queue, owed to it or in a worker's
  hands), no fetch owed for the shard's sources, no outbox row for the shard, and every stage
  queue empty on the broker — seen on two polls in a row. What is left waits for a pass, as the
  inline run's leftovers wait for the next run. The round's report is the pass's — what it
  found and decided — with the counts of what the expensive steps did (``DONE``) taken from
  what the workers noted in the round: before the pass read them (its ``workers``) and after
  (taken at the round's end, ``notes.worker_results``, as the next pass would take them). So
  both engines' rounds are compared by the same names.

Both engines share their settings (``pipeline_env``, the test's ``settings_env``) and the clock
(``ShiftedClock``): rounds are spaced on it like scheduled runs — the feeds' check interval and
a minute apart, so each round finds the shard's feeds due, and backoffs and parked leases of
the previous round (30 s) have run out. The clock moves between rounds only, never during one.
Every report of a round is kept (``engine.rounds``) so totals count each figure once.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline import notes
from nightcrew.news.engines.pipeline.message_outbox import broker_of
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.engines.pipeline.worker import WorkerSummary
from nightcrew.news.report import SPEC_FIELDS, WORK_FIELDS
from nightcrew.news.sources.registry import CHECK_INTERVAL
from nightcrew.news.steps.leases import shard_lock_name
from nightcrew.news.steps.review import review_lock_name
from nightcrew.runtime import Runtime
from nightcrew.setting_parsers import STAGES
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    housekept,
    namespace,
    pipeline_env,
    pipeline_runtime,
    wait_for,
    worker_running,
)
from tests.integration.news.test_report_parity import _add_sources, _Farm
from tests.support.services import needs_rabbitmq
from tests.support.standins import FeedFarm, ModelStandIn

SHARD = "s"
SUMMARY = "A short summary of the story."
ROUND_SPACING = CHECK_INTERVAL + timedelta(minutes=1)
IDLE_WITHIN = 60.0  # seconds for a pipeline round's worker to reach idle
LOCK_TTL = 3600.0  # a review lock held elsewhere: outlives the rounds of its test


# --- the engines --------------------------------------------------------------------------------
class ShiftedClock:
    """The system's time plus an offset that the suite moves between rounds (``advance``)."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, by: timedelta) -> None:
        self.offset += by


@dataclass
class Engine:
    name: str
    runtime: Runtime
    clock: ShiftedClock
    rounds: list[list[dict[str, Any]]] = field(default_factory=list)  # every report, by round

    async def round(self, shard: str) -> dict[str, Any]:
        """One round of ``shard``; its (closing) report's JSON."""
        if self.rounds:
            self.clock.advance(ROUND_SPACING)
        reports = await self._run(shard)
        self.rounds.append(reports)
        return reports[-1]

    async def _run(self, shard: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    @property
    def dead_lettered(self) -> int:
        """Messages the pipeline's worker dead-lettered (inline: none)."""
        return 0

    async def housekept(self) -> None:
        """Until what runs between rounds has run once more (inline: nothing does)."""


class InlineEngine(Engine):
    async def _run(self, shard: str) -> list[dict[str, Any]]:
        return [(await run_shard(self.runtime, self.clock, shard)).to_json()]


# what the expensive steps did: a pass hands them to its workers (their results, by name)
DONE = WORK_FIELDS


class PipelineEngine(Engine):
    summary: WorkerSummary | None = None

    async def _run(self, shard: str) -> list[dict[str, Any]]:
        report = (await run_pass(self.runtime, self.clock, shard)).to_json()
        idle_polls = 0

        async def settled() -> bool:
            nonlocal idle_polls
            idle_polls = idle_polls + 1 if await self._idle(shard) else 0
            return idle_polls >= 2

        await wait_for(settled, IDLE_WITHIN, f"the stages idle for shard {shard}", poll=0.1)
        # what the workers did in this round: noted before the pass read (its ``workers``) and
        # after it, taken here as the next pass would take them (so it starts from none)
        later = (
            await notes.worker_results(
                self.runtime.db, shard=shard, now=self.clock.now(), take=True
            )
        ).to_json()
        view = {**report}
        for name in DONE:
            view[name] = report["workers"][name] + later[name]
        view["translatedCount"] += report["translatedCount"]  # the pass's own backlog
        return [view]

    @property
    def dead_lettered(self) -> int:
        return sum(self.summary.dead_lettered.values()) if self.summary else 0

    async def housekept(self) -> None:
        """Two more housekeeping rounds of the worker: one that started after this call, whole."""
        assert self.summary is not None
        await housekept(self.summary, rounds=2)

    async def _idle(self, shard: str) -> bool:
        owed = await count(
            self.runtime.db,
            "SELECT (SELECT count(*) FROM news.candidates"
            "         WHERE shard = %(s)s AND state = 'queued')"
            "     + (SELECT count(*) FROM news.sources"
            "         WHERE shard = %(s)s AND fetch_queued_at IS NOT NULL)"
            "     + (SELECT count(*) FROM news.outbox WHERE body->>'shard' = %(s)s)",
            {"s": shard},
        )
        if owed:
            return False
        broker = broker_of(self.runtime)
        for stage in STAGES:
            if await broker.ready(stage):
                return False
        return True


@pytest.fixture
def settings_env() -> dict[str, str]:
    """The test's own settings, beside pipeline_env's (``with_settings``)."""
    return {}


def with_settings(**env: str) -> pytest.MarkDecorator:
    """Both engines of the test run with ``env`` added to their settings."""
    return pytest.mark.parametrize(
        "settings_env", [env], ids=[",".join(f"{k}={v}" for k, v in env.items())]
    )


@pytest.fixture(params=["inline", pytest.param("pipeline", marks=needs_rabbitmq)])
async def engine(
    request: pytest.FixtureRequest,
    db: Database,
    fresh_db_url: str,
    model: ModelStandIn,
    settings_env: dict[str, str],
    tmp_path: Path,
) -> AsyncIterator[Engine]:
    clock = ShiftedClock()
    if request.param == "inline":
        env = {
            **pipeline_env(fresh_db_url, "inline-unused", model, tmp_path),
            "NEWS_PIPELINE": "inline",
            **settings_env,
        }
        async with pipeline_runtime(env, db, clock) as runtime:
            yield InlineEngine("inline", runtime, clock)
        return
    async with namespace() as prefix:
        env = {**pipeline_env(fresh_db_url, prefix, model, tmp_path), **settings_env}
        async with pipeline_runtime(env, db, clock) as runtime:
            engine = PipelineEngine("pipeline", runtime, clock)
            async with worker_running(runtime, clock=clock) as summary:
                engine.summary = summary
                yield engine


# --- what the tests look at ---------------------------------------------------------------------
def total(engine: Engine, name: str) -> int:
    """``name`` summed over every report the engine made (each figure is counted once)."""
    return sum(int(r[name]) for reports in engine.rounds for r in reports)


def reasons_of(reports: list[dict[str, Any]]) -> list[str]:
    return [reason for r in reports for reason in r["deferredReasons"]]


async def _written(db: Database, shard: str = SHARD) -> set[str]:
    rows = await db.fetch("SELECT url FROM news.articles WHERE shard = %(s)s", {"s": shard})
    return {r["url"] for r in rows}


async def _waiting(db: Database, shard: str = SHARD) -> dict[str, str]:
    """The shard's candidates (not written yet) and their states."""
    rows = await db.fetch(
        "SELECT url, state FROM news.candidates WHERE shard = %(s)s", {"s": shard}
    )
    return {r["url"]: r["state"] for r in rows}


async def _fill(db: Database, n: int, at: datetime) -> None:
    """``n`` articles of another shard (rejected: never retried for a thumbnail), counted by
    the article limit."""
    await db.execute(
        "INSERT INTO news.articles (url, shard, title, status, fence, created_at)"
        " SELECT 'https://stored.example/' || n, 'elsewhere', 'stored', 'rejected', 1, %(t)s"
        " FROM generate_series(1, %(n)s) AS n",
        {"n": n, "t": at},
    )


async def _untranslated(db: Database) -> int:
    return await count(
        db, "SELECT count(*) FROM news.reviews WHERE accepted AND translation IS NULL"
    )


# --- 1. the cost bound --------------------------------------------------------------------------
@with_settings(MAX_AI_REVIEWS="5")
async def test_max_ai_reviews_bounds_each_round_and_keeps_the_rest(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """20 new articles, MAX_AI_REVIEWS=5: 5 model calls a round; the others kept as candidates
    (not dropped, not dead-lettered); all 20 reviewed, each once, after 4 rounds."""
    with FeedFarm(feeds=4, items=5, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        calls = []
        for n in range(1, 5):
            before = sum(model.reviews.values())
            await engine.round(SHARD)
            calls.append(sum(model.reviews.values()) - before)
            written, waiting = await _written(db), await _waiting(db)
            assert len(written) == 5 * n, (n, len(written))
            assert set(written) | set(waiting) == farm.article_urls()  # nothing dropped
            assert set(waiting.values()) <= {"held", "queued"}, waiting  # nothing dead
            assert len(waiting) == 20 - 5 * n
        assert sum(model.reviews.values()) == 20  # a fifth round finds no one left to review
        await engine.round(SHARD)

    assert calls == [5, 5, 5, 5]
    assert set(model.reviews) == farm.article_urls() and max(model.reviews.values()) == 1
    assert total(engine, "aiReviewedCount") == 20 and total(engine, "processedCount") == 20
    assert any(r.startswith("MAX_AI_REVIEWS 5") for r in reasons_of(engine.rounds[0]))
    assert engine.dead_lettered == 0


# --- 2. the translation backlog -----------------------------------------------------------------
async def test_a_translation_that_fails_once_is_retried_and_counted_once(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """Each summary's first translation fails: the article is written untranslated, and the
    backlog retries it — inline in the same round (its backlog step comes after its writes);
    in the pipeline in the next round (the pass works the backlog after admitting its batch,
    before the workers write it: a difference of when, by design, not of what). Each is
    translated once and translatedCount counts it once, in all."""
    model.summary, model.fail_first_translation = SUMMARY, True
    with FeedFarm(feeds=1, items=3, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        await engine.round(SHARD)
        caught_up = {"inline": 0, "pipeline": 3}[engine.name]
        assert await _untranslated(db) == caught_up
        await engine.round(SHARD)
        assert await _untranslated(db) == 0
        assert sorted(model.translation_requests.values()) == [2, 2, 2]  # failed, then retried
        await engine.round(SHARD)  # nothing left: no request, nothing counted again

    assert model.translations == 3 and sorted(model.translation_requests.values()) == [2, 2, 2]
    assert total(engine, "translatedCount") == 3
    assert await count(db, "SELECT count(*) FROM news.reviews WHERE translated_late") == 3


async def test_a_translation_still_failing_is_retried_by_a_later_round(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """Translations down for a whole round (the review's attempt, and inline the backlog's,
    fail): kept in the backlog, translated by the next round, counted once."""
    model.summary, model.translations_down = SUMMARY, True
    with FeedFarm(feeds=1, items=3, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        await engine.round(SHARD)
        assert await _written(db) == farm.article_urls()
        assert await _untranslated(db) == 3 and model.translations == 0
        # inline: the review's try and the backlog's; the pipeline's pass had no backlog yet
        tries = {"inline": [2, 2, 2], "pipeline": [1, 1, 1]}[engine.name]
        assert sorted(model.translation_requests.values()) == tries
        assert total(engine, "translatedCount") == 0
        model.translations_down = False
        await engine.round(SHARD)
        assert await _untranslated(db) == 0
        assert sum(int(r["translatedCount"]) for r in engine.rounds[1]) == 3
        await engine.round(SHARD)

    assert model.translations == 3
    assert sorted(model.translation_requests.values()) == [t + 1 for t in tries]
    assert total(engine, "translatedCount") == 3


# --- 3. the article limit -----------------------------------------------------------------------
@with_settings(INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT="10")
async def test_the_database_article_limit_admits_nothing_new_and_says_so(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """The article table at its limit: the round holds every new candidate before any
    expensive step (no page fetched, no model call, nothing written) and says why; below the
    limit again, the next round writes them."""
    await _fill(db, 10, engine.clock.now())
    with FeedFarm(feeds=1, items=4) as farm:  # no thumbnails: an admitted one is hydrated
        await add_farm_sources(db, farm, SHARD)
        report = await engine.round(SHARD)
        assert report["deferredReasons"] == [
            "database limit: 10 articles >= INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT 10"
        ]
        assert report["backpressureDbArticleCount"] == 10 and report["deferredCount"] == 4
        assert report["processedCount"] == report["aiReviewedCount"] == 0
        assert model.reviews == Counter() and farm.page_requests == 0
        assert await _waiting(db) == dict.fromkeys(farm.article_urls(), "held")
        assert await _written(db) == set()

        await db.execute("DELETE FROM news.articles WHERE shard = 'elsewhere'")
        await engine.round(SHARD)

    assert await _written(db) == farm.article_urls()
    assert model.reviews == Counter(farm.article_urls())
    assert engine.dead_lettered == 0


# --- 4. the queue limit -------------------------------------------------------------------------
@with_settings(INGESTION_BACKPRESSURE_QUEUE_LIMIT="5")
async def test_a_backlog_over_the_queue_limit_drains_in_bounded_batches_oldest_first(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """12 candidates, INGESTION_BACKPRESSURE_QUEUE_LIMIT=5: at most 5 written a round, in the
    order they were held (the feed's order), each round with a backlog saying so; all 12
    written by the third round."""
    with FeedFarm(feeds=1, items=12, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        listed = [f"{farm.url}/articles/0-{i}" for i in range(11, -1, -1)]  # newest first
        batches: list[set[str]] = []
        processed = []
        done: set[str] = set()
        for _ in range(3):
            report = await engine.round(SHARD)
            written = await _written(db)
            batches.append(written - done)
            done = written
            processed.append(report["processedCount"])

    assert processed == [5, 5, 2]
    assert batches == [set(listed[:5]), set(listed[5:10]), set(listed[10:])]
    backlog = re.compile(r"backlog over the queue limit: processing \d+ of \d+")
    for reports in engine.rounds[:2]:
        assert any(backlog.search(r) for r in reasons_of(reports)), reasons_of(reports)
    assert model.reviews == Counter(farm.article_urls())
    assert await _waiting(db) == {} and engine.dead_lettered == 0


# --- 5. the review lock -------------------------------------------------------------------------
async def test_an_article_whose_review_lock_is_held_elsewhere_waits_for_its_release(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """Another holder has one article's review lock: rounds leave it unreviewed (and count it
    in redisAiReviewLockSkippedCount); once released, the next round reviews it, once."""
    with FeedFarm(feeds=1, items=3, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        locked = f"{farm.url}/articles/0-1"
        leases = engine.runtime.news_adapters().leases
        elsewhere = await leases.acquire(review_lock_name(locked), LOCK_TTL)
        assert elsewhere is not None
        skipped = []
        for _ in range(2):
            report = await engine.round(SHARD)
            skipped.append(report["redisAiReviewLockSkippedCount"])
            assert locked not in model.reviews
            assert await _written(db) == farm.article_urls() - {locked}
            assert await _waiting(db) == {locked: "held"}
        await leases.release(elsewhere)
        report = await engine.round(SHARD)
        skipped.append(report["redisAiReviewLockSkippedCount"])

    assert skipped == [1, 1, 0]
    assert await _written(db) == farm.article_urls() and await _waiting(db) == {}
    assert model.reviews == Counter(farm.article_urls())


# --- 6. retries ---------------------------------------------------------------------------------
async def test_a_review_the_model_fails_once_is_retried_in_a_later_round(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """The model answers 500 to one article's first review: the others are written, it is
    kept, a later round reviews it again — accepted, exactly once — and it is never
    dead-lettered; the failed call is no verdict (aiReviewedCount counts 3)."""
    with FeedFarm(feeds=1, items=3, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        flaky = f"{farm.url}/articles/0-1"
        model.fail_once.add(flaky)
        await engine.round(SHARD)
        assert model.reviews[flaky] == 1 and model.answered[flaky] == 0
        assert await _written(db) == farm.article_urls() - {flaky}
        assert await _waiting(db) == {flaky: "held"}
        await engine.round(SHARD)
        assert await _written(db) == farm.article_urls()
        await engine.round(SHARD)  # nothing more to do

    assert model.reviews[flaky] == 2 and model.answered[flaky] == 1
    assert model.answered == Counter(farm.article_urls())
    reviews = await db.fetch(
        "SELECT r.accepted FROM news.reviews r JOIN news.articles a ON a.id = r.article_id"
        " WHERE a.url = %(u)s",
        {"u": flaky},
    )
    assert [r["accepted"] for r in reviews] == [True]
    status = await db.fetch_one("SELECT status FROM news.articles WHERE url = %(u)s", {"u": flaky})
    assert status is not None and status["status"] == "accepted"
    assert total(engine, "aiReviewedCount") == 3 and total(engine, "acceptedCount") == 3
    assert await _waiting(db) == {} and engine.dead_lettered == 0


# --- 7. the report's fields ---------------------------------------------------------------------
NoneType = type(None)
# spec 001's fields and their JSON types, the same in both engines' reports: a type (or a tuple
# of them), [shape] for a list of it, {type: shape} for a mapping, {"key": shape} for a record
SPEC_TYPES: dict[str, Any] = {
    "shard": str,
    "trigger": str,
    "pipeline": str,
    "status": str,
    "skipped": bool,
    "queuedCount": int,
    "queuedBySource": {str: int},
    "deferredCount": int,
    "deferredReasons": [str],
    "retriedCount": int,
    "processedCount": int,
    "aiReviewedCount": int,
    "acceptedCount": int,
    "rejectedCount": int,
    "backpressureQueueLimit": int,
    "backpressureDbArticleLimit": int,
    "backpressureDbArticleCount": (int, NoneType),
    "backpressureDbArticleCountError": (str, NoneType),
    "lockedCount": int,
    "redisAiReviewLockSkippedCount": int,
    "redisEnabled": bool,
    "translatedCount": int,
    "aiPromptTokens": int,
    "aiCompletionTokens": int,
    "reviewer": str,
    "fetchErrors": [{"source": str, "error": str}],
    "writeErrors": [{"url": str, "error": str}],
    "droppedItems": [{"source": str, "reason": str, "count": int}],
    "durationMs": float,
}


def mismatches(value: Any, shape: Any, where: str) -> list[str]:
    """Where ``value`` is not of ``shape`` (exact types: a bool is no int here)."""
    if isinstance(shape, list):
        if type(value) is not list:
            return [f"{where}: {type(value).__name__}, not a list"]
        return [m for n, v in enumerate(value) for m in mismatches(v, shape[0], f"{where}[{n}]")]
    if isinstance(shape, dict):
        if type(value) is not dict:
            return [f"{where}: {type(value).__name__}, not an object"]
        if all(isinstance(k, type) for k in shape):
            ((keys, values),) = shape.items()
            return [
                m
                for k, v in value.items()
                for m in mismatches(k, keys, f"{where} key") + mismatches(v, values, f"{where}.{k}")
            ]
        if set(value) != set(shape):
            return [f"{where}: keys {sorted(value)}, not {sorted(shape)}"]
        return [m for k, s in shape.items() for m in mismatches(value[k], s, f"{where}.{k}")]
    types = shape if isinstance(shape, tuple) else (shape,)
    if type(value) in types:
        return []
    return [f"{where}: {type(value).__name__}, not {' or '.join(t.__name__ for t in types)}"]


@with_settings(INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT="100")
async def test_every_spec_field_is_in_the_report_with_its_type(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """Two rounds that fill every list and mapping of the report: a dead feed (fetchErrors),
    an item whose link is too long (droppedItems), an article the database refuses
    (writeErrors); then new items over the article limit (deferredReasons, queuedBySource).
    Every report — and the one saved — has every spec 001 field, of the same type in both
    engines (SPEC_TYPES)."""
    assert set(SPEC_TYPES) == set(SPEC_FIELDS)
    await db.execute(
        "ALTER TABLE news.articles ADD CONSTRAINT parity_refused"
        " CHECK (url NOT LIKE '%%/articles/0-1')"
    )
    with _Farm(feeds=1, items=3) as farm:
        await _add_sources(db, farm, SHARD)
        await engine.round(SHARD)
        farm.grow(2)
        await _fill(db, 100, engine.clock.now())
        await engine.round(SHARD)

    reports = [r for rounds in engine.rounds for r in rounds]
    for n, report in enumerate(reports):
        assert set(SPEC_FIELDS) <= set(report), set(SPEC_FIELDS) - set(report)
        assert [m for k, s in SPEC_TYPES.items() for m in mismatches(report[k], s, k)] == [], n
    for name in ("queuedBySource", "deferredReasons", "fetchErrors", "writeErrors", "droppedItems"):
        assert any(r[name] for r in reports), f"{name} never filled"
    saved = await db.fetch_one(
        "SELECT report FROM news.worker_reports WHERE shard = %(s)s ORDER BY id DESC LIMIT 1",
        {"s": SHARD},
    )
    assert saved is not None and saved["report"] == reports[-1]


# --- 8. the shard lock, its lease, the queue count, the no-thumbnail retry, the snapshot --------
async def test_a_round_that_finds_the_shard_lock_held_does_nothing_and_says_so(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """Spec 001's shard lock, in both engines: another holder has it, so the round is skipped
    (lockedCount 1, the lock named) — no feed is fetched, nothing is admitted or written — and
    once it is released the next round does the work."""
    with FeedFarm(feeds=2, items=2, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        leases = engine.runtime.news_adapters().leases
        elsewhere = await leases.acquire(shard_lock_name(SHARD), LOCK_TTL)
        assert elsewhere is not None
        locked = await engine.round(SHARD)
        assert farm.feed_requests == 0 and model.reviews == Counter()
        await leases.release(elsewhere)
        done = await engine.round(SHARD)

    assert (locked["status"], locked["skipped"], locked["lockedCount"]) == ("skipped", True, 1)
    assert locked["deferredReasons"] == ["another run holds this shard's lock"]
    assert locked["queuedCount"] == locked["processedCount"] == 0
    assert (done["status"], done["lockedCount"], done["processedCount"]) == ("completed", 0, 4)
    assert await _written(db) == farm.article_urls()


class _SlowFarm(FeedFarm):
    """A FeedFarm whose feeds answer after ``delay`` seconds."""

    delay = 0.0

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path.startswith("/feeds/"):
            time.sleep(self.delay)
        return super().respond(method, path, body)


async def test_a_shard_lease_lost_before_the_expensive_steps_stops_them(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """The shard lock is extended (holder-only) before the expensive steps: when it ran out
    during the fetch (feeds that take 2 s; here made to run out at once) and another holder
    took it, the extension is refused and nothing expensive runs — no page, no model call,
    nothing written — and the report says why; every candidate waits for a later round."""
    with _SlowFarm(feeds=2, items=3) as farm:
        farm.delay = 2.0
        await add_farm_sources(db, farm, SHARD)
        leases = engine.runtime.news_adapters().leases

        async def thief() -> None:
            await asyncio.sleep(1.0)  # the round is fetching: its lease runs out, another takes it
            await db.execute(
                "UPDATE nightcrew.leases SET expires_at = '-infinity' WHERE name = %(n)s",
                {"n": shard_lock_name(SHARD)},
            )
            taken = await leases.acquire(shard_lock_name(SHARD), LOCK_TTL)
            assert taken is not None, "the round's lease should be free to take"

        stealing = asyncio.create_task(thief())
        report = await engine.round(SHARD)
        await stealing

    assert report["deferredReasons"] == ["the shard lease was lost before the expensive steps"]
    assert report["queuedCount"] == 6 and report["deferredCount"] == 6
    assert report["processedCount"] == 0 and report["status"] == "completed"
    assert model.reviews == Counter() and farm.page_requests == 0
    assert await _written(db) == set() and await _waiting(db) == dict.fromkeys(
        farm.article_urls(), "held"
    )


async def test_accepted_articles_without_a_thumbnail_are_retried_and_counted(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """retriedCount: accepted articles still without a thumbnail and due another try (older
    than NO_THUMBNAIL_RETRY_AGE_SECONDS) — counted, and their pages asked again, in both."""
    with FeedFarm(feeds=1, items=1, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        old = engine.clock.now() - timedelta(days=1)
        await db.execute(
            "INSERT INTO news.articles (url, shard, title, status, fence, created_at)"
            " SELECT %(u)s || n, %(s)s, 'old', 'accepted', 1, %(t)s"
            " FROM generate_series(1, 3) AS n",
            {"u": f"{farm.url}/articles/old-", "s": SHARD, "t": old},
        )
        report = await engine.round(SHARD)
        images = await count(
            db,
            "SELECT count(*) FROM news.articles"
            " WHERE url LIKE '%%/old-%%' AND image_url IS NOT NULL",
        )
        again = await engine.round(SHARD)

    assert report["retriedCount"] == 3 and farm.page_requests == 3 and images == 3
    assert again["retriedCount"] == 0  # found: none is due again


@with_settings(INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT="10")
async def test_the_article_limit_defers_the_snapshot_refresh_too(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """Spec 001 defers the public snapshot's refresh with the other expensive steps: a shard
    whose snapshot is stale is not published while the article table is at its limit (the
    pipeline's worker runs its housekeeping meanwhile), and is once below it."""
    store = engine.runtime.store
    key = f"news/snapshots/{SHARD}.json"
    with FeedFarm(feeds=1, items=2, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        await db.execute(
            "INSERT INTO news.snapshots (shard, stale_since) VALUES (%(s)s, now())", {"s": SHARD}
        )
        await _fill(db, 10, engine.clock.now())
        await engine.round(SHARD)
        await engine.housekept()  # a refresh was due: the worker's housekeeping refreshes
        at_the_limit = await _exists(store, key)
        await db.execute("DELETE FROM news.articles WHERE shard = 'elsewhere'")
        await engine.round(SHARD)
        await wait_for(lambda: _exists(store, key), within=15, what="the snapshot published")

    assert at_the_limit is False
    assert await _written(db) == farm.article_urls()


async def _exists(store: Any, key: str) -> bool:
    return await store.get(key) is not None


@with_settings(INGESTION_BACKPRESSURE_QUEUE_LIMIT="5")
async def test_forty_new_items_over_a_limit_of_five_go_five_a_round(
    engine: Engine, db: Database, model: ModelStandIn
) -> None:
    """40 new items, INGESTION_BACKPRESSURE_QUEUE_LIMIT=5: every round counts the whole queue
    (queuedCount 40, 35, … 5), admits the oldest 5 and says why the rest wait; eight rounds
    write all 40, each once."""
    with FeedFarm(feeds=2, items=20, thumbnails=True) as farm:
        await add_farm_sources(db, farm, SHARD)
        reports = [await engine.round(SHARD) for _ in range(8)]

    assert [r["queuedCount"] for r in reports] == list(range(40, 0, -5))
    assert [r["processedCount"] for r in reports] == [5] * 8
    assert [r["deferredCount"] for r in reports] == list(range(35, -1, -5))
    for report in reports[:-1]:
        assert report["deferredReasons"] == [
            f"backlog over the queue limit: processing 5 of {report['queuedCount']}"
            " (INGESTION_BACKPRESSURE_QUEUE_LIMIT 5)"
        ]
    assert reports[-1]["deferredReasons"] == []
    assert model.reviews == Counter(farm.article_urls()) and await _waiting(db) == {}
