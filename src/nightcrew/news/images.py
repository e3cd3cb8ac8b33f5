"""Image hydration: an article page's og:image / twitter:image, fetched without ever letting a
feed steer us at the inside of the network.

Every URL we fetch — the article and each redirect hop — must be http(s) and resolve only to
public addresses (no private, loopback, link-local, multicast or reserved ranges: the cloud
metadata service lives at 169.254.169.254) unless ``allow_private`` is set, which only tests
do. The page read is capped in bytes and time; only the <head> matters.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urljoin, urlsplit

import httpx
from selectolax.parser import HTMLParser

from nightcrew.log import describe_error

MAX_PAGE_BYTES = 512 * 1024
MAX_HOPS = 3
TIMEOUT = httpx.Timeout(8.0, connect=4.0)
IMAGE_META = (
    ('meta[property="og:image"]', "content"),
    ('meta[property="og:image:url"]', "content"),
    ('meta[name="twitter:image"]', "content"),
    ('meta[name="twitter:image:src"]', "content"),
)


class UnsafeURL(ValueError):
    """A URL that must not be fetched; the message says why."""


async def check_public_url(
    url: str, *, allow_private: bool = False, allowed_hosts: frozenset[str] = frozenset()
) -> None:
    """``allowed_hosts`` exempts named hosts (a test's loopback server) and nothing else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL(f"malformed URL {url[:200]!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeURL(f"not an http(s) URL: {url[:200]!r}")
    if allow_private or parts.hostname in allowed_hosts:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            parts.hostname,
            port or (443 if parts.scheme == "https" else 80),
            type=socket.SOCK_STREAM,
        )
    except OSError as exc:
        raise UnsafeURL(f"cannot resolve {parts.hostname}: {exc}") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not _public(address):
            raise UnsafeURL(f"{parts.hostname} resolves to a non-public address ({address})")


NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Global, and so is any IPv4 address an IPv6 one carries (mapped, 6to4, NAT64, compat):
    ``64:ff9b::a9fe:a9fe`` is the metadata service too."""
    if not address.is_global:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [address.ipv4_mapped, address.sixtofour]
        if address in NAT64 or int(address) >> 32 == 0:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return all(e is None or e.is_global for e in embedded)
    return True


def extract_image(html: str, page_url: str) -> str | None:
    tree = HTMLParser(html)
    for selector, attribute in IMAGE_META:
        node = tree.css_first(selector)
        value = node.attributes.get(attribute) if node is not None else None
        if value and value.strip():
            return urljoin(page_url, value.strip())
    return None


async def hydrate_image(
    client: httpx.AsyncClient,
    article_url: str,
    *,
    allow_private: bool = False,
    allowed_hosts: frozenset[str] = frozenset(),
    max_bytes: int = MAX_PAGE_BYTES,
) -> tuple[str | None, str | None]:
    """(image URL, None) when found; (None, reason) when not — never raises for a bad page."""
    url = article_url
    try:
        for _ in range(MAX_HOPS + 1):
            await check_public_url(url, allow_private=allow_private, allowed_hosts=allowed_hosts)
            async with client.stream(
                "GET", url, timeout=TIMEOUT, follow_redirects=False, headers={"Accept": "text/html"}
            ) as response:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    return None, f"the page answered {response.status_code}"
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body.extend(chunk)
                    if len(body) >= max_bytes:
                        break  # the <head> is at the top; the rest is not needed
            image = extract_image(body.decode("utf-8", errors="replace"), url)
            if image is None:
                return None, "no og:image or twitter:image"
            await check_public_url(image, allow_private=allow_private, allowed_hosts=allowed_hosts)
            return image, None
        return None, f"more than {MAX_HOPS} redirects"
    except UnsafeURL as exc:
        return None, f"refused: {exc}"
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        return None, describe_error(exc)
