"""A feed URL is checked when its source is added: an http(s) URL whose host is an address or a
name that could resolve. (A host with a space in it was accepted, then refused at every run
with the hint to allow it as a private address.)"""

from __future__ import annotations

import re

import pytest

from nightcrew.news.sources.registry import SourceError, validate_feed_url


@pytest.mark.parametrize(
    "url",
    [
        "https://feeds.example.com/rss",
        "http://127.0.0.1:8080/feed",
        "http://[::1]/feed",
        "https://bücher.example/feed",  # an IDN, resolved as its punycode
        "https://my_host.example/feed",
        " https://padded.example/feed ",
    ],
)
def test_a_feed_url_with_a_real_host_is_accepted(url: str) -> None:
    assert validate_feed_url(url) == url.strip()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://exa mple.com/feed", "not a host name or address: 'exa mple.com'"),
        ("http://a..b/feed", "not a host name or address"),
        ("http://host:port/feed", "not a feed URL"),
        ("ftp://files.example/feed", "not an http(s) feed URL"),
        ("feeds.example/rss", "not an http(s) feed URL"),
        ("http://-leading.example/feed", "not a host name or address"),
        ("http://[oops/feed", "not a feed URL"),
    ],
)
def test_a_feed_url_without_a_usable_host_is_refused_by_name(url: str, says: str) -> None:
    with pytest.raises(SourceError, match=re.escape(says)):
        validate_feed_url(url)
