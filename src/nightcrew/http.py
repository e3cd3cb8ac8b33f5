"""The HTTP door: health checks and metrics (the reconcile endpoint joins in a later release)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from nightcrew.metrics import Metrics

HEALTH_BODY = {"status": "ok", "service": "lifecycle-manager"}
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


async def health(request: Request) -> JSONResponse:
    return JSONResponse(HEALTH_BODY)


def create_app(metrics: Metrics) -> Starlette:
    async def render_metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=PROMETHEUS_TEXT)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/_health", health, methods=["GET"]),
            Route("/metrics", render_metrics, methods=["GET"]),
        ]
    )
