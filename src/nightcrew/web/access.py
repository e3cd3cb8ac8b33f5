"""Who may read the dashboard.

Bound to loopback (``serve``'s default) the dashboard is open to this machine — but only under
a loopback Host name, so a web page elsewhere cannot reach it by rebinding its own DNS name to
127.0.0.1. Bound to any other address it needs ``NIGHTCREW_DASHBOARD_TOKEN`` (``serve`` refuses
to start without it): the operator enters it once on /login and keeps, in an HttpOnly,
SameSite=Strict cookie, a session signed with a key derived from it (not the token itself): the
session carries its issue time and ends after ``SESSION_MAX_AGE_SECONDS``, and a new token ends
every session at once. Every check is in constant time. The dashboard changes nothing; its two
POSTs (sign in, sign out) refuse a cross-site ``Origin`` all the same.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from nightcrew.errors import ConfigError

if TYPE_CHECKING:  # the command line imports this module: no web framework at its start
    from starlette.requests import Request
    from starlette.responses import Response

COOKIE = "nightcrew_dashboard"
DEVICE_COOKIE = "nightcrew_device"
MIN_TOKEN_LENGTH = 32


def check_secret(name: str, value: str | None) -> str | None:
    """A secret that guards a door: None when unset or empty (the door is closed), else at
    least MIN_TOKEN_LENGTH characters that are not blank — a ConfigError naming it if not."""
    if not value:
        return None
    strong = sum(1 for c in value if not c.isspace())
    if strong < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"{name} has {strong} non-blank characters; use at least {MIN_TOKEN_LENGTH} "
            "(e.g. `openssl rand -hex 32`)"
        )
    return value


_TOKEN_CONTEXT = b"nightcrew dashboard session v1"
_SESSION_KEY_CONTEXT = b"nightcrew dashboard session key v3"
_DEVICE_KEY_CONTEXT = b"nightcrew dashboard known device v1"
# A night shift and its handover: a copied cookie is worth nothing after this long.
SESSION_MAX_AGE_SECONDS = 8 * 3600
# A session issued by a replica whose clock runs a little ahead is still good here.
SESSION_CLOCK_SKEW_SECONDS = 60
# A browser that signed in within this long goes first at the sign-in throttle (throttle.py).
DEVICE_MAX_AGE_SECONDS = 90 * 24 * 3600
_SESSION = re.compile(r"^(?P<issued>[0-9]{1,12})\.(?P<nonce>[0-9a-f]{32})\.(?P<mac>[0-9a-f]{64})$")
# A Host header as browsers send it: a name or an IPv4 address, or an IPv6 address in
# brackets, then an optional port — nothing else (no userinfo, no second colon).
_HOST = re.compile(r"^(?P<name>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?$")


def _normal(name: str) -> str | None:
    """A host name as compared: lower case, no trailing dot, IP addresses canonical."""
    name = name.strip("[]").rstrip(".").lower()
    if not name:
        return None
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def host_name(host_header: str | None) -> str | None:
    """The name of a well-formed Host header, normalised; None when it is not well formed."""
    found = _HOST.match(host_header or "")
    return _normal(found["name"]) if found else None


def is_loopback(host: str) -> bool:
    name = _normal(host)
    if name == "localhost":
        return True
    try:
        return name is not None and ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

Resolve = Callable[..., list[tuple[Any, ...]]]


def _resolves_to_loopback_only(host: str, resolve: Resolve) -> bool:
    if _normal(host) is None:
        return False
    try:
        ipaddress.ip_address(_normal(host) or "")
        return False  # an address is what it is (is_loopback said)
    except ValueError:
        pass
    try:
        found = resolve(host, None)
    except (OSError, UnicodeError):
        return False  # the bind itself will say it cannot listen there
    addresses = {info[4][0] for info in found}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


@dataclass(frozen=True)
class Access:
    token: str | None  # None: open, to loopback Host names only
    hosts: frozenset[str] | None = LOOPBACK_HOSTS  # None: any Host (a token guards the page)

    @classmethod
    def for_bind(
        cls, host: str, token: str | None, *, resolve: Resolve = socket.getaddrinfo
    ) -> Access:
        """What ``serve --host HOST`` requires; a ConfigError when it cannot be safe. A name is
        classified by the addresses it resolves to, as the bind will: one that resolves to
        loopback only is a loopback bind, Host check included (``--host myname`` with
        ``myname`` in /etc/hosts as 127.0.1.1 turned the check off)."""
        token = check_secret("NIGHTCREW_DASHBOARD_TOKEN", token)
        if is_loopback(host) or _resolves_to_loopback_only(host, resolve):
            return cls(token=token or None, hosts=LOOPBACK_HOSTS | {_normal(host) or host})
        if not token:
            raise ConfigError(
                f"serve --host {host}: the dashboard would be open to the network; set "
                "NIGHTCREW_DASHBOARD_TOKEN (at least 32 random characters, e.g. "
                "`openssl rand -hex 32`), or bind to 127.0.0.1"
            )
        return cls(token=token, hosts=None)

    def session_value(self, now: float) -> str:
        """The cookie's value, issued at ``now`` (unix seconds): ``ISSUED.NONCE.MAC``, signed
        with a key derived from the token, so the cookie is not the token and a new token voids
        it; the random nonce makes two sessions issued in the same second two cookies."""
        return self._signed(_SESSION_KEY_CONTEXT, now)

    def device_value(self, now: float) -> str:
        """The known-device cookie's value, given at a successful sign-in: the same form as a
        session's under another key, so neither passes for the other. It opens nothing; it
        only puts this browser's next sign-in first at the throttle."""
        return self._signed(_DEVICE_KEY_CONTEXT, now)

    def device_id(self, cookie: str | None, now: float) -> str | None:
        """The nonce of a device cookie this token signed within ``DEVICE_MAX_AGE_SECONDS``
        (the device's identity at the sign-in throttle); None for anything else."""
        if self.token is None or not self._verify(
            _DEVICE_KEY_CONTEXT, cookie, now, DEVICE_MAX_AGE_SECONDS
        ):
            return None
        return (cookie or "").split(".")[1]

    def _signed(self, context: bytes, now: float) -> str:
        assert self.token is not None
        issued = int(now)
        nonce = secrets.token_hex(16)
        return f"{issued}.{nonce}.{self._mac(context, self.token, issued, nonce)}"

    def _verify(self, context: bytes, cookie: str | None, now: float, max_age: float) -> bool:
        assert self.token is not None
        found = _SESSION.match(cookie or "")
        if found is None:
            return False
        issued = int(found["issued"])
        mac = self._mac(context, self.token, issued, found["nonce"])
        signed = hmac.compare_digest(found["mac"], mac)
        fresh = now - max_age < issued <= now + SESSION_CLOCK_SKEW_SECONDS
        return signed and fresh

    def host_allowed(self, host_header: str | None) -> bool:
        if self.hosts is None:
            return True
        return host_name(host_header) in self.hosts

    def _derive(self, token: str) -> str:
        return hmac.new(token.encode(), _TOKEN_CONTEXT, hashlib.sha256).hexdigest()

    def _mac(self, context: bytes, token: str, issued: int, nonce: str) -> str:
        key = hmac.new(token.encode(), context, hashlib.sha256).digest()
        return hmac.new(key, f"{issued}.{nonce}".encode(), hashlib.sha256).hexdigest()

    def token_matches(self, offered: str) -> bool:
        """Compared as fixed-length digests, so the time taken says nothing of the length."""
        if self.token is None:
            return True
        return hmac.compare_digest(self._derive(offered), self._derive(self.token))

    def bearer_valid(self, header: str | None) -> bool:
        """``Authorization: Bearer <token>`` — for the JSON endpoints' scripts."""
        if self.token is None:
            return True
        scheme, _, offered = (header or "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(offered.strip())

    def cookie_valid(self, cookie: str | None, now: float) -> bool:
        """A session this token signed, issued at most ``SESSION_MAX_AGE_SECONDS`` before
        ``now`` (unix seconds) and not in the future."""
        if self.token is None:
            return True
        return self._verify(_SESSION_KEY_CONTEXT, cookie, now, SESSION_MAX_AGE_SECONDS)


def same_origin(origin: str | None, referer: str | None, host_header: str | None) -> bool:
    """Whether a POST came from a page of this site: its ``Origin`` (else its ``Referer``)
    names the host and port the request was sent to. Browsers send ``Origin`` with every form
    POST; a request with neither is not a browser's, and a forged cross-site request needs a
    browser, so it passes. ``Origin: null`` (a sandboxed frame, a redirect) does not."""
    claimed = origin if origin is not None else referer
    if claimed is None:
        return True
    try:
        parts = urlsplit(claimed.strip())
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    host = _HOST.match(host_header or "")
    if host is None:
        return False
    default = 443 if parts.scheme == "https" else 80
    wanted_port = int(host["port"]) if host["port"] else default
    return _normal(parts.hostname) == _normal(host["name"]) and (port or default) == wanted_port


def secure_cookie(scheme: str, client_host: str | None) -> bool:
    """Whether the session cookie is ``Secure``: always, except over plain HTTP from this
    machine (a developer on http://127.0.0.1). A TLS front end on another machine talks plain
    HTTP to us, and its cookie must still never travel unencrypted. ``scheme`` and
    ``client_host`` are what the request claims only when it came from one of
    ``NIGHTCREW_TRUSTED_PROXIES`` (web/proxies.py): then ``X-Forwarded-Proto: https`` makes
    the cookie Secure, and a forwarded client elsewhere does too. Without that setting a front
    end on this machine looks like a developer, and its users' cookies are not Secure."""
    return scheme == "https" or client_host is None or not is_loopback(client_host)


def set_strict_cookie(
    response: Response,
    request: Request,
    name: str,
    value: str,
    *,
    path: str = "/",
    max_age: int | None = None,
) -> None:
    """Every cookie the dashboard sets: unreadable by scripts, never sent by another site's
    page, and ``Secure`` as ``secure_cookie`` says."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path=path,
    )


def delete_strict_cookie(response: Response, request: Request, name: str) -> None:
    """Ends a cookie ``set_strict_cookie`` set on ``/``, with the same attributes."""
    response.delete_cookie(
        name, path="/", httponly=True, samesite="strict", secure=_secure(request)
    )


def _secure(request: Request) -> bool:
    return secure_cookie(request.url.scheme, request.client.host if request.client else None)
