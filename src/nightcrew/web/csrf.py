"""The dashboard's CSRF tokens: one per browser session, in every action's form.

A page gives the browser a random value in its own cookie (HttpOnly, SameSite=Strict) and puts
into each form an HMAC of it — and of the sign-in session's cookie, when there is one, so a new
sign-in is a new token. An action compares the form's token with the one its cookies make, in
constant time. Another site can make a browser send our cookies (SameSite aside) but can read
neither them nor our pages, so it cannot know the token. The key is derived from
NIGHTCREW_DASHBOARD_TOKEN (every replica behind one front end agrees), else drawn at start: open
on loopback there is one process, and a restart only costs a reload.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

CSRF_COOKIE = "nightcrew_csrf"
CSRF_FIELD = "csrf"
_KEY_CONTEXT = b"nightcrew dashboard csrf v1"
# secrets.token_urlsafe(32): 43 URL-safe characters; anything else is not a value we made.
_VALUE = re.compile(r"^[A-Za-z0-9_-]{43}$")


class Csrf:
    def __init__(self, dashboard_token: str | None) -> None:
        self._key = (
            hmac.new(dashboard_token.encode(), _KEY_CONTEXT, hashlib.sha256).digest()
            if dashboard_token
            else secrets.token_bytes(32)
        )

    @staticmethod
    def well_formed(value: str | None) -> bool:
        return value is not None and _VALUE.match(value) is not None

    @staticmethod
    def new_value() -> str:
        return secrets.token_urlsafe(32)

    def token(self, value: str, session: str | None) -> str:
        """The form token of the browser whose CSRF cookie is ``value``, signed in as
        ``session`` (its session cookie; None when the dashboard has no sign-in)."""
        message = f"{value}|{session or ''}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def valid(self, value: str | None, session: str | None, offered: str | None) -> bool:
        if not self.well_formed(value) or not offered:
            return False
        assert value is not None
        return hmac.compare_digest(self.token(value, session).encode(), offered.encode())
