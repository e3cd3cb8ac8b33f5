"""The operator's dashboard: server-rendered pages of what the crew did, and why.

Read-only HTML from Jinja2 templates (autoescaped: podcast titles, feed names and error texts
are attacker-controlled), one stylesheet served from the package, no JavaScript and nothing
fetched from anywhere else, so it works air-gapped. Each page is a module of ``web/pages/``
(its handler, read model and SQL); the buttons are ``web/actions.py``. ``dashboard_routes`` is
the one route table; ``http.create_app`` mounts it beside /health and /reconcile, behind
``host_and_headers.HostAndHeaders`` (the Host check and the headers every answer carries).
"""

from __future__ import annotations

import os
from pathlib import Path

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from nightcrew.web import actions as action_doors
from nightcrew.web.context import DashboardContext
from nightcrew.web.pages import (
    deletions,
    effects,
    news,
    overage,
    overview,
    runs,
    sign_in,
    watchdogs,
)
from nightcrew.web.pages.base import Pages

HERE = Path(__file__).parent


def dashboard_routes(ctx: DashboardContext) -> list[BaseRoute]:
    """Every page and button of the dashboard: a page behind ``pages.view`` (signed in), a
    button behind ``act`` (signed in, same-origin, a valid CSRF token, recorded)."""
    pages = Pages(ctx)
    act = action_doors.Actions(pages).guard
    return [
        # the buttons first: "/runs/run-now" is not a run's page
        Route("/effects/{effect_id}/retry", act(action_doors.retry_effect), methods=["POST"]),
        Route("/effects/{effect_id}/drop", act(action_doors.drop), methods=["POST"]),
        Route("/effects/retry-dead", act(action_doors.retry_dead), methods=["POST"]),
        Route("/effects/retry-dead", pages.view(action_doors.confirm_retry_dead), methods=["GET"]),
        Route("/news/letters/replay", act(action_doors.replay), methods=["POST"]),
        Route("/news/letters/purge", act(action_doors.purge), methods=["POST"]),
        Route("/news/sources/{source_id}/enable", act(action_doors.enable), methods=["POST"]),
        Route("/runs/run-now", act(action_doors.run_now), methods=["POST"]),
        Route("/", pages.view(overview.show), methods=["GET"]),
        Route("/live.json", pages.view(overview.live), methods=["GET"]),
        Route("/runs", pages.view(runs.listing), methods=["GET"]),
        Route("/runs/{run_id}", pages.view(runs.one), methods=["GET"]),
        Route("/runs/{run_id}/report.json", pages.view(runs.report_json), methods=["GET"]),
        Route("/deletions", pages.view(deletions.show), methods=["GET"]),
        Route("/overage", pages.view(overage.show), methods=["GET"]),
        Route("/watchdogs", pages.view(watchdogs.show), methods=["GET"]),
        Route("/effects", pages.view(effects.show), methods=["GET"]),
        Route("/news", pages.view(news.show), methods=["GET"]),
        Route("/login", pages.plain(sign_in.login_form), methods=["GET"]),
        Route("/login", pages.plain(sign_in.login), methods=["POST"]),
        Route("/logout", pages.plain(sign_in.logout), methods=["POST"]),
        Mount("/static", _Static(directory=HERE / "static"), name="static"),
    ]


class _Static(StaticFiles):
    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        try:
            return super().lookup_path(path)
        except ValueError:  # a NUL byte in the path, which os.stat refuses: no such file
            return "", None
