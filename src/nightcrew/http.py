"""The HTTP door: health checks (the reconcile endpoint joins in a later release)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

HEALTH_BODY = {"status": "ok", "service": "lifecycle-manager"}


async def health(request: Request) -> JSONResponse:
    return JSONResponse(HEALTH_BODY)


def create_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/_health", health, methods=["GET"]),
        ]
    )
