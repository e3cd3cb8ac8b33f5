"""`nightcrew serve` with a news shard whose feed is too heavy to parse: 50,000 items
without links, under the size cap — parsed on the event loop it held `serve` for 22 to 45 s.
Now `/health` answers within 2 s and the dashboard within 4 s all through the shard's run, the
feed is reported over its parse budget, and its neighbour is written."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from werkzeug import Request, Response

from tests.acceptance.test_cli import _env, _nightcrew, run
from tests.integration.news.test_run import rss
from tests.integration.news.test_untrusted_bytes import linkless_feed
from tests.support.browser import serve_on_a_free_port
from tests.support.servers import RecordingServer

pytestmark = pytest.mark.acceptance

# feedparser reads the 50,000 linkless items in about 1.8 s on an idle 2-core machine: a 3 s
# budget was met once in CI, so the budget sits well under the parse
PARSE_BUDGET = 1


@pytest.mark.slow
def test_serve_stays_responsive_while_a_shard_parses_a_feed_over_its_budget(
    fresh_db_url: str, feed_server: RecordingServer, tmp_path: Path
) -> None:
    base = feed_server.url
    feeds = {"/feeds/good": rss(base, 2, prefix="good"), "/feeds/heavy": linkless_feed(50_000)}
    heavy_served: list[float] = []

    def respond(request: Request) -> Response:
        if request.path in feeds:
            if request.path == "/feeds/heavy":
                heavy_served.append(time.monotonic())
            return Response(feeds[request.path], content_type="application/rss+xml")
        if request.path.startswith("/articles/"):
            return Response(
                '<html><head><meta property="og:image" content="/img/1.jpg"></head></html>',
                content_type="text/html",
            )
        return Response(status=404)

    feed_server.responder = respond
    env = _env(
        DATABASE_URL=fresh_db_url,
        NIGHTCREW_DATA_DIR=str(tmp_path / "data"),
        STORAGE_URL="memory://",
        NEWS_SHARDS="s",
        NEWS_RUN_INTERVAL_MINUTES="1",
        NEWS_ALLOWED_PRIVATE_HOSTS="127.0.0.1",
        NEWS_PARSE_BUDGET_SECONDS=str(PARSE_BUDGET),
    )
    for name in ("good", "heavy"):
        added = run(
            "news", "sources", "add", f"{base}/feeds/{name}", "--name", name.title(),
            "--shard", "s", env=env,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr

    serve, port = serve_on_a_free_port([_nightcrew(), "serve", "--host", "127.0.0.1"], env)
    stderr_lines: list[str] = []
    drain = threading.Thread(target=lambda: stderr_lines.extend(serve.stderr or []), daemon=True)
    drain.start()
    url = f"http://127.0.0.1:{port}"
    health: list[tuple[float, float]] = []  # (when, how long /health took)
    pages: list[float] = []
    report: dict[str, Any] | None = None
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            deadline = time.monotonic() + 30
            while True:  # up
                try:
                    client.get("/health", timeout=1)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline and serve.poll() is None, stderr_lines
                    time.sleep(0.1)
            # the shard runs at the next minute: sample until its report is saved
            deadline = time.monotonic() + 150
            last_page = 0.0
            while report is None and time.monotonic() < deadline:
                started = time.monotonic()
                answer = client.get("/health")
                health.append((started, time.monotonic() - started))
                assert answer.status_code == 200
                if started - last_page >= 1.0:
                    last_page = time.monotonic()
                    page = client.get("/")
                    pages.append(time.monotonic() - last_page)
                    assert page.status_code == 200
                    assert client.get("/news/reports").status_code == 200
                    report = _first_completed_report(fresh_db_url)
                time.sleep(0.2)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    assert report is not None, "the shard never reported:\n" + "".join(stderr_lines[-20:])
    assert report["fetchErrors"] == [
        {"source": "Heavy", "error": f"parsing took longer than the {PARSE_BUDGET} s parse budget"}
    ]
    assert report["processedCount"] == 2
    # sampled all through the heavy parse, and never slow
    assert heavy_served, "the heavy feed was never fetched"
    during = [took for when, took in health if when >= heavy_served[0]]
    assert len(during) >= 3, during
    assert max(took for _, took in health) < 2.0, max(health, key=lambda h: h[1])
    assert max(pages) < 4.0, max(pages)
    assert serve.returncode == 0, "".join(stderr_lines[-20:])


def _first_completed_report(db_url: str) -> dict[str, Any] | None:
    """The shard's first completed run's report. Not the newest of /news/reports: serve runs an
    owed slot at start and the minute's slot right after, and on a busy machine the second
    finds the shard locked and saves its skipped report first."""
    import psycopg

    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT report FROM news.worker_reports WHERE shard = 's'"
            " AND report->>'status' = 'completed' ORDER BY started_at, id LIMIT 1"
        ).fetchone()
    return None if row is None else dict(row[0])
