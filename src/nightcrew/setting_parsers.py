"""Parsers of the settings' own small languages — lists of addresses and networks, a stage
map — used by ``config`` to refuse a bad value at start, and by the modules that act on them.
A leaf: it imports nothing of nightcrew but ``log``, so configuration depends on no adapter."""

from __future__ import annotations

import ipaddress

from nightcrew.log import redact_url_passwords

# the news pipeline's stages, in order: spelled here once (adapters/broker.py uses them)
STAGES = ("fetch", "enrich", "review", "write")
MAX_PREFETCH = 1000

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_trusted_proxies(value: str) -> tuple[IPNetwork, ...]:
    """``NIGHTCREW_TRUSTED_PROXIES``: comma-separated IP addresses and CIDRs; a ValueError names
    the first entry that is not one."""
    networks: list[IPNetwork] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry == "*":
            raise ValueError(
                "'*' would believe every client's claim of its own address; name the proxies' "
                "addresses or networks"
            )
        try:
            network = ipaddress.ip_network(entry.strip("[]"), strict=True)
        except ValueError as exc:
            # The peer is always an address: a host name would silently never match.
            hint = f" ({exc})" if "/" in entry and "://" not in entry else ""
            hint = hint or " (a host name or URL is not accepted)"
            # a URL pasted here may carry a password: never echoed
            shown = redact_url_passwords(entry)
            raise ValueError(f"not an IP address or CIDR: {shown!r}{hint}") from None
        if network.prefixlen == 0:
            raise ValueError(
                f"{entry!r} would believe every client's claim of its own address; name the "
                "proxies' addresses or networks"
            )
        networks.append(network)
    return tuple(networks)


def parse_stage_prefetch(value: str) -> dict[str, int]:
    """NEWS_STAGE_PREFETCH (``fetch=8,enrich=8,review=2,write=16``): each named stage's
    prefetch; stages not named take the worker's --concurrency. A ValueError names the entry
    it cannot read."""
    prefetch: dict[str, int] = {}
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        stage, sep, number = (part.strip() for part in entry.partition("="))
        if not sep or stage not in STAGES:
            raise ValueError(
                f"cannot read {entry!r}: expected stage=N with a stage of {', '.join(STAGES)}"
            )
        if stage in prefetch:
            raise ValueError(f"cannot read {entry!r}: {stage} is given twice")
        try:
            n = int(number)
        except ValueError:
            n = 0
        if not 1 <= n <= MAX_PREFETCH:
            raise ValueError(
                f"cannot read {entry!r}: the prefetch must be a whole number 1..{MAX_PREFETCH}"
            )
        prefetch[stage] = n
    return prefetch


def parse_allowed_hosts(value: str) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    """``NEWS_ALLOWED_PRIVATE_HOSTS``: comma-separated host names, addresses and CIDRs; the
    names (lower case, no trailing dot) and the networks. A ValueError names the first entry
    that is none of them."""
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        label = entry.lower().rstrip(".")
        if not label or any(not (c.isalnum() or c in "-._") for c in label):
            raise ValueError(f"not a host name, address or CIDR: {entry!r}")
        hosts.add(label)
    return frozenset(hosts), tuple(networks)
