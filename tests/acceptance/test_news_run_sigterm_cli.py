"""`nightcrew news run` stopped by SIGTERM while its model calls are in flight: the calls are
cancelled (structured: the batch's TaskGroup), the review locks released, nothing written, exit
143 with one line — and the next run reviews and writes every article; the answers that had
arrived before the signal are kept, so the next run does not pay for them again."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.test_cli import _env, _nightcrew, run
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = pytest.mark.acceptance


def test_sigterm_cancels_a_runs_model_calls_and_releases_its_locks(
    fresh_db_url: str, tmp_path: Path
) -> None:
    with FeedFarm(feeds=1, items=12, thumbnails=True) as farm, ModelStandIn(delay=3.0) as model:
        env = _one_feed(fresh_db_url, tmp_path, farm, model)
        running = _news_run(env)
        _wait_for_reviews(model, 4)
        assert sum(model.reviews.values()) == 4, "four calls in flight"
        running.send_signal(signal.SIGTERM)
        out, err = running.communicate(timeout=30)
        assert running.returncode == 143, (out, err)
        assert err.strip().splitlines()[-1] == (
            "nightcrew: terminated (SIGTERM): the work in hand was cancelled"
        )
        time.sleep(0.5)
        assert sum(model.reviews.values()) == 4  # nothing asked after the signal
        with psycopg.connect(fresh_db_url) as conn:
            locks = conn.execute(
                "SELECT count(*) FROM nightcrew.leases WHERE name LIKE 'news:review:%'"
            ).fetchone()
            written = conn.execute("SELECT count(*) FROM news.articles").fetchone()
        assert locks == (0,) and written == (0,)

        model.delay = 0.0
        assert _next_run(env)["processedCount"] == 12


def test_sigterm_keeps_the_answers_that_arrived_so_the_next_run_pays_only_for_the_rest(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """A call cut short is not paid for twice when its answer arrived. The model answers the
    first 6 reviews at once and holds the rest; SIGTERM comes with 4 calls in flight. The 6 paid
    verdicts stay on the held candidates, so the next run writes them without asking again:
    only the 6 unanswered articles are asked twice or for the first time, and every article is
    written."""
    with FeedFarm(feeds=1, items=12, thumbnails=True) as farm, ModelStandIn(delay=0.0) as model:
        model.hold_after = 6
        env = _one_feed(fresh_db_url, tmp_path, farm, model)
        running = _news_run(env)
        _wait_for_reviews(model, 10)
        assert sum(model.reviews.values()) == 10, "6 answered, 4 held in flight"
        answered_first = set(model.answered)
        assert len(answered_first) == 6
        kept, written = _stop_then_look(running, fresh_db_url)
        assert kept == answered_first and written == 0

        model.hold_after = None
        report = _next_run(env)
        assert report["processedCount"] == 12
        assert report["aiReviewedCount"] == 6  # the 6 kept verdicts cost nothing
        assert all(model.reviews[url] == 1 for url in answered_first), model.reviews
        assert sum(model.answered.values()) == 12  # each article's verdict paid for once
        with psycopg.connect(fresh_db_url) as conn:
            assert conn.execute("SELECT count(*) FROM news.articles").fetchone() == (12,)


def test_sigterm_keeps_a_review_whose_translation_was_still_in_flight(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """A review is paid for when its answer arrives, whatever becomes of the translation asked
    for after it. The model answers every review at once and holds every translation; SIGTERM
    comes with 4 translations in flight. All 12 verdicts stay on the held candidates; the next
    run writes the 12 articles asking the model for no review, and its translation backlog
    asks for the 12 translations."""
    with (
        FeedFarm(feeds=1, items=12, thumbnails=True) as farm,
        ModelStandIn(delay=0.0, summary="a summary") as model,
    ):
        model.hold_translations = True
        env = _one_feed(fresh_db_url, tmp_path, farm, model)
        running = _news_run(env)
        deadline = time.monotonic() + 30
        while (sum(model.answered.values()) < 12 or model.in_flight < 4) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert sum(model.answered.values()) == 12 and model.in_flight == 4
        kept, written = _stop_then_look(running, fresh_db_url)
        assert len(kept) == 12 and written == 0
        assert model.translations == 0

        model.hold_translations = False
        report = _next_run(env)
        assert report["processedCount"] == 12
        assert report["aiReviewedCount"] == 0  # the 12 kept verdicts cost nothing
        assert all(n == 1 for n in model.reviews.values()) and len(model.reviews) == 12
        assert model.translations == 12


def _next_run(env: dict[str, str]) -> dict[str, Any]:
    """The next `news run` of the shard, to its end: its report."""
    again = run("news", "run", "--shard", "s", "--json", env=env)
    assert again.returncode == 0, again.stderr
    report: dict[str, Any] = json.loads(again.stdout)
    return report


def _stop_then_look(running: subprocess.Popen[str], db_url: str) -> tuple[set[str], int]:
    """SIGTERM to the run, which ends as stopped (143); then the URLs whose verdicts stayed on
    the held candidates, and how many articles were written."""
    running.send_signal(signal.SIGTERM)
    out, err = running.communicate(timeout=30)
    assert running.returncode == 143, (out, err)
    with psycopg.connect(db_url) as conn:
        kept = conn.execute(
            "SELECT url FROM news.candidates WHERE state = 'held' AND verdict IS NOT NULL"
        ).fetchall()
        written = conn.execute("SELECT count(*) FROM news.articles").fetchone()
    assert written is not None
    return {u for (u,) in kept}, written[0]


def _one_feed(db_url: str, tmp_path: Path, farm: FeedFarm, model: ModelStandIn) -> dict[str, str]:
    """The environment of a news run against the stand-in model (4 calls in flight), with the
    farm's first feed added as shard "s"."""
    env = _env(
        DATABASE_URL=db_url,
        NEWS_ALLOWED_PRIVATE_HOSTS="127.0.0.1",
        NEWS_AI_BASE_URL=model.base_url,
        NEWS_AI_MODEL="stand-in",
        NEWS_AI_CONCURRENCY="4",
        STORAGE_URL=f"file://{tmp_path}",
    )
    feed = farm.feed_urls()[0]
    added = run("news", "sources", "add", feed, "--name", "F", "--shard", "s", env=env)
    assert added.returncode == 0, added.stderr
    return env


def _news_run(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [_nightcrew(), "news", "run", "--shard", "s", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_reviews(model: ModelStandIn, n: int, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while sum(model.reviews.values()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
