"""Which parser reads a feed: feedparser-rs first, feedparser when the fast one raises, finds
fewer entries than the document holds, or leaves links it should have resolved."""

from __future__ import annotations

from typing import Any

import feedparser_rs
import pytest

from nightcrew.news.steps.parse import parse_feed

BASE = "https://news.example.com/feed.xml"


def _doc(items: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>T</title>'
        f"{items}</channel></rss>"
    ).encode()


def _item(title: str, link: str) -> str:
    return f"<item><title>{title}</title><link>{link}</link><description>d</description></item>"


WELL_FORMED = _doc(
    _item("one", "https://news.example.com/1") + _item("two", "https://news.example.com/2")
)


def test_a_well_formed_feed_is_read_by_feedparser_rs() -> None:
    parsed = parse_feed(WELL_FORMED, BASE)
    assert parsed.parser == "feedparser-rs" and parsed.is_feed
    assert [(e.title, e.link) for e in parsed.entries] == [
        ("one", "https://news.example.com/1"),
        ("two", "https://news.example.com/2"),
    ]


def test_a_feed_the_fast_parser_reads_short_is_read_again_by_feedparser() -> None:
    # a bare "&" and "<" in titles: ill-formed XML; feedparser-rs finds no entry of the two
    ill_formed = _doc(
        _item("fish & chips", "https://news.example.com/1")
        + _item("a < b", "https://news.example.com/2")
    )
    assert len(feedparser_rs.parse(ill_formed).entries) < 2  # the premise of this test
    parsed = parse_feed(ill_formed, BASE)
    assert parsed.parser == "feedparser"
    assert [e.link for e in parsed.entries] == [
        "https://news.example.com/1",
        "https://news.example.com/2",
    ]


def test_a_fast_parser_that_raises_falls_back_to_feedparser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def panics(_body: bytes, **_kw: Any) -> Any:
        raise RuntimeError("a Rust panic, as Python sees it")

    monkeypatch.setattr(feedparser_rs, "parse_with_limits", panics)
    parsed = parse_feed(WELL_FORMED, BASE)
    assert parsed.parser == "feedparser" and len(parsed.entries) == 2


def test_links_left_relative_under_a_private_xml_base_are_read_again() -> None:
    # feedparser-rs does not resolve against a private xml:base; whether a private address
    # is allowed is the address policy's decision, so feedparser resolves it
    doc = (
        b'<?xml version="1.0"?><rss version="2.0" xml:base="http://10.0.0.5/news/">'
        b"<channel><title>T</title><item><title>x</title><link>story.html</link></item>"
        b"</channel></rss>"
    )
    parsed = parse_feed(doc, BASE)
    assert parsed.parser == "feedparser"
    assert [e.link for e in parsed.entries] == ["http://10.0.0.5/news/story.html"]


def test_no_entries_in_a_document_that_is_no_feed() -> None:
    parsed = parse_feed(b"<html><body>not a feed</body></html>", BASE)
    assert parsed.entries == [] and not parsed.is_feed


def test_a_feed_past_the_item_cap_keeps_its_first_items_and_counts_the_rest() -> None:
    items = b"".join(
        b"<item><title>n%d</title><link>https://news.example/%d</link></item>" % (i, i)
        for i in range(25)
    )
    doc = b'<rss version="2.0"><channel><title>t</title>' + items + b"</channel></rss>"
    parsed = parse_feed(doc, BASE, max_items=10)
    assert parsed.parser == "feedparser-rs" and parsed.problem is None
    assert [e.title for e in parsed.entries] == [f"n{i}" for i in range(10)]
    assert parsed.over_cap == 15
    assert parse_feed(doc, BASE).over_cap == 0
