"""Titles are plain text whichever parser read the feed (the snapshot kept raw HTML
from the feedparser path; feedparser-rs hands HTML titles on as markup too)."""

from __future__ import annotations

import pytest

from nightcrew.news.steps.parse import parse_feed

BASE = "https://news.example.com/feed.xml"
# An entry without a link sends the whole document to feedparser (parse.py: a blanked link)
FORCE_SLOW = "<item><title>no link here</title></item>"


def _rss(title_xml: str, *, slow: bool) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>T</title>'
        f"<item><title>{title_xml}</title><link>https://news.example.com/1</link></item>"
        f"{FORCE_SLOW if slow else ''}</channel></rss>"
    ).encode()


def _atom(title_xml: str, kind: str, *, slow: bool) -> bytes:
    extra = "<entry><title>no link here</title></entry>" if slow else ""
    return (
        '<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom">'
        f'<title>T</title><entry><title type="{kind}">{title_xml}</title>'
        f'<link href="https://news.example.com/1"/><id>1</id></entry>{extra}</feed>'
    ).encode()


CASES = {
    "escaped markup": (
        lambda slow: _rss("&lt;b&gt;Bold&lt;/b&gt; news &amp;amp; more", slow=slow),
        "Bold news & more",
    ),
    "a script in a title": (
        lambda slow: _rss("Hi &lt;script&gt;alert(1)&lt;/script&gt;there", slow=slow),
        "Hi there",
    ),
    "CDATA markup": (
        lambda slow: _rss("<![CDATA[<i>Italic</i> &amp; AT&amp;T]]>", slow=slow),
        "Italic & AT&T",
    ),
    "an ampersand": (lambda slow: _rss("Fish &amp; chips", slow=slow), "Fish & chips"),
    "a less-than that is text": (
        lambda slow: _rss("a &lt; b and c &gt; d", slow=slow),
        "a < b and c > d",
    ),
    "Atom html": (
        lambda slow: _atom("&lt;em&gt;Em&lt;/em&gt; x &amp;lt; y", "html", slow=slow),
        "Em x < y",
    ),
    # Atom's type="text" says the angle brackets are the title's own characters: kept
    "Atom text": (lambda slow: _atom("x &lt;b&gt; y", "text", slow=slow), "x <b> y"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("slow", "parser"), [(False, "feedparser-rs"), (True, "feedparser")])
def test_a_title_is_plain_text_in_both_parser_paths(case: str, slow: bool, parser: str) -> None:
    document, expected = CASES[case]
    parsed = parse_feed(document(slow), BASE)
    assert parsed.parser == parser  # the path this case is about was the one taken
    assert parsed.entries[0].title == expected
