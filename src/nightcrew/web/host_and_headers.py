"""What every answer of ``serve`` shares, whichever route (or none) produced it.

One ASGI middleware, so that a route added later, Starlette's own 404/405 and the static files
cannot forget it: every response carries the security headers below (a route may set its own
``Cache-Control`` or ``Content-Security-Policy``), and with a dashboard every request but the
liveness probes and the bearer-guarded ``/reconcile`` must name this dashboard in its ``Host``
(see access.py) or get a 421.
"""

from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nightcrew.web.access import Access

SECURITY_HEADERS = {
    # Nothing on these pages loads from elsewhere, and the one script is our own file (no
    # inline script, no eval): it reads /live.json and nothing else. Say so to the browser.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Not "no-referrer": under it a browser sends `Origin: null` with our own sign-in form,
    # and the POSTs' same-origin check could not tell it from a sandboxed attacker's frame.
    # "same-origin" still sends nothing to any other site.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
# Outside the Host check: an orchestrator's liveness probe names the pod's address, not ours,
# and learns only "ok"; `/reconcile` is guarded by its own bearer (RECONCILER_SECRET), which a
# page that rebinds its name to 127.0.0.1 cannot know — and a same-host reverse proxy forwards
# the public name in Host (spec 000's dry-run-then-apply calls go through one).
HOST_UNCHECKED = frozenset({"/health", "/_health", "/reconcile"})


class HostAndHeaders:
    def __init__(self, app: ASGIApp, access: Access | None) -> None:
        self._app = app
        self._access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if (
            self._access is not None
            and scope["path"] not in HOST_UNCHECKED
            and not self._access.host_allowed(Headers(scope=scope).get("host"))
        ):
            refused = PlainTextResponse(
                "unknown Host for this dashboard\n", 421, headers=SECURITY_HEADERS
            )
            await refused(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self._app(scope, receive, send_with_headers)
