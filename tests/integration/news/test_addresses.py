"""The news worker's address policy on every fetch: redirects into the machine,
odd address spellings, DNS rebinding, feed-supplied image URLs, credentials in links.

Every client here connects through ``LoopbackOnlyBackend``: a connection the policy lets
through to a non-loopback address is recorded and refused by the test, never opened.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace

import pytest
from werkzeug import Request, Response

from nightcrew.adapters.addresses import (
    AddressPolicy,
    UnsafeURL,
    UntrustedHttp,
    address_literal,
    is_public,
    new_client,
)
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.sources.registry import add_source
from nightcrew.news.steps.fetch import FeedRules, fetch_feed
from tests.conftest import NOW, parsers_for_test
from tests.integration.news.conftest import LOOPBACK
from tests.integration.news.test_run import article_page, deps_for, rss, runtime_for
from tests.support.network import LoopbackOnlyBackend
from tests.support.servers import RecordingServer

PRODUCTION = AddressPolicy.parse("")


def routes(server: RecordingServer, table: dict[str, Response]) -> None:
    def respond(request: Request) -> Response:
        if request.path in table:
            return table[request.path]
        if request.path.startswith("/articles/"):
            return article_page()
        return Response(status=404)

    server.responder = respond


@pytest.mark.parametrize(
    "host", ["0x7f000001", "2130706433", "0177.0.0.1", "127.1", "0x7f.0.0.1", "017700000001"]
)
def test_an_address_in_a_non_canonical_spelling_is_refused_even_when_loopback_is_allowed(
    host: str,
) -> None:
    with pytest.raises(UnsafeURL, match="non-canonical"):
        address_literal(host)
    with pytest.raises(UnsafeURL):
        LOOPBACK.check_url(f"http://{host}:8080/feed")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "169.254.169.254",
        "::1",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "2002:a9fe:a9fe::1",
        "fd00::1",
        "100.64.0.1",
    ],
)
def test_non_public_addresses_and_their_ipv6_disguises(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))
    assert not PRODUCTION.allows(ipaddress.ip_address(address))


def test_allowed_private_hosts_are_names_addresses_and_cidrs() -> None:
    policy = AddressPolicy.parse(" 127.0.0.1, 10.0.0.0/8 ,feeds.dev.local, [::1]")
    assert policy.allows(ipaddress.ip_address("10.9.8.7"))
    assert policy.allows(ipaddress.ip_address("::1"))
    assert not policy.allows(ipaddress.ip_address("127.0.0.2"))
    assert not policy.allows(ipaddress.ip_address("169.254.169.254"))
    assert policy.allowed_hosts == frozenset({"feeds.dev.local"})
    with pytest.raises(UnsafeURL, match="internal name"):
        policy.check_url("http://other.local/feed")
    policy.check_url("http://FEEDS.dev.local/feed")  # allowed by name


def test_a_malformed_allowed_hosts_setting_is_a_clear_configuration_error() -> None:
    with pytest.raises(ValueError, match="not a host name, address or CIDR: 'http://x/'"):
        Settings.model_validate({"NEWS_ALLOWED_PRIVATE_HOSTS": "127.0.0.1,http://x/"})
    settings = Settings.model_validate({"NEWS_ALLOWED_PRIVATE_HOSTS": "127.0.0.0/8"})
    assert settings.news_allowed_private_hosts == "127.0.0.0/8"


@pytest.mark.parametrize(
    ("url", "published"),
    [
        ("javascript:alert(1)", None),
        ("file:///etc/passwd", None),
        ("http://169.254.169.254/latest/meta-data/", None),
        ("http://0xa9fea9fe/x.jpg", None),
        ("http://[::ffff:a9fe:a9fe]/x.jpg", None),
        ("http://localhost/x.jpg", None),
        ("http://metadata.google.internal/x.jpg", None),
        ("data:image/png;base64,AAAA", None),
        ("HTTPS://Cdn.Example.com/a.jpg", "https://cdn.example.com/a.jpg"),
        ("https://user:secret@cdn.example.com/a.jpg?x=1", "https://cdn.example.com/a.jpg?x=1"),
    ],
)
def test_a_published_url_is_checked_without_dns_and_without_credentials(
    url: str, published: str | None
) -> None:
    assert PRODUCTION.published_url(url) == published


async def test_a_feed_redirecting_into_the_machine_is_refused_and_its_neighbour_written(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
    network: LoopbackOnlyBackend,
) -> None:
    base, port = feed_server.url, feed_server.url.rsplit(":", 1)[1]
    routes(
        feed_server,
        {
            "/feeds/good": Response(rss(base, 2, prefix="good"), content_type="text/xml"),
            "/feeds/v6": Response(status=302, headers={"Location": f"http://[::1]:{port}/x"}),
            "/feeds/hex": Response(
                status=301, headers={"Location": f"http://0x7f000001:{port}/feeds/good"}
            ),
            "/feeds/meta": Response(
                status=307, headers={"Location": "http://169.254.169.254/latest/meta-data/"}
            ),
        },
    )
    for name in ("good", "v6", "hex", "meta"):
        await add_source(db, url=f"{base}/feeds/{name}", name=name, shard="s", now=NOW)

    report = (
        await run_shard(
            replace(await runtime_for(db, clock, fresh_db_url), news=deps_for(db, clock, http)),
            clock,
            "s",
        )
    ).to_json()

    errors = {e["source"]: e["error"] for e in report["fetchErrors"]}
    assert set(errors) == {"v6", "hex", "meta"}, report
    assert all(e.startswith("refused: ") for e in errors.values()), errors
    assert "::1" in errors["v6"] and "non-canonical" in errors["hex"]
    assert "169.254.169.254" in errors["meta"]
    urls = {r["url"] for r in await db.fetch("SELECT url FROM news.articles")}
    assert urls == {f"{base}/articles/good-0", f"{base}/articles/good-1"}
    # the good feed was fetched once, as itself: the hex redirect never reached it
    assert [r.path for r in feed_server.requests].count("/feeds/good") == 1
    assert network.refused == []  # the policy refused, not the test's network guard
    assert {host for host, _ in network.opened} == {"127.0.0.1"}
    failures = await db.fetch(
        "SELECT name, consecutive_failures FROM news.sources WHERE consecutive_failures > 0"
    )
    assert {r["name"] for r in failures} == {"v6", "hex", "meta"}  # counted toward parking


async def test_dns_rebinding_cannot_steer_the_connection(
    feed_server: RecordingServer, network: LoopbackOnlyBackend
) -> None:
    """The resolver answers a public address first and loopback after that (DNS rebinding).
    The name is resolved once per connection and the connection goes to the address that was
    checked — so the second answer is never used, and nothing reaches the loopback server."""
    answers = [["93.184.216.34"], ["127.0.0.1"], ["127.0.0.1"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[min(len(asked) - 1, 2)]

    port = int(feed_server.url.rsplit(":", 1)[1])
    routes(feed_server, {"/feed": Response(rss(feed_server.url, 1), content_type="text/xml")})
    policy = AddressPolicy(resolver=rebinding)
    async with new_client(policy, inner=network) as client:
        result = await fetch_feed(
            client,
            f"http://rebind.example:{port}/feed",
            NOW,
            FeedRules(policy=policy, parsers=parsers_for_test()),
        )
    assert result.outcome == "failed"
    assert asked == ["rebind.example"]  # resolved once, for the connection itself
    assert network.refused == [("93.184.216.34", port)]  # pinned to the checked address
    assert network.opened == [] and feed_server.requests == []


async def test_a_name_that_answers_a_private_address_among_public_ones_is_refused(
    network: LoopbackOnlyBackend,
) -> None:
    async def mixed(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.0.0.5"]

    policy = AddressPolicy(resolver=mixed)
    async with new_client(policy, inner=network) as client:
        result = await fetch_feed(
            client,
            "http://mixed.example/feed",
            NOW,
            FeedRules(policy=policy, parsers=parsers_for_test()),
        )
    assert result.outcome == "failed" and result.error is not None
    assert "10.0.0.5" in result.error and result.error.startswith("refused")
    assert network.opened == [] and network.refused == []


async def test_links_resolve_like_a_reader_expects_and_lose_their_credentials(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    base = feed_server.url
    host = base.split("://", 1)[1]
    items = "".join(
        f"<item><title>{title}</title><link>{link}</link>{extra}</item>"
        for title, link, extra in [
            ("absolute path", "/articles/rel-1", ""),
            ("relative", "rel-2", ""),
            ("protocol-relative", f"//{host}/articles/rel-3", ""),
            ("upper-case scheme", f"HTTP://{host}/articles/upper", ""),
            ("credentials", f"http://user:secret@{host}/articles/cred", ""),
            (
                "hostile images",
                f"{base}/articles/img",
                '<media:thumbnail url="javascript:alert(1)"/>'
                '<media:content url="file:///etc/passwd"/>',
            ),
            (
                "metadata image",
                f"{base}/articles/meta-img",
                '<media:thumbnail url="http://169.254.169.254/latest/x.jpg"/>',
            ),
            (
                "image with credentials",
                f"{base}/articles/cred-img",
                '<media:thumbnail url="https://u:pw@cdn.example.com/p.jpg"/>',
            ),
        ]
    )
    rss_doc = (
        '<?xml version="1.0"?><rss version="2.0" xmlns:media="http://search.yahoo.com/mrss/">'
        f"<channel><title>L</title>{items}</channel></rss>"
    ).encode()
    atom_doc = (
        '<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"'
        f' xml:base="{base}/base/"><title>A</title><entry><title>xml base</title>'
        '<link href="rel-4"/><id>urn:4</id></entry></feed>'
    ).encode()
    routes(
        feed_server,
        {
            "/feeds/links": Response(rss_doc, content_type="application/rss+xml"),
            "/feeds/atom": Response(atom_doc, content_type="application/atom+xml"),
        },
    )
    await add_source(db, url=base + "/feeds/links", name="Links", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/atom", name="Atom", shard="s", now=NOW)

    report = await run_shard(
        replace(await runtime_for(db, clock, fresh_db_url), news=deps_for(db, clock, http)),
        clock,
        "s",
    )

    rows = {
        r["url"]: r["image_url"] for r in await db.fetch("SELECT url, image_url FROM news.articles")
    }
    assert set(rows) == {
        f"{base}/articles/rel-1",
        f"{base}/feeds/rel-2",
        f"{base}/articles/rel-3",
        f"{base}/articles/upper",
        f"{base}/articles/cred",
        f"{base}/articles/img",
        f"{base}/articles/meta-img",
        f"{base}/articles/cred-img",
        f"{base}/base/rel-4",
    }, report.to_json()
    assert rows[f"{base}/articles/cred-img"] == "https://cdn.example.com/p.jpg"
    # the hostile feed images were dropped; the page's own og:image (loopback, allowed) is used
    assert rows[f"{base}/articles/img"] == f"{base}/img/1.jpg"
    assert rows[f"{base}/articles/meta-img"] == f"{base}/img/1.jpg"
    dump = str(await db.fetch("SELECT * FROM news.articles")) + str(
        await db.fetch("SELECT * FROM news.candidates")
    )
    assert "secret" not in dump and "javascript:" not in dump and "file:" not in dump


async def test_a_source_refused_for_its_address_is_fetched_on_the_next_run_once_allowed(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    from datetime import timedelta

    base = feed_server.url
    routes(feed_server, {"/feeds/lo": Response(rss(base, 2, prefix="lo"), content_type="text/xml")})
    await add_source(db, url=f"{base}/feeds/lo", name="lo", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)
    refused = await run_shard(
        replace(runtime, news=deps_for(db, clock, http, policy=PRODUCTION)), clock, "s"
    )
    [error] = refused.fetch_errors
    assert error.error is not None
    assert error.error.startswith("refused: 127.0.0.1 is not a public address")
    assert feed_server.requests == []  # refused before any connection
    # due again at once, not in 15 minutes: the setting, not the feed, decides
    row = await db.fetch_one("SELECT next_check_at FROM news.sources WHERE name = 'lo'")
    assert row is not None and row["next_check_at"] == NOW
    clock.advance(timedelta(minutes=1))  # the operator sets NEWS_ALLOWED_PRIVATE_HOSTS
    allowed = await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    assert allowed.fetch_errors == [] and allowed.processed_count == 2
