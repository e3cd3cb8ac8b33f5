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
from dataclasses import dataclass

from nightcrew.errors import ConfigError

COOKIE = "nightcrew_dashboard"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_SESSION_CONTEXT = b"nightcrew dashboard session v1"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    token: str | None  # None: open, to loopback Host names only
    hosts: frozenset[str] | None = LOOPBACK_HOSTS  # None: any Host (a token guards the page)

    @classmethod
    def for_bind(cls, host: str, token: str | None) -> Access:
        """What ``serve --host HOST`` requires; a ConfigError when it cannot be safe."""
        if is_loopback(host):
            return cls(token=token or None, hosts=LOOPBACK_HOSTS | {host})
        if not token:
            raise ConfigError(
                f"serve --host {host}: the dashboard would be open to the network; set "
                "NIGHTCREW_DASHBOARD_TOKEN (a long random string), or bind to 127.0.0.1"
            )
        return cls(token=token, hosts=None)

    def session_value(self) -> str:
        """The cookie's value: derived from the token, so the cookie is not the token."""
        assert self.token is not None
        return hmac.new(self.token.encode(), _SESSION_CONTEXT, hashlib.sha256).hexdigest()

    def host_allowed(self, host_header: str | None) -> bool:
        if self.hosts is None:
            return True
        if not host_header:
            return False
        name = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
        return name.lower() in self.hosts or host_header.lower() in self.hosts

    def token_matches(self, offered: str) -> bool:
        if self.token is None:
            return True
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def cookie_valid(self, cookie: str | None) -> bool:
        if self.token is None:
            return True
        if not cookie:
            return False
        return hmac.compare_digest(cookie.encode(), self.session_value().encode())
