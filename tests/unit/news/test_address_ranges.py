"""The address check itself (never a connection): multicast, reserved, unspecified and broadcast
addresses are not public, in any spelling an IPv6 address can carry them in, and the public
addresses beside them still are (Python 3.11's ``is_global`` calls multicast global).
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nightcrew.adapters.addresses import AddressPolicy, UnsafeURL, is_public

PRODUCTION = AddressPolicy.parse("")

REFUSED = [
    "224.0.0.1",  # all hosts on this link
    "224.0.0.251",  # mDNS
    "239.255.255.250",  # SSDP
    "233.252.0.1",  # MCAST-TEST-NET, is_global in 3.11
    "240.0.0.1",  # reserved (class E)
    "255.255.255.255",  # limited broadcast
    "0.0.0.0",  # unspecified
    "ff02::1",  # IPv6 all nodes, link scope
    "ff05::2",  # site scope
    "ff0e::1",  # global scope: is_global in 3.11
    "::",  # unspecified
    "::ffff:224.0.0.1",  # mapped multicast
    "2002:e000:1::1",  # 6to4 carrying 224.0.0.1
    "64:ff9b::e000:1",  # NAT64 of 224.0.0.1
    "64:ff9b::f000:1",  # NAT64 of 240.0.0.1
    "::e000:1",  # IPv4-compatible 224.0.0.1
    "100::1",  # discard-only
    "4000::1",  # reserved IPv6 space, outside global unicast
]
STILL_PUBLIC = ["8.8.8.8", "1.1.1.1", "223.255.255.254", "2606:4700::1111", "64:ff9b::808:808"]


@pytest.mark.parametrize("text", REFUSED)
def test_multicast_reserved_and_unspecified_addresses_are_refused(text: str) -> None:
    assert_refused(text)


def assert_refused(text: str) -> None:
    """``text`` is refused as an address, as a feed URL's host and as a published URL's."""
    address = ipaddress.ip_address(text)
    assert not is_public(address)
    assert not PRODUCTION.allows(address)
    literal = f"[{text}]" if ":" in text else text
    with pytest.raises(UnsafeURL, match="not a public address"):
        PRODUCTION.check_url(f"http://{literal}/feed.xml")
    assert PRODUCTION.published_url(f"https://{literal}/image.jpg") is None


@pytest.mark.parametrize("text", STILL_PUBLIC)
def test_the_public_addresses_beside_them_are_still_public(text: str) -> None:
    address = ipaddress.ip_address(text)
    assert is_public(address) and PRODUCTION.allows(address)
    literal = f"[{text}]" if ":" in text else text
    assert PRODUCTION.published_url(f"https://{literal}/a.jpg") == f"https://{literal}/a.jpg"


def test_a_multicast_range_can_still_be_allowed_on_purpose() -> None:
    # NEWS_ALLOWED_PRIVATE_HOSTS remains the one switch: refusal is the default, not a wall
    policy = AddressPolicy.parse("239.0.0.0/8")
    assert policy.allows(ipaddress.ip_address("239.1.2.3"))
    assert not policy.allows(ipaddress.ip_address("224.0.0.1"))


@given(st.integers(min_value=int(ipaddress.IPv4Address("224.0.0.0")), max_value=2**32 - 1))
def test_every_ipv4_address_from_multicast_up_is_refused(value: int) -> None:
    # 224.0.0.0/4 multicast, 240.0.0.0/4 reserved, 255.255.255.255: nothing up here is a site
    v4 = ipaddress.IPv4Address(value)
    assert not is_public(v4)
    # nor in any IPv6 form that carries it
    for v6 in (
        ipaddress.IPv6Address(f"::ffff:{v4}"),
        ipaddress.IPv6Address(f"64:ff9b::{v4}"),
        ipaddress.IPv6Address((0x2002 << 112) | (value << 80) | 1),
    ):
        assert not is_public(v6), v6


@given(st.integers(min_value=0, max_value=2**120 - 1))
def test_every_ipv6_multicast_address_is_refused(low: int) -> None:
    assert not is_public(ipaddress.IPv6Address((0xFF << 120) | low))
