"""Every range the news worker's address policy refuses, one address in each, in every spelling.

A table, one row per refused range: an address inside it must be refused as itself and — for
an IPv4 range — in every IPv6 disguise that can carry it (IPv4-mapped, SIIT-translated, NAT64
and local-use NAT64, 6to4, Teredo, IPv4-compatible), by the check itself (``is_public``), by
the policy (``AddressPolicy.allows``), for a URL naming it literally, for a name that resolves
to it, and where the socket would be opened (``PinnedBackend``: nothing is connected, the test
opens no connection at all). The table's ranges must be exactly the policy's: the module's own
``NOT_PUBLIC_V6`` and the ranges Python's ``ipaddress`` refuses for it (non-global, shared
address space, multicast, reserved, link-local) — so a range deleted from the module, or one
added without a row here, fails the suite (deleting ``64:ff9b:1::/48`` went unseen).
The public addresses at the ranges' edges must still be allowed.
"""

from __future__ import annotations

import ipaddress
import typing
from typing import Any

import httpcore
import pytest

from nightcrew.adapters.addresses import (
    NAT64,
    NOT_PUBLIC_V6,
    AddressPolicy,
    IPAddress,
    IPNetwork,
    PinnedBackend,
    UnsafeURL,
    is_public,
)
from tests.unit.news.test_address_ranges import assert_refused

PRODUCTION = AddressPolicy.parse("")

# Every IPv4 range the policy refuses → one address inside it.
REFUSED_V4 = {
    "0.0.0.0/8": "0.1.2.3",  # "this network" (0.0.0.0, unspecified, is in it)
    "10.0.0.0/8": "10.20.30.40",
    "100.64.0.0/10": "100.100.100.100",  # shared address space: carrier-grade NAT
    "127.0.0.0/8": "127.0.0.1",
    "169.254.0.0/16": "169.254.169.254",  # link-local: the cloud metadata service
    "172.16.0.0/12": "172.31.255.254",
    "192.0.0.0/29": "192.0.0.1",  # IETF protocol assignments: DS-Lite
    "192.0.0.170/31": "192.0.0.171",  # NAT64 prefix discovery
    "192.0.2.0/24": "192.0.2.1",  # TEST-NET-1
    "192.168.0.0/16": "192.168.1.1",
    "198.18.0.0/15": "198.19.255.254",  # benchmarking
    "198.51.100.0/24": "198.51.100.7",  # TEST-NET-2
    "203.0.113.0/24": "203.0.113.9",  # TEST-NET-3
    "224.0.0.0/4": "239.255.255.250",  # multicast: SSDP
    "240.0.0.0/4": "240.0.0.1",  # reserved (class E)
    "255.255.255.255/32": "255.255.255.255",  # limited broadcast
}
# Every IPv6 range the policy refuses → one address inside it.
REFUSED_V6 = {
    "::/128": "::",
    "::1/128": "::1",
    "::ffff:0:0/96": "::ffff:169.254.169.254",  # IPv4-mapped
    "100::/64": "100::1",  # discard-only
    "2001::/23": "2001:1ff::1",  # IETF protocol assignments (Teredo's 2001::/32 is in it)
    "2001:2::/48": "2001:2::1",  # benchmarking
    "2001:10::/28": "2001:10::1",  # ORCHID
    "2001:db8::/32": "2001:db8::1",  # documentation
    "fc00::/7": "fd12:3456:789a::1",  # unique local
    "fe80::/10": "fe80::1",  # link-local
    "ff00::/8": "ff0e::1",  # multicast, global scope too (is_global in Python 3.11)
    # the module's own (NOT_PUBLIC_V6), each carrying a public IPv4 address: refused whatever
    # it carries
    "64:ff9b:1::/48": "64:ff9b:1:808:8:800::",  # local-use NAT64 (RFC 8215), 8.8.8.8 inside
    "::ffff:0:0:0/96": "::ffff:0:808:808",  # SIIT's IPv4-translated 8.8.8.8
    "fec0::/10": "fec0::1",  # site-local, deprecated
    "3fff::/20": "3fff:fff::1",  # documentation (RFC 9637)
    # IPv6's reserved space outside 2000::/3 and the ranges above (NAT64's 64:ff9b::/96, in
    # ::/8, is refused only for what it carries: see the IPv4 rows)
    "::/8": "0:1::1",
    "100::/8": "1ff::1",
    "200::/7": "200::1",
    "400::/6": "400::1",
    "800::/5": "800::1",
    "1000::/4": "1000::1",
    "4000::/3": "4000::1",
    "6000::/3": "6000::1",
    "8000::/3": "8000::1",
    "a000::/3": "a000::1",
    "c000::/3": "c000::1",
    "e000::/4": "e000::1",
    "f000::/5": "f000::1",
    "f800::/6": "f800::1",
    "fe00::/9": "fe00::1",
}
MODULE_V6 = ("64:ff9b:1::/48", "::ffff:0:0:0/96", "fec0::/10", "3fff::/20")

# Public, beside the refused ranges (and carried in the disguises the check decodes): allowed.
STILL_PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "11.0.0.1",  # past 10.0.0.0/8
    "100.63.255.255",  # just below shared address space
    "100.128.0.1",  # just above it
    "172.32.0.1",  # past 172.16.0.0/12
    "198.20.0.1",  # past 198.18.0.0/15
    "223.255.255.254",  # just below multicast
    "2606:4700::1111",
    "2001:4860:4860::8888",  # in 2001::/16, past 2001::/23
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
]


def _v4(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


def _v6(value: int) -> str:
    return str(ipaddress.IPv6Address(value))


def _local_nat64(v4: int) -> str:
    """RFC 6052's layout under a /48 prefix: two octets, the zero u-octet, two octets."""
    prefix = int(ipaddress.IPv6Address("64:ff9b:1::"))
    return _v6(prefix | ((v4 >> 16) << 64) | ((v4 & 0xFFFF) << 40))


def _teredo(v4: int) -> str:
    """Teredo (2001::/32) with this address as both server and (obfuscated) client."""
    port = 0x1234
    return _v6(
        (0x20010000 << 96)
        | (v4 << 64)
        | (0x8000 << 48)
        | ((port ^ 0xFFFF) << 32)
        | (v4 ^ 0xFFFFFFFF)
    )


# Each IPv6 spelling of an IPv4 address that some decoder (ours, a NAT64 gateway, a 6to4
# relay, a Teredo server, an old dual stack) turns back into it.
DISGUISES: dict[str, typing.Callable[[int], str]] = {
    "IPv4-mapped": lambda v: _v6((0xFFFF << 32) | v),
    "SIIT-translated": lambda v: _v6((0xFFFF << 48) | v),
    "NAT64": lambda v: _v6(int(NAT64.network_address) | v),
    "local-use NAT64": _local_nat64,
    "6to4": lambda v: _v6((0x2002 << 112) | (v << 80) | 1),
    "Teredo": _teredo,
    "IPv4-compatible": lambda v: _v6(v),
}

CASES = [
    *[pytest.param(net, text, id=f"{net} IPv4 {text}") for net, text in REFUSED_V4.items()],
    *[
        pytest.param(net, spell(_v4(text)), id=f"{net} {form} {spell(_v4(text))}")
        for net, text in REFUSED_V4.items()
        for form, spell in DISGUISES.items()
    ],
    *[pytest.param(net, text, id=f"{net} IPv6 {text}") for net, text in REFUSED_V6.items()],
]


def _python_refuses() -> set[IPNetwork]:
    """The ranges ``is_public`` refuses through Python's ``ipaddress`` (3.11): not global (its
    private networks and shared address space), multicast, reserved, link-local."""
    v4: Any = vars(ipaddress)["_IPv4Constants"]
    v6: Any = vars(ipaddress)["_IPv6Constants"]
    return {
        *v4._private_networks,
        v4._public_network,  # 100.64.0.0/10, which is_global excludes
        v4._multicast_network,
        v4._reserved_network,
        v4._linklocal_network,
        v4._loopback_network,
        *v6._private_networks,
        *v6._reserved_networks,
        v6._multicast_network,
        v6._linklocal_network,
    }


def test_the_table_has_a_row_for_exactly_the_ranges_the_policy_refuses() -> None:
    tested = {ipaddress.ip_network(net) for net in (*REFUSED_V4, *REFUSED_V6)}
    module = {ipaddress.ip_network(net) for net in MODULE_V6}
    assert set(NOT_PUBLIC_V6) == module, "NOT_PUBLIC_V6 changed: add or remove its row here"
    policy = _python_refuses() | set(NOT_PUBLIC_V6)
    assert tested == policy, (
        f"refused but without a row: {sorted(map(str, policy - tested))}; "
        f"a row for no refused range: {sorted(map(str, tested - policy))}"
    )
    # the one carve-out from IPv6's reserved space: NAT64, judged by the address it carries
    assert ipaddress.ip_network("64:ff9b::/96") == NAT64


def test_each_rows_address_is_inside_its_range_and_no_exception_of_it() -> None:
    exceptions = [
        *vars(vars(ipaddress)["_IPv4Constants"]).get("_private_networks_exceptions", ()),
        *vars(vars(ipaddress)["_IPv6Constants"]).get("_private_networks_exceptions", ()),
    ]
    for net, text in (*REFUSED_V4.items(), *REFUSED_V6.items()):
        address = ipaddress.ip_address(text)
        assert address in ipaddress.ip_network(net), (net, text)
        assert not any(address in e for e in exceptions), (net, text)


def test_each_disguise_carries_the_address_it_disguises() -> None:
    sample = ipaddress.IPv4Address("169.254.169.254")
    v = int(sample)
    spelled = {form: ipaddress.IPv6Address(spell(v)) for form, spell in DISGUISES.items()}
    assert spelled["IPv4-mapped"].ipv4_mapped == sample
    assert spelled["6to4"].sixtofour == sample
    assert spelled["Teredo"].teredo == (sample, sample)
    assert spelled["NAT64"] in NAT64
    assert spelled["local-use NAT64"] == ipaddress.IPv6Address("64:ff9b:1:a9fe:a9:fe00::")
    for form in ("NAT64", "IPv4-compatible", "SIIT-translated"):
        assert int(spelled[form]) & 0xFFFFFFFF == v, form
    assert str(spelled["IPv4-compatible"]) == "::a9fe:a9fe"
    assert str(spelled["SIIT-translated"]) == "::ffff:0:a9fe:a9fe"


class _NoConnecting(httpcore.AsyncNetworkBackend):
    """Where PinnedBackend would connect: records the attempt, connects nothing."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.attempts.append(host)
        raise httpcore.ConnectError("this test connects nowhere")


def _resolving_to(address: IPAddress) -> AddressPolicy:
    async def resolver(host: str, port: int) -> list[str]:
        return [str(address)]

    return AddressPolicy.parse("", resolver=resolver)


@pytest.mark.parametrize(("net", "text"), CASES)
async def test_an_address_in_every_refused_range_is_refused_in_every_spelling(
    net: str, text: str
) -> None:
    assert_refused(text)
    address = ipaddress.ip_address(text)
    # a public-looking name that resolves to it (DNS rebinding) is refused at the socket
    policy = _resolving_to(address)
    with pytest.raises(UnsafeURL, match="non-public address"):
        await policy.resolve("feed.example", 443)
    inner = _NoConnecting()
    with pytest.raises(UnsafeURL):
        await PinnedBackend(policy, inner).connect_tcp("feed.example", 443)
    assert inner.attempts == []


@pytest.mark.parametrize("text", STILL_PUBLIC)
async def test_the_public_addresses_at_their_edges_are_allowed(text: str) -> None:
    address = ipaddress.ip_address(text)
    assert is_public(address) and PRODUCTION.allows(address)
    literal = f"[{text}]" if ":" in text else text
    assert PRODUCTION.check_host(literal) == address
    assert await _resolving_to(address).resolve("feed.example", 443) == [text]
    inner = _NoConnecting()
    with pytest.raises(httpcore.ConnectError):
        await PinnedBackend(_resolving_to(address), inner).connect_tcp("feed.example", 443)
    assert inner.attempts == [text]  # handed on to connect (here: to nothing)
