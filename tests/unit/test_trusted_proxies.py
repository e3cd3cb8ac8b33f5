"""NIGHTCREW_TRUSTED_PROXIES: what it accepts, what it refuses at start, and what uvicorn's
proxy-headers middleware then believes (the real middleware, driven with ASGI scopes)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from nightcrew.config import Settings, load_settings
from nightcrew.errors import ConfigError
from nightcrew.setting_parsers import parse_trusted_proxies
from nightcrew.web.proxies import uvicorn_proxy_options


def test_addresses_and_networks_are_read_in_any_spelling() -> None:
    parsed = parse_trusted_proxies(" 127.0.0.1, 10.0.0.0/8 ,[::1],fd00::/8,, ")
    assert parsed == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert parse_trusted_proxies("") == () == parse_trusted_proxies(" , ")


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("127.0.0.1,proxy.internal", "'proxy.internal'"),
        ("10.0.0.5/8", "'10.0.0.5/8'"),  # host bits set: 10.0.0.0/8 or 10.0.0.5 meant?
        ("10.0.0.0/33", "'10.0.0.0/33'"),
        ("*", "'*'"),
        ("0.0.0.0/0", "'0.0.0.0/0'"),
        ("::/0", "'::/0'"),
        ("127.0.0.1:8080", "'127.0.0.1:8080'"),
    ],
)
def test_a_bad_entry_stops_the_start_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str, named: str
) -> None:
    monkeypatch.setenv("NIGHTCREW_TRUSTED_PROXIES", value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid configuration: NIGHTCREW_TRUSTED_PROXIES: ")
    assert named in message and "\n" not in message


def test_unset_believes_no_one_and_says_so_to_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    # uvicorn's own default would be FORWARDED_ALLOW_IPS, else 127.0.0.1 and ::1
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    monkeypatch.delenv("NIGHTCREW_TRUSTED_PROXIES", raising=False)
    settings = load_settings()
    assert settings.trusted_proxy_networks == ()
    assert uvicorn_proxy_options(settings.trusted_proxy_networks) == {
        "proxy_headers": False,
        "forwarded_allow_ips": [],
    }


async def _seen_by_the_app(
    trusted: str, peer: str, headers: list[tuple[bytes, bytes]]
) -> tuple[str, str]:
    """The (client address, scheme) the app sees behind uvicorn's middleware as serve sets it
    up for ``NIGHTCREW_TRUSTED_PROXIES=trusted``."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope)

    options = uvicorn_proxy_options(
        Settings.model_validate({"NIGHTCREW_TRUSTED_PROXIES": trusted}).trusted_proxy_networks
    )
    assert options["proxy_headers"] is True
    middleware = ProxyHeadersMiddleware(app, trusted_hosts=options["forwarded_allow_ips"])
    scope = {"type": "http", "scheme": "http", "client": (peer, 50000), "headers": headers}

    async def receive() -> Any:
        raise AssertionError("not read")

    async def send(message: Any) -> None:
        raise AssertionError("not sent")

    await middleware(scope, receive, send)  # type: ignore[arg-type]
    return seen["client"][0], seen["scheme"]


FORWARDED = [(b"x-forwarded-for", b"203.0.113.9"), (b"x-forwarded-proto", b"https")]


@pytest.mark.parametrize(
    ("trusted", "peer", "seen"),
    [
        ("127.0.0.1", "127.0.0.1", ("203.0.113.9", "https")),
        # listening on "::", an IPv4 proxy's connection arrives IPv4-mapped
        ("127.0.0.1", "::ffff:127.0.0.1", ("203.0.113.9", "https")),
        ("10.1.0.0/16", "::ffff:10.1.200.3", ("203.0.113.9", "https")),
        ("10.1.0.0/16", "10.2.0.1", ("10.2.0.1", "http")),
        ("::1", "::1", ("203.0.113.9", "https")),
        ("::1", "127.0.0.1", ("127.0.0.1", "http")),
        ("192.0.2.1", "127.0.0.1", ("127.0.0.1", "http")),
    ],
)
async def test_only_the_named_proxies_are_believed(
    trusted: str, peer: str, seen: tuple[str, str]
) -> None:
    assert await _seen_by_the_app(trusted, peer, FORWARDED) == seen


async def test_a_client_cannot_prepend_an_address_of_its_choosing() -> None:
    # the proxy appends the address it saw; what the client sent before it is not believed
    headers = [(b"x-forwarded-for", b"198.51.100.1, 10.9.9.9, 203.0.113.9")]
    assert await _seen_by_the_app("127.0.0.1", "127.0.0.1", headers) == ("203.0.113.9", "http")
    # a chain of trusted proxies is walked back to the first address that is not one
    headers = [(b"x-forwarded-for", b"198.51.100.1, 203.0.113.9, 10.0.0.7")]
    seen = await _seen_by_the_app("127.0.0.1,10.0.0.0/24", "127.0.0.1", headers)
    assert seen == ("203.0.113.9", "http")


def test_a_url_with_a_password_is_refused_without_echoing_the_password() -> None:
    with pytest.raises(ValueError, match="not an IP address or CIDR") as refused:
        parse_trusted_proxies("10.0.0.1, http://proxy:s3cret-proxy-pass@10.0.0.2:8080")
    assert "s3cret-proxy-pass" not in str(refused.value)
    assert "[redacted]" in str(refused.value)
