"""Fetching feeds from real HTTP servers on loopback: RSS, Atom, malformed, 304, 429, huge,
a redirect loop — and the source bookkeeping that follows (ETag kept, failures parked)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from werkzeug import Request, Response

from nightcrew.adapters.addresses import UntrustedHttp
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.sources.registry import (
    PARK_AFTER_FAILURES,
    SourceError,
    add_source,
    list_sources,
    record_fetch,
    set_enabled,
)
from nightcrew.news.steps.entries import normalize_url
from nightcrew.news.steps.fetch import FeedRules, fetch_feed, retry_after_seconds
from tests.conftest import NOW, parsers_for_test
from tests.integration.news.conftest import LOOPBACK
from tests.support.servers import RecordingServer

RSS = b"""<?xml version="1.0"?><rss version="2.0"><channel><title>Daily</title>
<item><title>First story</title><link>https://news.example/a?utm_source=x&amp;id=1#top</link>
<description>Something happened.</description><pubDate>Sun, 29 Nov 2026 03:00:00 GMT</pubDate>
</item>
<item><title>Second</title><link>https://news.example/b</link></item>
<item><title>Second again</title><link>https://NEWS.example:443/b</link></item>
</channel></rss>"""

ATOM = b"""<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom">
<title>Atom</title><entry><title>Atom story</title><link href="https://atom.example/x"/>
<id>urn:x</id><updated>2026-11-28T10:00:00Z</updated><summary>S</summary></entry></feed>"""


def rules() -> FeedRules:
    """The loopback policy's rules, parsing in the test's own parser pool."""
    return FeedRules(policy=LOOPBACK, parsers=parsers_for_test())


def serve(server: RecordingServer, routes: dict[str, Any]) -> None:
    def respond(request: Request) -> Response:
        route = routes[request.path]
        return route if isinstance(route, Response) else route(request)

    server.responder = respond


async def test_rss_and_atom_become_normalised_items(
    feed_server: RecordingServer, http: UntrustedHttp
) -> None:
    serve(
        feed_server,
        {
            "/rss": Response(RSS, headers={"ETag": '"v1"', "Last-Modified": "Sat, 28 Nov 2026"}),
            "/atom": Response(ATOM),
        },
    )
    rss = await fetch_feed(http, feed_server.url + "/rss", NOW, rules())
    assert rss.outcome == "ok" and rss.etag == '"v1"'
    assert [i.url for i in rss.items] == ["https://news.example/a?id=1", "https://news.example/b"]
    assert rss.items[0].title == "First story"
    assert rss.items[0].published == datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    atom = await fetch_feed(http, feed_server.url + "/atom", NOW, rules())
    assert [i.url for i in atom.items] == ["https://atom.example/x"]


async def test_conditional_get_yields_not_modified(
    feed_server: RecordingServer, http: UntrustedHttp
) -> None:
    seen: list[dict[str, str]] = []

    def conditional(request: Request) -> Response:
        seen.append(dict(request.headers))
        if request.headers.get("If-None-Match") == '"v1"':
            return Response(status=304)
        return Response(RSS, headers={"ETag": '"v1"'})

    serve(feed_server, {"/rss": conditional})
    first = await fetch_feed(http, feed_server.url + "/rss", NOW, rules())
    second = await fetch_feed(http, feed_server.url + "/rss", NOW, rules(), etag=first.etag)
    assert second.outcome == "not_modified" and second.items == []
    assert seen[1]["If-None-Match"] == '"v1"'


@pytest.mark.parametrize(
    ("route", "error"),
    [
        ("/malformed", "not a readable RSS/Atom feed"),
        ("/huge", "larger than"),
        ("/loop", "redirects"),
        ("/gone", "answered 404"),
    ],
)
async def test_hostile_feeds_are_failures_with_a_reason(
    feed_server: RecordingServer, http: UntrustedHttp, route: str, error: str
) -> None:
    serve(
        feed_server,
        {
            "/malformed": Response(b"<html><body>not a feed <<<"),
            "/huge": Response(b"<rss>" + b"x" * 70_000 + b"</rss>"),
            "/loop": Response(status=302, headers={"Location": "/loop"}),
            "/gone": Response(status=404),
        },
    )
    result = await fetch_feed(
        http, feed_server.url + route, NOW, replace(rules(), max_bytes=64_000)
    )
    assert result.outcome == "failed" and error in (result.error or ""), result


async def test_429_honours_retry_after(feed_server: RecordingServer, http: UntrustedHttp) -> None:
    serve(feed_server, {"/busy": Response(status=429, headers={"Retry-After": "120"})})
    result = await fetch_feed(http, feed_server.url + "/busy", NOW, rules())
    assert result.outcome == "retry_later" and result.retry_after_seconds == 120


def test_retry_after_forms() -> None:
    assert retry_after_seconds("30", NOW) == 30
    assert retry_after_seconds("Sun, 29 Nov 2026 04:10:00 GMT", NOW) == 600
    assert retry_after_seconds("soon", NOW) == 300
    assert retry_after_seconds("999999", NOW) == 86400


def test_normalize_url() -> None:
    assert (
        normalize_url("HTTPS://Example.COM:443/a?b=2&a=1&utm_medium=x#frag")
        == "https://example.com/a?a=1&b=2"
    )
    assert normalize_url("http://example.com") == "http://example.com/"


async def test_sources_keep_the_etag_and_park_after_repeated_failures(
    db: Database, clock: FrozenClock
) -> None:
    from nightcrew.news.steps.fetch import FetchResult

    source = await add_source(
        db, url="https://feeds.example/rss", name="Example", shard="s1", now=NOW
    )
    with pytest.raises(SourceError, match="already exists"):
        await add_source(db, url="https://feeds.example/rss", name="Again", shard="s1", now=NOW)
    with pytest.raises(SourceError, match="not an http"):
        await add_source(db, url="file:///etc/passwd", name="Bad", shard="s1", now=NOW)

    await record_fetch(db, source, FetchResult(outcome="ok", etag='"e"'), NOW)
    [listed] = await list_sources(db, shard="s1")
    assert listed.consecutive_failures == 0 and listed.next_check_at == NOW + timedelta(minutes=15)
    for n in range(PARK_AFTER_FAILURES):
        await record_fetch(
            db,
            replace(source, feed_url="https://feeds.example/rss"),
            FetchResult(outcome="failed", error="the feed answered 500"),
            NOW + timedelta(hours=n),
        )
    [listed] = await list_sources(db)
    assert listed.consecutive_failures == PARK_AFTER_FAILURES
    assert listed.parked_at == NOW + timedelta(hours=PARK_AFTER_FAILURES - 1)
    await set_enabled(db, str(source.id), enabled=True)
    [listed] = await list_sources(db)
    assert listed.parked_at is None and listed.consecutive_failures == 0
    with pytest.raises(SourceError, match="no source"):
        await set_enabled(db, "999999", enabled=False)


RELATIVE = b"""<?xml version="1.0"?><rss version="2.0"><channel><title>Rel</title>
<item><title>Relative</title><link>story.html</link></item>
<item><title>Rooted</title><link>/top.html</link></item>
</channel></rss>"""


async def test_relative_links_resolve_against_the_content_location(
    feed_server: RecordingServer, http: UntrustedHttp
) -> None:
    """The feed says where it really lives (Content-Location, relative to its URL): its
    relative links are that address's, not the address it was fetched from."""
    serve(
        feed_server,
        {
            "/feeds/moved": Response(RELATIVE, headers={"Content-Location": "/archive/2026/"}),
            "/feeds/plain": Response(RELATIVE),
        },
    )
    base = feed_server.url
    moved = await fetch_feed(http, base + "/feeds/moved", NOW, rules())
    assert [i.url for i in moved.items] == [f"{base}/archive/2026/story.html", f"{base}/top.html"]
    plain = await fetch_feed(http, base + "/feeds/plain", NOW, rules())
    assert [i.url for i in plain.items] == [f"{base}/feeds/story.html", f"{base}/top.html"]


async def test_an_unchanged_body_without_validators_is_not_parsed_again(
    feed_server: RecordingServer, http: UntrustedHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that sends neither ETag nor Last-Modified: the body's SHA-256, kept from the
    last fetch, says nothing changed — no parse, no items; a changed body is parsed."""
    import nightcrew.news.steps.fetch as fetch_module

    body = {"now": RSS}
    serve(feed_server, {"/rss": lambda _request: Response(body["now"])})
    parses: list[bytes] = []
    real_read = fetch_module._read_feed  # parsing, in place or in a worker process

    async def counting_read(data: bytes, base_url: str, rules: FeedRules, *rest: Any) -> Any:
        parses.append(data)
        return await real_read(data, base_url, rules, *rest)

    monkeypatch.setattr(fetch_module, "_read_feed", counting_read)
    url = feed_server.url + "/rss"

    first = await fetch_feed(http, url, NOW, rules())
    assert first.outcome == "ok" and first.etag is None and first.last_modified is None
    assert first.body_hash is not None and len(parses) == 1
    same = await fetch_feed(http, url, NOW, rules(), body_hash=first.body_hash)
    assert same.outcome == "not_modified" and same.items == [] and len(parses) == 1
    assert same.body_hash == first.body_hash

    body["now"] = ATOM
    changed = await fetch_feed(http, url, NOW, rules(), body_hash=first.body_hash)
    assert changed.outcome == "ok" and len(parses) == 2
    assert [i.url for i in changed.items] == ["https://atom.example/x"]
    assert changed.body_hash not in (None, first.body_hash)
