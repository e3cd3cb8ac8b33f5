"""The plain-URL fast path (``addresses.PLAIN_URL``) gives every link and image URL exactly
what the split-and-join gives it: the same stored article URL or the same reason to drop it,
the same published image URL or the same refusal. Hypothesis looks for a counterexample among
URLs built to hit the fast path and its edges (ports, credentials, upper case, empty queries,
fragments, address literals in odd spellings, internal names)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nightcrew.adapters.addresses import PLAIN_URL, AddressPolicy
from nightcrew.news.steps import entries

BASE = "https://news.example.com/feeds/main.xml"
POLICY = AddressPolicy.parse("127.0.0.1,allowed.internal")

_hosts = st.sampled_from(
    [
        "news.example.com",
        "News.Example.com",
        "img.example",
        "a..b",
        "example.com.",
        "localhost",
        "cdn.localhost",
        "allowed.internal",
        "other.internal",
        "127.0.0.1",
        "10.0.0.1",
        "8.8.8.8",
        "0x7f.1",
        "2130706433",
        "[::1]",
        "user:secret@news.example.com",
        "news.example.com:8080",
        "news.example.com:443",
        "news.example.com:99999",
        "xn--bcher-kva.example",
        "bücher.example",
        "",
    ]
)
_text = st.text(
    alphabet=st.sampled_from(list("abcXYZ019-._~!$&'()*+,;=:@%/?#[] \t\\é")), max_size=24
)
_urls = st.builds(
    lambda scheme, host, path, tail: f"{scheme}://{host}{path}{tail}",
    st.sampled_from(["http", "https", "HTTP", "ftp", "javascript"]),
    _hosts,
    st.one_of(st.just(""), _text.map(lambda t: "/" + t)),
    st.one_of(
        st.just(""),
        st.just("?"),
        st.just("#"),
        _text.map(lambda t: "?" + t),
        _text.map(lambda t: "#" + t),
        st.just("?utm_source=x&b=2"),
    ),
)
_links = st.one_of(_urls, _text, _urls.map(lambda u: f"  {u}\n"))


@settings(max_examples=1000, deadline=None)
@given(_links)
@example("https://news.example.com")
@example("https://news.example.com/a?")
@example("https://news.example.com/a#")
@example("https://news.example.com/story/1")
@example("//news.example.com/story/1")
@example("/story/1")
@example("//[")  # Hypothesis found it: the join raised, and the whole feed failed with it
def test_an_article_link_is_stored_as_the_split_and_join_stores_it(link: str) -> None:
    try:
        absolute = entries._absolute(link.strip(), BASE)
    except ValueError:  # a link that cannot even be joined ("//[") is a malformed one
        assert entries._article_url(link, BASE) == (None, entries.LINK_MALFORMED)
        return
    assert entries._article_url(link, BASE) == entries._article_url_split(absolute)


@settings(max_examples=1000, deadline=None)
@given(_links)
@example("https://img.example/1.jpg?w=100&h=50")
@example("http://127.0.0.1/a.png")
@example("http://10.0.0.1/a.png")
@example("http://0x7f.1/a.png")
@example("https://cdn.localhost/a.png")
@example("https://img.example/a.png?")
def test_an_image_url_is_published_as_the_split_and_join_publishes_it(url: str) -> None:
    assert POLICY.published_url(url) == POLICY.published_url_split(url.strip())


@pytest.mark.parametrize(
    "url",
    [
        "https://news.example.com/story/1",
        "http://img.example/a.jpg?w=1",
        "https://news.example.com",
    ],
)
def test_the_common_forms_take_the_fast_path(url: str) -> None:
    # (were nothing plain, the tests above would pass with the fast path never taken)
    assert PLAIN_URL.fullmatch(url) is not None


@pytest.mark.parametrize(
    "url",
    [
        "https://News.example.com/1",
        "https://news.example.com:443/1",
        "https://user@news.example.com/1",
        "https://news.example.com/1#top",
        "https://news.example.com/1?",
        "https://news.example.com/é",
        "https://news.example.com/a b",
    ],
)
def test_what_the_join_would_change_takes_the_slow_path(url: str) -> None:
    assert PLAIN_URL.fullmatch(url) is None
