"""`nightcrew news run` stopped by SIGTERM while its model calls are in flight: the calls are
cancelled (structured: the batch's TaskGroup), the review locks released, nothing written, exit
143 with one line — and the next run reviews and writes every article."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.test_cli import _env, _nightcrew, run
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = pytest.mark.acceptance


def test_sigterm_cancels_a_runs_model_calls_and_releases_its_locks(
    fresh_db_url: str, tmp_path: Path
) -> None:
    with FeedFarm(feeds=1, items=12, thumbnails=True) as farm, ModelStandIn(delay=3.0) as model:
        env = _env(
            DATABASE_URL=fresh_db_url,
            NEWS_ALLOWED_PRIVATE_HOSTS="127.0.0.1",
            NEWS_AI_BASE_URL=model.base_url,
            NEWS_AI_MODEL="stand-in",
            NEWS_AI_CONCURRENCY="4",
            STORAGE_URL=f"file://{tmp_path}",
        )
        feed = farm.feed_urls()[0]
        added = run("news", "sources", "add", feed, "--name", "F", "--shard", "s", env=env)
        assert added.returncode == 0, added.stderr
        running = subprocess.Popen(
            [_nightcrew(), "news", "run", "--shard", "s", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while sum(model.reviews.values()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
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
        again = run("news", "run", "--shard", "s", "--json", env=env)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["processedCount"] == 12
