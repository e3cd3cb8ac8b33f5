"""What every page and action of the dashboard works with: one ``DashboardContext`` per app,
made by ``http.create_app`` and handed to the routes of ``web/app.py`` and ``web/actions.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.requests import Request

from nightcrew.clock import Clock
from nightcrew.db.database import Database
from nightcrew.scheduler import ScheduleStatus
from nightcrew.web.access import COOKIE, Access
from nightcrew.web.throttle import SignInThrottle

if TYPE_CHECKING:
    from nightcrew.runtime import Runtime


@dataclass(frozen=True, kw_only=True)
class DashboardContext:
    db: Database
    clock: Clock
    access: Access
    schedules: Callable[[], list[ScheduleStatus]] | None = None  # None: no scheduler here
    label: str = ""  # what this dashboard shows, e.g. "the demo database"
    # shared by every door that compares the token: /login and /news/reports' bearer
    throttle: SignInThrottle = field(default_factory=SignInThrottle)
    # what the actions act with (serve's runtime); None: a dashboard that only shows
    runtime: Runtime | None = None
    # whether NIGHTCREW_TRUSTED_PROXIES names any proxy (whose forwarded client address
    # uvicorn then puts in the request); with none, a forwarded header came through a proxy
    # nobody vouched for
    proxies_trusted: bool = False
    # what this process has already said once (see web/actions.py)
    said: set[str] = field(default_factory=set)

    def session_valid(self, request: Request) -> bool:
        return self.access.cookie_valid(request.cookies.get(COOKIE), self.clock.now().timestamp())
