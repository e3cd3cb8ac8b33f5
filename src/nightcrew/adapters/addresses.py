"""One address policy for every fetch the news worker makes, and the HTTP client that keeps it.

Feeds, their redirects, article pages and images are all untrusted addresses: any of them may
point at the inside of the network (the cloud metadata service at 169.254.169.254, a database
on 10.x, the machine itself). The policy allows public addresses only, plus what
``NEWS_ALLOWED_PRIVATE_HOSTS`` names (host names, addresses, CIDRs — a developer's loopback
feeds). It is enforced where the socket is opened, not where the URL is read: the client's
network backend resolves the name once, checks every answer, and connects to a checked address
— so every redirect hop is checked, and a name that resolves to a public address for the check
and to loopback a moment later (DNS rebinding) cannot steer the connection.

A URL that is only published (a feed's image, an article's og:image) is never fetched here; it
is checked without DNS: http(s), no credentials, no internal name, no non-public address
literal in any spelling.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
import typing
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Protocol
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpcore
import httpx

from nightcrew.adapters.decoding import ACCEPT_ENCODING, BoundedDecoder
from nightcrew.adapters.tls import tls_context
from nightcrew.errors import FetchError, NightcrewError
from nightcrew.log import describe_error
from nightcrew.setting_parsers import parse_allowed_hosts

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]

NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IPv6 ranges that Python's is_global still calls global (3.11): local-use NAT64 (RFC 8215),
# SIIT's IPv4-translated addresses, deprecated site-local, documentation (RFC 9637).
NOT_PUBLIC_V6 = tuple(
    ipaddress.ip_network(n) for n in ("64:ff9b:1::/48", "::ffff:0:0:0/96", "fec0::/10", "3fff::/20")
)
# Most URLs a feed links are already in the form urlsplit/urlunsplit would give them: http(s),
# a lower-case ASCII host without port or credentials, a path and query of RFC 3986 characters,
# no fragment (nor an empty "?", which the join would drop). Such a URL is its own normal form,
# and checking it needs only its host: ~10 µs less per item, 10,000 items a run
# (tests/unit/news/test_plain_urls.py holds it to the split-and-join's answer).
_URL_CHARS = r"A-Za-z0-9\-._~!$&'()*+,;=:@%/"
PLAIN_URL = re.compile(
    rf"(?P<scheme>https?)://(?P<host>[a-z0-9.-]+)(?P<path>/[{_URL_CHARS}]*)?"
    rf"(?P<query>\?[{_URL_CHARS}?]+)?",
    re.ASCII,
)

# Names that never mean a public site, whatever a resolver answers for them.
INTERNAL_NAMES = ("localhost",)
INTERNAL_SUFFIXES = (".localhost", ".local", ".internal", ".home.arpa", ".localdomain")


class UnsafeURL(NightcrewError, ValueError):
    """A URL that must not be fetched or published; the message says why."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_public(address: IPAddress) -> bool:
    """Global unicast, and so is any IPv4 address an IPv6 one carries (mapped, 6to4, NAT64,
    compat): ``64:ff9b::a9fe:a9fe`` is the metadata service too. Python 3.11's ``is_global``
    calls multicast global (224.0.0.0/4, ff0e::/16): a feed that names one would have us send
    to a group on the local network, so multicast, and every reserved or unspecified address,
    is refused here whatever ``is_global`` says."""
    if (
        not address.is_global
        or address.is_multicast
        or address.is_unspecified
        or address.is_loopback
        or address.is_link_local
    ):
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return not address.is_reserved
    if any(address in network for network in NOT_PUBLIC_V6):
        return False
    # IPv6's reserved ranges hold NAT64's 64:ff9b::/96, which is public when what it carries is
    if address.is_reserved and address not in NAT64:
        return False
    embedded = [address.ipv4_mapped, address.sixtofour]
    if address in NAT64 or int(address) >> 32 == 0:
        embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return all(e is None or is_public(e) for e in embedded)


def address_literal(host: str) -> IPAddress | None:
    """The address a host names literally, or None for a name. Spellings other than the
    canonical dotted quad (``0x7f000001``, ``2130706433``, ``0177.0.0.1``, ``127.1``) are
    refused: resolvers read them as addresses, and no honest site is linked that way."""
    if host[:1].isalpha() and ":" not in host:
        return None  # a name: no address spelling starts with a letter (hex ones start "0x")
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
    except OSError:
        return None
    raise UnsafeURL(f"{host!r} is an address in a non-canonical spelling")


def _internal_name(host: str) -> bool:
    name = host.lower().rstrip(".")
    return name in INTERNAL_NAMES or name.endswith(INTERNAL_SUFFIXES)


@dataclass(frozen=True, kw_only=True)
class AddressPolicy:
    """Public addresses only, except the hosts and networks a developer allowed."""

    allowed_hosts: frozenset[str] = frozenset()
    allowed_networks: tuple[IPNetwork, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False)

    @classmethod
    def parse(cls, value: str, *, resolver: Resolver = system_resolver) -> AddressPolicy:
        """``NEWS_ALLOWED_PRIVATE_HOSTS``: comma-separated host names, addresses and CIDRs."""
        hosts, networks = parse_allowed_hosts(value)
        return cls(allowed_hosts=hosts, allowed_networks=networks, resolver=resolver)

    def allows(self, address: IPAddress) -> bool:
        if is_public(address):
            return True
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address.version == n.version and address in n for n in self.allowed_networks)

    def check_host(self, host: str) -> IPAddress | None:
        """What can be said of a host without DNS: an allowed literal, or a name that is
        not internal (unless allowed by name). Returns the literal address, if any. A host a
        browser would rewrite before resolving (percent-escapes, a backslash, full-width
        digits, a trailing dot) is checked as the browser would read it, or refused."""
        if any(c in host for c in "%\\@") or not host.isascii():
            folded = unicodedata.normalize("NFKC", host)
            if any(c in folded for c in "%\\@"):
                raise UnsafeURL(f"{host[:100]!r} is not a plain host name")
            try:  # an internationalised name is what its punycode spelling names
                host = folded.encode("idna").decode("ascii")
            except UnicodeError as exc:
                raise UnsafeURL(f"{host[:100]!r} is not a plain host name") from exc
        host = host.rstrip(".") or host
        literal = address_literal(host)
        if literal is not None:
            if not self.allows(literal):
                raise UnsafeURL(f"{host} is not a public address")
            return literal
        if _internal_name(host) and host.lower().rstrip(".") not in self.allowed_hosts:
            raise UnsafeURL(f"{host} is an internal name")
        return None

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for host, every one of them checked. One non-public
        answer refuses them all: a rebinding resolver often answers both kinds."""
        literal = self.check_host(host)
        if literal is not None:
            return [str(literal)]
        try:
            answers = await self.resolver(host, port)
        except OSError as exc:
            raise UnsafeURL(f"cannot resolve {host}: {exc}") from exc
        if not answers:
            raise UnsafeURL(f"{host} resolves to no address")
        if host.lower().rstrip(".") in self.allowed_hosts:
            return answers
        for answer in answers:
            if not self.allows(ipaddress.ip_address(answer)):
                raise UnsafeURL(f"{host} resolves to a non-public address ({answer})")
        return answers

    def check_url(self, url: str) -> tuple[SplitResult, str]:
        """Scheme, host and port of a URL we are about to fetch (DNS comes at connect);
        returns the split URL and its netloc without credentials."""
        try:
            parts = urlsplit(url)
            host, port = split_host(parts)
        except ValueError as exc:
            raise UnsafeURL(f"malformed URL {url[:200]!r}: {exc}") from exc
        if parts.scheme.lower() not in ("http", "https") or not host:
            raise UnsafeURL(f"not an http(s) URL: {url[:200]!r}")
        self.check_host(host)
        return parts, join_host(host, port)

    def published_url(self, url: str) -> str | None:
        """A URL we publish but never fetch (an image), checked without DNS and without its
        credentials; None when it is not safe to hand to a reader's browser."""
        url = url.strip()
        plain = PLAIN_URL.fullmatch(url)
        if plain is not None:  # already as urlunsplit would put it: only its host to check
            try:
                self.check_host(plain["host"])
            except UnsafeURL:
                return None
            return url
        return self.published_url_split(url)

    def published_url_split(self, url: str) -> str | None:
        """``published_url`` for any URL (a split and a join; the fast path's reference)."""
        try:
            parts, netloc = self.check_url(url)
        except UnsafeURL:
            return None
        return urlunsplit((parts.scheme.lower(), netloc, parts.path, parts.query, parts.fragment))


def split_host(parts: SplitResult) -> tuple[str, int | None]:
    """(lower-cased host, port) of a split URL, read once (``SplitResult.hostname`` and
    ``.port`` each parse the netloc again); ValueError for a port that is not one."""
    hostinfo = parts.netloc.rpartition("@")[2]
    if hostinfo.startswith("["):
        host, _, rest = hostinfo[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = hostinfo.partition(":")
    if not port_text:
        return host.lower(), None
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"port out of range or not a number: {port_text[:20]!r}")
    return host.lower(), int(port_text)


def join_host(host: str, port: int | None) -> str:
    """A netloc from a host and port — without credentials: ``user:secret@`` never leaves."""
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}" if port is not None else host


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Opens a TCP connection only to an address the policy checked, resolving each name once
    per connection. ``inner`` does the actual connecting (tests give one that records instead
    of connecting)."""

    def __init__(
        self, policy: AddressPolicy, inner: httpcore.AsyncNetworkBackend | None = None
    ) -> None:
        self._policy = policy
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._policy.resolve(host, port)
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise UnsafeURL("unix sockets are not fetched")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)
# One pool per lane (PolicyHttp says why): the inline run has 16 fetches in flight at most.
CLIENT_LANES = 8


class PolicyTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with the pinned backend underneath and no proxy from the
    environment (a proxy would do its own resolving, past the policy)."""

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        inner: httpcore.AsyncNetworkBackend | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(verify=tls_context(trust_env=False), trust_env=False, limits=limits)
        # httpx has no public hook for a network backend; the pool it built is replaced by the
        # same pool over ours (tests/integration/news/test_addresses.py proves it is used).
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=tls_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=PinnedBackend(policy, inner),
        )


MAX_REDIRECTS = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchLimits:
    """What one GET may take: per-read and connect timeouts (the caller keeps the total
    budget), how many body bytes — decoded bytes, counted as they stream, so a compressed body
    cannot inflate past the cap —, whether redirects are followed (each hop still checked by
    the policy). Past ``max_bytes``, "fail" marks the response ``too_large`` (a feed must be
    whole) and "truncate" keeps the first ``max_bytes`` (a page's <head> is at the top)."""

    max_bytes: int
    read_seconds: float
    connect_seconds: float
    follow_redirects: bool = False
    over_size: Literal["fail", "truncate"] = "fail"


@dataclass(frozen=True, kw_only=True, slots=True)
class Response:
    """One answer: the final URL (after redirects), headers with lower-cased names, and the
    body — read only for a 2xx answer."""

    status: int
    url: str
    headers: Mapping[str, str]
    body: bytes = b""
    too_large: bool = False

    @property
    def redirect_to(self) -> str | None:
        """The Location of a redirect answer, as sent (relative or not); None otherwise."""
        if self.status in (301, 302, 303, 307, 308):
            return self.headers.get("location")
        return None


class UntrustedHttp(Protocol):
    """GETs of untrusted addresses (feeds, their redirects, article pages), under the address
    policy. Raises UnsafeURL for an address the policy refuses, FetchError for anything
    else that keeps an answer from coming."""

    async def get(
        self, url: str, *, limits: FetchLimits, headers: Mapping[str, str] | None = None
    ) -> Response: ...


class PolicyHttp:
    """The one implementation: httpx over the policy's pinned transport; httpx's and
    httpcore's errors end here, as FetchError.

    The requests are spread over ``len(clients)`` clients (lanes), each with a pool of its
    own, a request going to the lane with the fewest in flight. httpcore's pool walks every
    connection (and polls every idle socket) for every waiting request each time a request
    starts or ends (encode/httpcore#1035): one pool under the inline run's 16 fetches at once
    spent most of a loopback GET on that bookkeeping — 200 feeds took 0.45-0.8 s through one
    client and 0.16 s through 16 (bench.news)."""

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        if not clients:
            raise ValueError("PolicyHttp needs at least one client")
        self._clients = clients
        self._in_flight = [0] * len(clients)
        self._opened = contextlib.AsyncExitStack()

    async def __aenter__(self) -> PolicyHttp:
        async with contextlib.AsyncExitStack() as opening:
            for client in self._clients:
                await opening.enter_async_context(client)
            # every client closes on exit, even when closing another one fails
            self._opened = opening.pop_all()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._opened.__aexit__(kind, value, traceback)

    def _lane(self) -> int:
        return min(range(len(self._clients)), key=self._in_flight.__getitem__)

    async def get(
        self, url: str, *, limits: FetchLimits, headers: Mapping[str, str] | None = None
    ) -> Response:
        timeout = httpx.Timeout(limits.read_seconds, connect=limits.connect_seconds)
        lane = self._lane()
        self._in_flight[lane] += 1
        try:
            async with self._clients[lane].stream(
                "GET",
                url,
                headers=dict(headers or {}),
                timeout=timeout,
                follow_redirects=limits.follow_redirects,
            ) as answer:
                return await _read(answer, limits)
        except UnsafeURL:
            raise  # a ValueError too: the policy's refusal is not a network failure
        except httpx.TooManyRedirects as exc:
            raise FetchError(f"more than {MAX_REDIRECTS} redirects") from exc
        except (httpx.HTTPError, httpcore.TimeoutException, httpx.InvalidURL, ValueError) as exc:
            raise FetchError(describe_error(exc)) from exc
        finally:
            self._in_flight[lane] -= 1


async def _read(answer: httpx.Response, limits: FetchLimits) -> Response:
    head = Response(
        status=answer.status_code,
        url=str(answer.url),
        headers={k.lower(): v for k, v in answer.headers.items()},
    )
    if not 200 <= head.status < 300:
        return head  # nobody reads an error page or a redirect's body
    max_bytes, truncate = limits.max_bytes, limits.over_size == "truncate"
    declared = head.headers.get("content-length")
    if not truncate and declared and declared.isdigit() and int(declared) > max_bytes:
        return Response(status=head.status, url=head.url, headers=head.headers, too_large=True)
    # decoded here, not by httpx: its decoder inflates a whole chunk at once, past any cap
    decoder = BoundedDecoder(head.headers.get("content-encoding"))
    body = bytearray()
    async for raw in answer.aiter_raw():
        # one byte past the cap tells "too large" from "exactly the cap"
        body += decoder.feed(raw, max_bytes + 1 - len(body))
        if len(body) > max_bytes:
            break
    else:
        while decoder.pending and len(body) <= max_bytes:
            more = decoder.feed(b"", max_bytes + 1 - len(body))
            if not more:
                break
            body += more
    if len(body) > max_bytes:
        if not truncate:
            return Response(status=head.status, url=head.url, headers=head.headers, too_large=True)
        del body[max_bytes:]
    return Response(status=head.status, url=head.url, headers=head.headers, body=bytes(body))


def new_client(
    policy: AddressPolicy,
    *,
    inner: httpcore.AsyncNetworkBackend | None = None,
    lanes: int = CLIENT_LANES,
) -> PolicyHttp:
    """The client for untrusted addresses (feeds, article pages): every connection through
    the policy, at most MAX_REDIRECTS redirects, no proxy from the environment, the
    connections of DEFAULT_LIMITS shared among ``lanes`` pools. An async context manager:
    ``async with new_client(policy) as http``."""
    return PolicyHttp(
        [
            httpx.AsyncClient(
                transport=PolicyTransport(policy, inner=inner, limits=_lane_limits(lane, lanes)),
                max_redirects=MAX_REDIRECTS,
                # only what BoundedDecoder can undo under a cap (httpx would add br or zstd
                # whenever their packages happen to be installed)
                headers={"User-Agent": "nightcrew", "Accept-Encoding": ACCEPT_ENCODING},
                trust_env=False,
            )
            for lane in range(lanes)
        ]
    )


def _lane_limits(lane: int, lanes: int) -> httpx.Limits:
    """Lane ``lane``'s share of DEFAULT_LIMITS: the totals split as evenly as they go, so the
    lanes together hold exactly as many connections as one pool would."""

    def share(total: int | None) -> int | None:
        if total is None:
            return None
        return max(1, total // lanes + (1 if lane < total % lanes else 0))

    return httpx.Limits(
        max_connections=share(DEFAULT_LIMITS.max_connections),
        max_keepalive_connections=share(DEFAULT_LIMITS.max_keepalive_connections),
        keepalive_expiry=DEFAULT_LIMITS.keepalive_expiry,
    )
