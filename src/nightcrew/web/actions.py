"""The dashboard's actions: the operator fixes what a page shows, from the page.

Every action is a ``POST`` (a ``GET`` never changes anything: the bulk retry's ``GET`` is its
confirmation page), refused with 403 — before anything is read or changed — unless all of:
the request comes from a page of this site (``access.same_origin``), the client may act (signed
in with NIGHTCREW_DASHBOARD_TOKEN, or, with no token, a loopback client), and the form carries
this browser session's CSRF token (``csrf.Csrf``). Each one calls the function the command line
calls (``nightcrew.operator_actions``), which records it (what, which ids, the client's
address) for the pages' "recent actions" and logs ``dashboard_action``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from nightcrew import operator_actions
from nightcrew.assembly import effect_kinds
from nightcrew.effects import outbox
from nightcrew.errors import ConfigError, NightcrewError, QueueError
from nightcrew.lifecycle.lanes import LANES
from nightcrew.log import describe_error, error, warning
from nightcrew.runs import LaneBusy
from nightcrew.setting_parsers import STAGES
from nightcrew.web.access import COOKIE, is_loopback, same_origin
from nightcrew.web.csrf import CSRF_COOKIE, CSRF_FIELD
from nightcrew.web.host_and_headers import SECURITY_HEADERS as HEADERS
from nightcrew.web.pages import news as news_page
from nightcrew.web.pages.base import read_form

if TYPE_CHECKING:
    from nightcrew.clock import Clock
    from nightcrew.runtime import Runtime
    from nightcrew.web.context import DashboardContext
    from nightcrew.web.pages.base import Pages

MAX_ACTION_BODY = 4096
MAX_ACTION_FIELDS = 8
# How long a "run now" waits for its run's row before answering; the run itself goes on in
# the background (a daily run takes minutes), and the page links to it.
RUN_START_WAIT_SECONDS = 30.0

Form = dict[str, str]


def client_of(request: Request) -> str | None:
    return request.client.host if request.client else None


_FORWARDED_HEADERS = (
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "via",
    "cf-connecting-ip",
    "true-client-ip",
)


def _forwarded(headers: Any) -> str | None:
    """The first header a reverse proxy adds that this request carries, if any."""
    return next((name for name in _FORWARDED_HEADERS if name in headers), None)


def _refused(request: Request, reason: str) -> Response:
    warning(
        "dashboard_action_refused", path=request.url.path, client=client_of(request), reason=reason
    )
    return Response(f"action refused: {reason}\n", 403, media_type="text/plain", headers=HEADERS)


async def news_lanes(ctx: DashboardContext) -> list[str]:
    """``news:<shard>`` for every shard with a source or named by NEWS_SHARDS."""
    shards = set(await news_page.shards(ctx.db))
    if ctx.runtime is not None:
        shards |= set(ctx.runtime.settings.news_shard_list)
    return [f"news:{s}" for s in sorted(shards)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Act:
    """One action that passed every check (``Actions.guard``): what its handler acts on."""

    pages: Pages
    request: Request
    form: Form
    runtime: Runtime
    actor: operator_actions.Actor
    background: set[asyncio.Task[Any]]  # runs started here, held until they end

    @property
    def clock(self) -> Clock:
        return self.pages.ctx.clock


ActHandler = Callable[[Act], Awaitable[Response]]


class Actions:
    """The checks every action passes (``may_act``, the body, the CSRF token) and what it
    answers when an action is refused or fails."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.background: set[asyncio.Task[Any]] = set()

    def may_act(self, request: Request) -> str | None:
        """Why this request may not act (None: it may)."""
        ctx = self.pages.ctx
        headers = request.headers
        if not same_origin(headers.get("origin"), headers.get("referer"), headers.get("host")):
            return "cross-site request"
        if ctx.access.token is not None:
            if not ctx.session_valid(request):
                return "not signed in"
        elif not is_loopback(client_of(request) or ""):
            # open (no token) means open to this machine only, whatever the Host says
            return "not a loopback client and no NIGHTCREW_DASHBOARD_TOKEN sign-in"
        elif (via := _forwarded(headers)) is not None and not ctx.proxies_trusted:
            # a proxy on this machine makes every client look local: an open dashboard behind
            # one is open to whoever reaches the proxy
            if "proxied" not in ctx.said:
                ctx.said.add("proxied")
                warning("dashboard_open_behind_a_proxy", header=via, client=client_of(request))
            return (
                f"the request came through a proxy ({via}) to a dashboard without"
                " NIGHTCREW_DASHBOARD_TOKEN: set the token to act behind a proxy (and name the"
                " proxy in NIGHTCREW_TRUSTED_PROXIES)"
            )
        if ctx.runtime is None:
            return "this dashboard has no runtime to act with"
        return None

    def guard(self, handler: ActHandler) -> Callable[[Request], Awaitable[Response]]:
        ctx, csrf, render = self.pages.ctx, self.pages.csrf, self.pages.render

        async def guarded(request: Request) -> Response:
            if (reason := self.may_act(request)) is not None:
                return _refused(request, reason)
            form = await read_form(request, max_bytes=MAX_ACTION_BODY, max_fields=MAX_ACTION_FIELDS)
            if isinstance(form, Response):
                return form
            session = request.cookies.get(COOKIE) if ctx.access.token is not None else None
            if not csrf.valid(request.cookies.get(CSRF_COOKIE), session, form.get(CSRF_FIELD)):
                return _refused(request, "missing or wrong CSRF token (reload the page)")
            runtime = ctx.runtime
            assert runtime is not None  # may_act checked
            actor = operator_actions.Actor(source="dashboard", client=client_of(request))
            try:
                act = Act(
                    pages=self.pages,
                    request=request,
                    form=form,
                    runtime=runtime,
                    actor=actor,
                    background=self.background,
                )
                return await handler(act)
            except LaneBusy as exc:
                return render(request, "error.html", 409, title="Already running", problem=str(exc))
            except (ConfigError, QueueError) as exc:
                problem = describe_error(exc)
                return render(
                    request, "error.html", 503, title="Not possible here", problem=problem
                )
            except NightcrewError as exc:
                problem = describe_error(exc)
                return render(request, "error.html", 400, title="Not done", problem=problem)

        return guarded


def bad(pages: Pages, request: Request, problem: str) -> Response:
    return pages.render(request, "error.html", 400, title="Bad request", problem=problem)


def back(path: str) -> Response:
    return RedirectResponse(path, 303, headers=HEADERS)


def effect_id(request: Request) -> int | None:
    text = str(request.path_params["effect_id"])
    return int(text) if text.isdigit() and len(text) <= 18 else None


# --- effects ---------------------------------------------------------------------------------
async def retry_effect(act: Act) -> Response:
    request, runtime, actor = act.request, act.runtime, act.actor
    if (wanted := effect_id(request)) is None:
        return bad(act.pages, request, "no such effect")
    result = await operator_actions.retry_effects(
        runtime, act.clock, actor, ids=[wanted], deliver=False
    )
    if not result.retried:
        return act.pages.render(
            request,
            "error.html",
            409,
            title="Not retried",
            problem=f"effect {wanted} is not undelivered at rest (delivered, being "
            "delivered right now, dropped, or no such effect)",
        )
    return back(f"/effects#effect-{wanted}")


async def drop(act: Act) -> Response:
    request, runtime, actor = act.request, act.runtime, act.actor
    if (wanted := effect_id(request)) is None:
        return bad(act.pages, request, "no such effect")
    if await operator_actions.drop_effect(runtime.db, act.clock, actor, wanted) is None:
        return act.pages.render(
            request,
            "error.html",
            409,
            title="Not dropped",
            problem=f"effect {wanted} is not undelivered at rest (delivered, being "
            "delivered right now, dropped already, or no such effect)",
        )
    return back("/effects")


def kind_of(value: str | None) -> str | None:
    return value if value in effect_kinds() else None


async def confirm_retry_dead(pages: Pages, request: Request) -> Response:
    # A GET: it only counts, and shows the form that acts.
    kind = kind_of(request.query_params.get("kind"))
    if kind is None:
        return bad(pages, request, f"kind: one of {', '.join(effect_kinds())}")
    return pages.render(
        request,
        "confirm.html",
        title=f"Retry the dead {kind} effects?",
        kind=kind,
        count=await outbox.count_retryable_dead(pages.ctx.db, kind),
        limit=operator_actions.BULK_RETRY_LIMIT,
    )


async def retry_dead(act: Act) -> Response:
    request, form, runtime, actor = act.request, act.form, act.runtime, act.actor
    kind = kind_of(form.get("kind"))
    if kind is None:
        return bad(act.pages, request, f"kind: one of {', '.join(effect_kinds())}")
    await operator_actions.retry_effects(
        runtime,
        act.clock,
        actor,
        all_dead=True,
        kind=kind,
        limit=operator_actions.BULK_RETRY_LIMIT,
        deliver=False,
    )
    return back("/effects#actions")


# --- news ------------------------------------------------------------------------------------
def stage_of(value: str | None) -> str | None:
    return value if value in STAGES else None


def letter_id(value: str | None) -> str | None:
    return value if value and len(value) <= 200 and value.isprintable() else None


async def replay(act: Act) -> Response:
    request, form, runtime, actor = act.request, act.form, act.runtime, act.actor
    stage = stage_of(form.get("stage"))
    if stage is None:
        return bad(act.pages, request, f"stage: one of {', '.join(STAGES)}")
    wanted = letter_id(form.get("id")) if form.get("id") else None
    if form.get("id") and wanted is None:
        return bad(act.pages, request, "id: not a dead letter's id")
    done = await operator_actions.replay_letters(
        runtime,
        act.clock,
        actor,
        stage=stage,
        message_id=wanted,
        limit=None if wanted else operator_actions.BULK_REPLAY_LIMIT,
    )
    if wanted is not None and done.touched == 0:
        return act.pages.render(
            request, "error.html", 409, title="Not replayed", problem=f"no dead letter {wanted}"
        )
    return back("/news#letters")


async def purge(act: Act) -> Response:
    request, form, runtime, actor = act.request, act.form, act.runtime, act.actor
    stage, wanted = stage_of(form.get("stage")), letter_id(form.get("id"))
    if stage is None or wanted is None:
        return bad(act.pages, request, "stage and id: the dead letter to purge")
    done = await operator_actions.purge_letters(
        runtime, act.clock, actor, stage=stage, message_id=wanted
    )
    if not done.purged:
        return act.pages.render(
            request, "error.html", 409, title="Not purged", problem=f"no dead letter {wanted}"
        )
    return back("/news#letters")


async def enable(act: Act) -> Response:
    request, runtime, actor = act.request, act.runtime, act.actor
    text = str(request.path_params["source_id"])
    if not text.isdigit() or len(text) > 18:
        return bad(act.pages, request, "no such source")
    source = await operator_actions.set_source_enabled(
        runtime.db, act.clock, actor, text, enabled=True
    )
    return back(f"/news#source-{source.id}")


# --- runs ------------------------------------------------------------------------------------
async def run_now(act: Act) -> Response:
    request, form, runtime, actor = act.request, act.form, act.runtime, act.actor
    lane = form.get("lane") or ""
    if lane not in LANES and lane not in await news_lanes(act.pages.ctx):
        return bad(act.pages, request, f"lane: {lane!r} is not a lane here")
    loop = asyncio.get_running_loop()
    started: asyncio.Future[int] = loop.create_future()

    def on_started(handle: Any) -> None:
        if not started.done():
            started.set_result(handle.id)

    task = asyncio.create_task(
        operator_actions.run_lane_now(runtime, act.clock, actor, lane, on_started=on_started)
    )
    act.background.add(task)
    task.add_done_callback(partial(_settled, act.background))
    waiting: set[asyncio.Future[Any]] = {task, started}
    await asyncio.wait(waiting, timeout=RUN_START_WAIT_SECONDS, return_when="FIRST_COMPLETED")
    if started.done():
        run_id = started.result()
        await operator_actions.record(
            runtime.db,
            act.clock.now(),
            actor,
            action="runs.run_now",
            target=lane,
            ids=[run_id],
        )
        return back(f"/runs/{run_id}")
    if task.done() and (exc := task.exception()) is not None:
        raise exc
    return act.pages.render(
        request,
        "error.html",
        504,
        title="Not started yet",
        problem=f"the run of {lane} did not start within {RUN_START_WAIT_SECONDS:g} s; the "
        "Runs page shows it once it does",
    )


def _settled(background: set[asyncio.Task[Any]], task: asyncio.Task[Any]) -> None:
    background.discard(task)
    if task.cancelled():
        return
    exc = task.exception()  # the run's failure is in its row; here it is only retrieved
    if exc is not None and not isinstance(exc, LaneBusy):
        error("dashboard_run_failed", error=describe_error(exc))
