"""The dashboard's access rules and its one piece of unescaped markup (the SVG charts)."""

from __future__ import annotations

import pytest

from nightcrew.errors import ConfigError
from nightcrew.web.access import Access, host_name
from nightcrew.web.charts import Bar, bar_chart

TOKEN = "t" * 32


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:8787", "localhost", "LOCALHOST:1", "localhost.", "[::1]:80", "[0:0::1]:8787"],
)
def test_loopback_host_names_are_this_dashboard(host: str) -> None:
    assert Access.for_bind("127.0.0.1", None).host_allowed(host)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "127.0.0.1.evil.example",
        "localhost:80@evil.example",
        "localhost:evil.example",
        "127.0.0.1:",
        "127.0.0.2",  # loopback, but not the name it was bound to or a loopback name
        "",
        None,
        "[::1",
        "::1",  # an IPv6 Host must be bracketed
    ],
)
def test_other_or_malformed_host_headers_are_refused(host: str | None) -> None:
    assert not Access.for_bind("127.0.0.1", None).host_allowed(host)


def test_bound_to_another_loopback_address_its_own_name_is_accepted() -> None:
    access = Access.for_bind("127.0.0.2", None)
    assert access.host_allowed("127.0.0.2:8787") and access.host_allowed("localhost")
    assert host_name("[0:0:0:0:0:0:0:1]:1") == "::1"


def test_tokens_are_long_and_compared_as_digests() -> None:
    with pytest.raises(ConfigError, match="at least 32"):
        Access.for_bind("0.0.0.0", "short-token")
    access = Access.for_bind("0.0.0.0", TOKEN)
    assert access.token_matches(TOKEN) and not access.token_matches(TOKEN + "x")
    assert not access.token_matches("") and not access.token_matches(TOKEN[:-1])
    assert access.cookie_valid(access.session_value())
    assert TOKEN not in access.session_value()
    assert access.bearer_valid(f"Bearer {TOKEN}") and not access.bearer_valid(f"Basic {TOKEN}")
    assert not access.bearer_valid(None)


def test_chart_labels_and_tips_are_escaped() -> None:
    svg = bar_chart(
        [Bar(label="<b>", value=3, tip="</title><script>alert(1)</script>"), Bar("x", 0)],
        title="<img src=x onerror=alert(1)>",
    )
    assert "<script" not in svg and "<img" not in svg and "<b>" not in svg
    assert "&lt;script&gt;" in svg and "&lt;img" in svg
    assert svg.count("<rect") == 2


def test_an_all_zero_chart_draws_a_baseline_not_a_division_by_zero() -> None:
    svg = bar_chart([Bar("a", 0), Bar("b", 0)], title="nothing")
    assert 'height="0.0"' in svg and "max 0" in svg
