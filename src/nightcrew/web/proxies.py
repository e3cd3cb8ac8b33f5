"""Whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` ``serve`` believes.

Anyone can send those headers, so believing them from everyone would let a guesser pick a new
address for each wrong token (defeating the sign-in throttle) and call plain HTTP "https".
``NIGHTCREW_TRUSTED_PROXIES`` names the reverse proxies that set them; from those peers only,
uvicorn's proxy-headers middleware takes the client address (the right-most address in
``X-Forwarded-For`` that is not itself a trusted proxy, so a client cannot prepend one of its
choosing) and the scheme. Empty (the default) believes no one — not even 127.0.0.1, which
uvicorn would otherwise trust by default (or whatever its ``FORWARDED_ALLOW_IPS`` says).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from nightcrew.setting_parsers import IPNetwork


def uvicorn_proxy_options(networks: tuple[IPNetwork, ...]) -> dict[str, Any]:
    """The ``uvicorn.Config`` arguments that believe forwarded headers from ``networks`` only.

    Always explicit: left to itself uvicorn trusts 127.0.0.1 and ::1, or the
    ``FORWARDED_ALLOW_IPS`` environment variable, which nightcrew does not document."""
    allowed: list[str] = []
    for network in networks:
        allowed.append(str(network))
        if isinstance(network, ipaddress.IPv4Network):
            # Listening on "::" (dual stack), an IPv4 proxy's connection arrives as
            # ::ffff:a.b.c.d; the same proxy must be believed either way.
            mapped = f"::ffff:{network.network_address}/{96 + network.prefixlen}"
            allowed.append(str(ipaddress.IPv6Network(mapped)))
    return {"proxy_headers": bool(allowed), "forwarded_allow_ips": allowed}
