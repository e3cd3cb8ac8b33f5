"""The dashboard's access rules and its one piece of unescaped markup (the SVG charts)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from nightcrew.errors import ConfigError
from nightcrew.web.access import (
    DEVICE_MAX_AGE_SECONDS,
    SESSION_CLOCK_SKEW_SECONDS,
    SESSION_MAX_AGE_SECONDS,
    Access,
    check_secret,
    host_name,
    same_origin,
    secure_cookie,
)
from nightcrew.web.charts import Bar, bar_chart

TOKEN = "t" * 32
NOW = 1_795_924_800.0  # 2026-11-29T04:00:00Z


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
    assert access.cookie_valid(access.session_value(NOW), NOW)
    assert TOKEN not in access.session_value(NOW)
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


def test_a_session_ends_after_its_max_age_and_with_a_new_token() -> None:
    access = Access.for_bind("0.0.0.0", TOKEN)
    cookie = access.session_value(NOW)
    assert access.cookie_valid(cookie, NOW + SESSION_MAX_AGE_SECONDS - 1)
    assert not access.cookie_valid(cookie, NOW + SESSION_MAX_AGE_SECONDS)
    # issued "in the future": beyond a replica's clock skew it was not issued by us
    assert access.cookie_valid(cookie, NOW - SESSION_CLOCK_SKEW_SECONDS)
    assert not access.cookie_valid(cookie, NOW - SESSION_CLOCK_SKEW_SECONDS - 1)
    rotated = Access.for_bind("0.0.0.0", "u" * 32)
    assert not rotated.cookie_valid(cookie, NOW)
    assert rotated.cookie_valid(rotated.session_value(NOW), NOW)


def test_a_device_cookie_is_no_session_and_a_session_no_device_cookie() -> None:
    """The known-device cookie only ranks a sign-in (throttle.py): it must never open the
    dashboard, and a session must not pass for one; both end with a new token."""
    access = Access.for_bind("0.0.0.0", TOKEN)
    device = access.device_value(NOW)
    # its identity at the throttle is its signed nonce
    assert access.device_id(device, NOW + DEVICE_MAX_AGE_SECONDS - 1) == device.split(".")[1]
    assert access.device_id(device, NOW + DEVICE_MAX_AGE_SECONDS) is None
    assert not access.cookie_valid(device, NOW)
    assert access.device_id(access.session_value(NOW), NOW) is None
    assert Access.for_bind("0.0.0.0", "u" * 32).device_id(device, NOW) is None
    assert access.device_id(None, NOW) is None and access.device_id("forged", NOW) is None
    # an open dashboard has no sign-in to rank
    assert Access.for_bind("127.0.0.1", None).device_id(device, NOW) is None


@pytest.mark.parametrize(
    "forged",
    [
        None,
        "",
        "forged",
        # the issue time moved forward: the signature no longer covers it
        f"{int(NOW) + 3600}.{Access.for_bind('0.0.0.0', TOKEN).session_value(NOW)[11:]}",
        f"{int(NOW)}." + "0" * 64,
        f"{int(NOW)}.{'0' * 32}." + "0" * 64,
        f"{int(NOW)}.{'A' * 64}",
        "٣" * 10 + "." + "0" * 64,  # digits, but not ASCII ones
        f"{'9' * 40}.{'0' * 64}",
    ],
)
def test_a_forged_or_altered_session_is_refused(forged: str | None) -> None:
    access = Access.for_bind("0.0.0.0", TOKEN)
    assert not access.cookie_valid(forged, NOW)


def test_the_session_format_is_issue_time_dot_nonce_dot_signature() -> None:
    access = Access.for_bind("0.0.0.0", TOKEN)
    value = access.session_value(NOW)
    issued, nonce, mac = value.split(".")
    assert issued == str(int(NOW)) and len(nonce) == 32 and len(mac) == 64
    # two sessions of the same second are two cookies, each valid
    other = access.session_value(NOW)
    assert other != value and access.cookie_valid(other, NOW)
    # the nonce is signed too: another one voids the signature
    assert not access.cookie_valid(f"{issued}.{'0' * 32}.{mac}", NOW)


@pytest.mark.parametrize("token", [" " * 40, "\t" * 40, "ab " * 12, " " * 30 + TOKEN[:20]])
def test_a_token_of_blanks_or_too_few_other_characters_is_refused(token: str) -> None:
    with pytest.raises(ConfigError, match="non-blank characters"):
        Access.for_bind("127.0.0.1", token)


def test_a_weak_reconciler_secret_is_refused_and_an_empty_one_closes_the_door() -> None:
    with pytest.raises(ConfigError, match="RECONCILER_SECRET has 11 non-blank"):
        check_secret("RECONCILER_SECRET", "short-token")
    assert check_secret("RECONCILER_SECRET", "") is None
    assert check_secret("RECONCILER_SECRET", None) is None
    assert check_secret("RECONCILER_SECRET", TOKEN) == TOKEN


@pytest.mark.parametrize(
    ("origin", "referer", "host", "same"),
    [
        ("http://127.0.0.1:8787", None, "127.0.0.1:8787", True),
        ("https://dash.example", None, "dash.example", True),  # a TLS front end passing Host
        ("https://dash.example", None, "dash.example:443", True),
        ("HTTP://[::1]:8787", None, "[0:0::1]:8787", True),
        (None, "http://127.0.0.1:8787/login?next=/", "127.0.0.1:8787", True),
        (None, None, "127.0.0.1:8787", True),  # not a browser: no forged request to stop
        ("https://attacker.example", None, "dash.example", False),
        ("http://127.0.0.1:9999", None, "127.0.0.1:8787", False),
        ("http://dash.example", None, "dash.example:8787", False),
        ("null", None, "127.0.0.1:8787", False),
        ("https://attacker.example", "https://dash.example/", "dash.example", False),
        (None, "https://attacker.example/x", "dash.example", False),
        ("file://", None, "dash.example", False),
        ("http://dash.example:99999", None, "dash.example", False),
        ("http://dash.example", None, None, False),
    ],
)
def test_a_post_must_come_from_this_sites_pages(
    origin: str | None, referer: str | None, host: str | None, same: bool
) -> None:
    assert same_origin(origin, referer, host) is same


@pytest.mark.parametrize(
    ("scheme", "client", "secure"),
    [
        ("http", "127.0.0.1", False),  # the developer on loopback
        ("http", "::1", False),
        ("https", "127.0.0.1", True),  # a TLS front end on this machine said so
        ("http", "10.1.2.3", True),  # a TLS front end elsewhere talks plain HTTP to us
        ("http", "192.0.2.7", True),
        ("https", "192.0.2.7", True),
        ("http", None, True),
    ],
)
def test_the_cookie_is_secure_unless_plain_http_from_this_machine(
    scheme: str, client: str | None, secure: bool
) -> None:
    assert secure_cookie(scheme, client) is secure


def _resolver(*addresses: str) -> Any:
    def resolve(host: str, port: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

    return resolve


def test_a_bind_name_that_resolves_to_loopback_only_keeps_the_host_check() -> None:
    # `--host myname` with myname in /etc/hosts as 127.0.1.1: a loopback bind, no token needed,
    # and only loopback names (and its own) may name this dashboard in Host
    access = Access.for_bind("myname", None, resolve=_resolver("127.0.1.1"))
    assert access.hosts is not None and "myname" in access.hosts
    assert not access.host_allowed("attacker.example")
    with pytest.raises(ConfigError, match="NIGHTCREW_DASHBOARD_TOKEN"):
        Access.for_bind("mixed", None, resolve=_resolver("127.0.0.1", "192.0.2.7"))


def test_a_bind_name_that_does_not_resolve_is_not_taken_for_loopback() -> None:
    def fails(host: str, port: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror("no such name")

    with pytest.raises(ConfigError, match="NIGHTCREW_DASHBOARD_TOKEN"):
        Access.for_bind("nowhere", None, resolve=fails)
