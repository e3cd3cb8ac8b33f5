"""`nightcrew news run` fenced out by a newer holder of its shard: while the run
reviews, another holder draws a newer fence and writes; the run's write is refused, and the
run ends as `superseded` — reported, saved, exit 0 — not as a failure. Nothing of it is
written; what it took waits, held, for the newer holder."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.test_cli import _env, _nightcrew
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = pytest.mark.acceptance


def test_a_run_fenced_out_by_a_newer_holder_ends_superseded_and_exits_0(
    fresh_db_url: str, tmp_path: Path
) -> None:
    with FeedFarm(feeds=1, items=5, thumbnails=True) as farm, ModelStandIn(delay=0.3) as model:
        env = _env(
            DATABASE_URL=fresh_db_url,
            NEWS_ALLOWED_PRIVATE_HOSTS="127.0.0.1",
            NEWS_AI_BASE_URL=model.base_url,
            NEWS_AI_MODEL="stand-in",
            STORAGE_URL=f"file://{tmp_path}",
        )
        feed = farm.feed_urls()[0]
        added = subprocess.run(
            [_nightcrew(), "news", "sources", "add", feed, "--name", "F", "--shard", "s"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert added.returncode == 0, added.stderr
        run = subprocess.Popen(
            [_nightcrew(), "news", "run", "--shard", "s", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while sum(model.reviews.values()) < 1:  # the run holds the shard and reviews
                assert run.poll() is None and time.monotonic() < deadline, run.communicate()
                time.sleep(0.05)
            # a newer holder of the shard (its lease taken over) draws a newer fence and writes
            with psycopg.connect(fresh_db_url, autocommit=True) as conn:
                conn.execute("UPDATE news.shard_fences SET fence = fence + 100 WHERE shard = 's'")
            out, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()

    assert run.returncode == 0, err
    report = json.loads(out)
    assert report["status"] == "superseded" and report["skipped"] is False, report
    assert report["processedCount"] == 0 and report["deferredCount"] == 5
    assert any(r.startswith("superseded:") for r in report["deferredReasons"]), report
    with psycopg.connect(fresh_db_url) as conn:
        articles = conn.execute("SELECT count(*) FROM news.articles").fetchone()
        held = conn.execute("SELECT count(*) FROM news.candidates WHERE state = 'held'").fetchone()
        [(stored,)] = conn.execute("SELECT report FROM news.worker_reports").fetchall()
    assert articles == (0,) and held == (5,)
    assert stored["status"] == "superseded"
    assert "worker.run_superseded" in err
