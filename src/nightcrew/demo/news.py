"""The demo's news worker: two sample feeds on a loopback server, two runs, told in words."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from nightcrew.clock import Clock
from nightcrew.db.database import Database
from nightcrew.demo.seed import DAY
from nightcrew.runtime import Runtime


@dataclass(frozen=True, kw_only=True, slots=True)
class _Rejected:
    title: str
    reasons: list[str]


async def repoint_sample_feeds(db: Database, base: str) -> None:
    """``serve --demo``: the demo's sample sources at the feeds served again, on ``base`` (the
    run that added them served them on a port of its own, gone with it), and due at once, so
    the page's "Run now" of the demo's shard fetches them (the demo checked them minutes ago)."""
    await db.execute(
        "UPDATE news.sources SET feed_url = %(base)s || substring(feed_url from '/[^/]*$'),"
        " next_check_at = NULL"
        " WHERE shard = 'demo' AND feed_url LIKE 'http://127.0.0.1:%%'",
        {"base": base},
    )


async def tell_news(runtime: Runtime, clock: Clock, now: datetime) -> list[str]:
    """Two sample feeds on a loopback server, two news runs: the second finds nothing new."""
    from nightcrew.demo.feeds import serve_sample_feeds
    from nightcrew.news.schedule import run_shard_now
    from nightcrew.news.sources.registry import PARK_AFTER_FAILURES, add_source

    with serve_sample_feeds() as base:
        for path, name in (("/city.xml", "City desk"), ("/science.xml", "Science desk")):
            await add_source(runtime.db, url=base + path, name=name, shard="demo", now=now)
        # in the run history (lane news:demo), as `news run --manual` records them
        first = await run_shard_now(runtime, clock, "demo", requested_by=None)
        second = await run_shard_now(runtime, clock, "demo", requested_by=None)
    assert first is not None and second is not None  # manual runs always run
    # A feed on an office network that last week's runs refused until it was parked: what the
    # dashboard's News page explains (the setting that allows it) and can enable again.
    wire = await add_source(
        runtime.db, url="http://10.20.0.7/wire.xml", name="Wire (office)", shard="demo", now=now
    )
    await runtime.db.execute(
        "UPDATE news.sources SET parked_at = %(at)s, consecutive_failures = %(n)s,"
        " last_error = '10.20.0.7 is not a public address' WHERE id = %(id)s",
        {"at": now - DAY, "n": PARK_AFTER_FAILURES, "id": wire.id},
    )
    rejected = await runtime.db.fetch_as(
        _Rejected,
        "SELECT a.title, r.reasons FROM news.articles a JOIN news.reviews r"
        " ON r.article_id = a.id WHERE NOT r.accepted ORDER BY a.id",
    )
    lines = [
        "",
        "News worker — two sample feeds on a local server, shard “demo”:",
        f"  • first run: {first.queued_count} new stories queued, "
        f"{first.processed_count} written, {first.accepted_count} accepted, "
        f"{first.rejected_count} rejected by the offline rules:",
    ]
    lines += [f"      - “{r.title}”: {', '.join(r.reasons)}" for r in rejected]
    lines.append("    the public snapshot news/snapshots/demo.json was refreshed.")
    lines.append(
        f"  • second run: {second.queued_count} new stories — everything had been seen; "
        "nothing was reviewed or written twice."
    )
    lines.append(
        "  • “Wire (office)” on 10.20.0.7 is parked: runs refuse private addresses unless "
        "NEWS_ALLOWED_PRIVATE_HOSTS names them (the dashboard's News page says so, and can "
        "enable it again)."
    )
    return lines
