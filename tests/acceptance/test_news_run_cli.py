"""`nightcrew news run --shard S`, inline, as an operator types it, against hostile feeds on
loopback beside a good one: the command exits 0, the good feed's articles are written, each bad
feed is its own source's error, and the run's report is saved."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.test_cli import _env, run
from tests.integration.news.test_run import rss, site
from tests.support.servers import RecordingServer

pytestmark = pytest.mark.acceptance


def _feed(items: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>H</title>'
        f"{items}</channel></rss>"
    ).encode()


def _item(base: str, name: str, *, title: str = "a title", extra: str = "") -> str:
    return (
        f"<item><title>{title}</title><link>{base}/articles/{name}</link>"
        f"<description>A long enough description of {name}.</description>{extra}</item>"
    )


def test_news_run_exits_0_beside_hostile_feeds_and_saves_its_report(
    fresh_db_url: str, feed_server: RecordingServer, tmp_path: Path
) -> None:
    base = feed_server.url
    feeds = {
        "/feeds/good": rss(base, 2, prefix="good"),
        "/feeds/surrogate": _feed(_item(base, "surrogate", title="a&#xD800;b")),
        "/feeds/nul": _feed(_item(base, "nul", title="raw\x00nul")),
        "/feeds/year0": _feed(
            _item(base, "year0", extra="<pubDate>0000-01-01T00:00:00Z</pubDate>")
        ),
        "/feeds/empty": b"",
        "/feeds/html": b"<html><body>not a feed</body></html>",
    }
    site(feed_server, feeds)
    env = _env(
        DATABASE_URL=fresh_db_url,
        # the feeds are on this machine: the one private address this run may fetch
        NEWS_ALLOWED_PRIVATE_HOSTS="127.0.0.1",
        STORAGE_URL=f"file://{tmp_path}",
    )
    for path in feeds:
        name = path.rsplit("/", 1)[1]
        added = run("news", "sources", "add", base + path, "--name", name, "--shard", "s", env=env)
        assert added.returncode == 0, added.stderr

    result = run("news", "run", "--shard", "s", "--json", env=env)

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {e["source"] for e in report["fetchErrors"]} == {"empty", "html"}, report
    with psycopg.connect(fresh_db_url) as conn:
        urls = {r[0] for r in conn.execute("SELECT url FROM news.articles")}
        saved = conn.execute("SELECT shard, report FROM news.worker_reports").fetchall()
    assert {f"{base}/articles/good-0", f"{base}/articles/good-1"} <= urls
    # the hostile items themselves are sanitised and written, each alone
    assert {f"{base}/articles/{n}" for n in ("surrogate", "nul", "year0")} <= urls
    [(shard, stored)] = saved
    assert shard == "s" and stored["processedCount"] == report["processedCount"] == 5
    assert (tmp_path / "news" / "snapshots" / "s.json").exists()
