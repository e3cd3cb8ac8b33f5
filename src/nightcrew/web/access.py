"""Who may read the dashboard.

Bound to loopback (``serve``'s default) the dashboard is open to this machine — but only under
a loopback Host name, so a web page elsewhere cannot reach it by rebinding its own DNS name to
127.0.0.1. Bound to any other address it needs ``NIGHTCREW_DASHBOARD_TOKEN`` (``serve`` refuses
to start without it): the operator enters it once on /login and keeps, in an HttpOnly,
SameSite=Strict cookie, a value derived from it (not the token itself). Every check is in
constant time. The dashboard changes nothing, so there is nothing for a forged request to do.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from dataclasses import dataclass

from nightcrew.errors import ConfigError

COOKIE = "nightcrew_dashboard"
MIN_TOKEN_LENGTH = 32
_SESSION_CONTEXT = b"nightcrew dashboard session v1"
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


@dataclass(frozen=True)
class Access:
    token: str | None  # None: open, to loopback Host names only
    hosts: frozenset[str] | None = LOOPBACK_HOSTS  # None: any Host (a token guards the page)

    @classmethod
    def for_bind(cls, host: str, token: str | None) -> Access:
        """What ``serve --host HOST`` requires; a ConfigError when it cannot be safe."""
        if token and len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"NIGHTCREW_DASHBOARD_TOKEN is {len(token)} characters; use at least "
                f"{MIN_TOKEN_LENGTH} (e.g. `openssl rand -hex 32`)"
            )
        if is_loopback(host):
            return cls(token=token or None, hosts=LOOPBACK_HOSTS | {_normal(host) or host})
        if not token:
            raise ConfigError(
                f"serve --host {host}: the dashboard would be open to the network; set "
                "NIGHTCREW_DASHBOARD_TOKEN (at least 32 random characters, e.g. "
                "`openssl rand -hex 32`), or bind to 127.0.0.1"
            )
        return cls(token=token, hosts=None)

    def session_value(self) -> str:
        """The cookie's value: derived from the token, so the cookie is not the token."""
        assert self.token is not None
        return self._derive(self.token)

    def host_allowed(self, host_header: str | None) -> bool:
        if self.hosts is None:
            return True
        return host_name(host_header) in self.hosts

    def _derive(self, token: str) -> str:
        return hmac.new(token.encode(), _SESSION_CONTEXT, hashlib.sha256).hexdigest()

    def token_matches(self, offered: str) -> bool:
        """Compared as fixed-length digests, so the time taken says nothing of the length."""
        if self.token is None:
            return True
        return hmac.compare_digest(self._derive(offered), self.session_value())

    def bearer_valid(self, header: str | None) -> bool:
        """``Authorization: Bearer <token>`` — for the JSON endpoints' scripts."""
        if self.token is None:
            return True
        scheme, _, offered = (header or "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(offered.strip())

    def cookie_valid(self, cookie: str | None) -> bool:
        if self.token is None:
            return True
        if not cookie:
            return False
        return hmac.compare_digest(cookie.encode(), self.session_value().encode())
