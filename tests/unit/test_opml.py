"""Feed lists in and out (``news/sources/opml.py``), and the checks an import makes before the
database (``check_import``): no database here."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime

import pytest

from nightcrew.news.sources.opml import (
    FeedEntry,
    FeedListError,
    OpmlFeed,
    SkipReason,
    build_opml,
    parse_feed_list,
)
from nightcrew.news.sources.registry import check_import

NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)

NESTED = b"""<?xml version="1.0" encoding="UTF-8"?>
<opml version="2.0">
  <head><title>Subscriptions</title></head>
  <body>
    <outline text="Tech" title="Tech">
      <outline type="rss" text="Ars" title="Ars Technica" xmlUrl="https://ars.example/rss"/>
      <outline text="Linux">
        <outline type="rss" text="LWN" xmlUrl="https://lwn.example/headlines/rss"/>
      </outline>
    </outline>
    <outline type="rss" xmlUrl="https://nameless.example:8443/feed?a=1&amp;b=2"/>
    <outline type="link" text="A page, no feed" url="https://page.example/"/>
    <outline text="Empty category"/>
  </body>
</opml>
"""


def test_nested_outlines_are_walked_with_their_lines_and_names() -> None:
    parsed = parse_feed_list(NESTED)
    assert parsed.format == "opml"
    assert parsed.entries == (
        FeedEntry(line=6, url="https://ars.example/rss", name="Ars Technica"),
        FeedEntry(line=8, url="https://lwn.example/headlines/rss", name="LWN"),
        FeedEntry(line=11, url="https://nameless.example:8443/feed?a=1&b=2", name=None),
    )
    # categories with outlines inside are not entries; leaves without xmlUrl are reported
    assert [(s.line, s.reason, s.url) for s in parsed.skipped] == [
        (12, SkipReason.missing_xmlurl, "https://page.example/"),
        (13, SkipReason.missing_xmlurl, None),
    ]
    candidates, _ = check_import(parsed)
    # no name in the file: the URL's host, as for a source added without one
    assert candidates[-1].name == "nameless.example"


def test_attribute_names_are_matched_without_case_and_names_made_one_line() -> None:
    parsed = parse_feed_list(
        b'<opml><body><outline TITLE="  Two\n  lines " xmlurl="https://a.example/"/></body></opml>'
    )
    assert parsed.entries == (FeedEntry(line=1, url="https://a.example/", name="Two lines"),)


def test_a_url_list_skips_comments_and_blank_lines_and_may_name_a_feed() -> None:
    text = (
        "\ufeff# my feeds\n"
        "https://a.example/rss\n"
        "\n"
        "   # indented comment\n"
        "https://b.example/atom.xml   The B  blog\r\n"
        "https://a.example/rss\n"
        "ftp://c.example/feed\n"
        "javascript:alert(1)\n"
        "https://d.example/\x00feed\n"
        "https://e.example/\ttabbed\n"
        "not a url at all\n"
    )
    parsed = parse_feed_list(text.encode())
    assert parsed.format == "urls"
    assert [(e.line, e.url, e.name) for e in parsed.entries] == [
        (2, "https://a.example/rss", None),
        (5, "https://b.example/atom.xml", "The B blog"),
        (6, "https://a.example/rss", None),
        (7, "ftp://c.example/feed", None),
        (10, "https://e.example/", "tabbed"),
    ]
    # a line that is no "URL [NAME]" is reported whole, not its first word as the URL
    assert [(s.line, s.reason, s.url) for s in parsed.skipped] == [
        (8, SkipReason.invalid_url, "javascript:alert(1)"),
        (9, SkipReason.invalid_url, "https://d.example/?feed"),
        (11, SkipReason.invalid_url, "not a url at all"),
    ]

    candidates, skipped = check_import(parsed)
    assert [(c.line, c.name) for c in candidates] == [
        (2, "a.example"),
        (5, "The B blog"),
        (10, "tabbed"),
    ]
    assert [(s.line, s.reason) for s in sorted(skipped, key=lambda s: s.line)] == [
        (6, SkipReason.duplicate),
        (7, SkipReason.invalid_url),
        (8, SkipReason.invalid_url),
        (9, SkipReason.invalid_url),
        (11, SkipReason.invalid_url),
    ]
    duplicate = next(s for s in skipped if s.reason is SkipReason.duplicate)
    assert duplicate.detail == "the same feed URL as line 2"
    assert "not an http(s) feed URL" in next(s.detail for s in skipped if s.line == 7)


def test_duplicates_in_an_opml_file_are_reported_with_the_first_line() -> None:
    doc = (
        b"<opml version='2.0'><body>\n"
        b"<outline text='A' xmlUrl='https://a.example/rss'/>\n"
        b"<outline text='Cat'>\n"
        b"  <outline text='A again' xmlUrl=' https://a.example/rss '/>\n"
        b"</outline>\n"
        b"</body></opml>"
    )
    candidates, skipped = check_import(parse_feed_list(doc))
    assert [(c.line, c.name) for c in candidates] == [(2, "A")]
    assert [(s.line, s.reason, s.detail) for s in skipped] == [
        (4, SkipReason.duplicate, "the same feed URL as line 2")
    ]


@pytest.mark.parametrize(
    "doc",
    [
        # billion laughs: internal entities, which expat would expand
        b'<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
        b' <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\n]>\n'
        b"<opml><body><outline text='&lol2;' xmlUrl='https://a.example/'/></body></opml>",
        # an external entity
        b'<!DOCTYPE opml [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
        b"<opml><body><outline text='&xxe;' xmlUrl='https://a.example/'/></body></opml>",
        # a DOCTYPE with nothing in it is refused all the same
        b"<!DOCTYPE opml><opml><body/></opml>",
    ],
    ids=["internal-entities", "external-entity", "bare-doctype"],
)
def test_a_doctype_is_refused_outright(doc: bytes) -> None:
    with pytest.raises(FeedListError, match="refused: the document has a DOCTYPE"):
        parse_feed_list(doc)


def test_an_undeclared_entity_is_malformed_xml() -> None:
    with pytest.raises(FeedListError, match=r"line 1, column \d+: .*undefined entity"):
        parse_feed_list(b"<opml><body><outline text='&nbsp;'/></body></opml>")


def test_malformed_xml_names_line_and_column() -> None:
    doc = b'<?xml version="1.0"?>\n<opml>\n<body>\n  <outline text="a">\n</body>\n</opml>\n'
    with pytest.raises(FeedListError) as caught:
        parse_feed_list(doc)
    assert str(caught.value) == "line 5, column 3: not well-formed XML (mismatched tag)"
    assert caught.value.line == 5


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (b"<rss version='2.0'><channel/></rss>", "not an OPML document: its root element is <rss>"),
        (b"<opml version='2.0'><head/></opml>", "not an OPML document: it has no <body>"),
        (b"https://a.example/\n\xff\xfe\n", "line 2: not UTF-8 text"),
    ],
)
def test_a_file_that_is_no_feed_list_is_refused(doc: bytes, message: str) -> None:
    with pytest.raises(FeedListError, match=message):
        parse_feed_list(doc)


def test_an_oversized_file_is_refused() -> None:
    from nightcrew.news.sources import opml

    with pytest.raises(FeedListError, match="larger than 64 MB"):
        parse_feed_list(b"#" * (opml.MAX_FILE_BYTES + 1))


def test_an_empty_file_is_an_empty_url_list() -> None:
    parsed = parse_feed_list(b"")
    assert parsed.format == "urls" and parsed.entries == () and parsed.skipped == ()


HOSTILE = [
    OpmlFeed(name='<script>alert("x")</script> & "friends"', feed_url="https://a.example/rss"),
    OpmlFeed(name="it's ]]> <!-- -->", feed_url="https://b.example/feed?a=1&b=<2>&c='3'"),
    OpmlFeed(name="Ünïcödé ☃ 新闻", feed_url="https://c.example/ü"),
]


def test_export_then_import_round_trips_hostile_names_and_urls() -> None:
    document = build_opml(HOSTILE, title="nightcrew & co <sources>", created=NOW)
    assert document.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<opml version="2.0">')
    assert "<script>" not in document

    root = ET.fromstring(document.encode())  # well-formed for any reader, not only ours
    assert root.findtext("head/title") == "nightcrew & co <sources>"
    assert root.findtext("head/dateCreated") == "Sun, 29 Nov 2026 04:00:00 +0000"
    outlines = root.findall("body/outline")
    assert [o.attrib["type"] for o in outlines] == ["rss"] * 3
    assert [(o.attrib["text"], o.attrib["title"]) for o in outlines] == [
        (f.name, f.name) for f in HOSTILE
    ]

    parsed = parse_feed_list(document.encode())
    assert parsed.skipped == ()
    assert [(e.url, e.name) for e in parsed.entries] == [(f.feed_url, f.name) for f in HOSTILE]


def test_export_drops_what_xml_cannot_carry() -> None:
    document = build_opml(
        [OpmlFeed(name="bell\x07 name", feed_url="https://a.example/\x01x")], title="t", created=NOW
    )
    (entry,) = parse_feed_list(document.encode()).entries
    assert entry == FeedEntry(line=8, url="https://a.example/%01x", name="bell name")


def test_an_empty_export_is_a_valid_document() -> None:
    document = build_opml([], title="nothing", created=NOW)
    assert parse_feed_list(document.encode()).entries == ()
