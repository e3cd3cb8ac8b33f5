"""The dashboard's actions against a real database, in-process (httpx's ASGI transport): each
one does what the CLI command of the same name does and records who did it; each is refused
(403, nothing changed) without this session's CSRF token, from another site, or without the
right to act; and a "run now" racing a scheduled run of the lane makes one run, one report."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from structlog.testing import capture_logs

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.http import ServiceParts, create_app
from nightcrew.lifecycle.lanes import LaneReport, run_lane
from nightcrew.metrics import Metrics
from nightcrew.runtime import Runtime
from nightcrew.web.access import Access
from nightcrew.web.context import DashboardContext
from nightcrew.web.csrf import CSRF_COOKIE

TOKEN = "correct horse battery staple 1234567890 and more"
HERE = "http://127.0.0.1:8787"


def client(
    runtime: Runtime,
    clock: FrozenClock,
    access: Access,
    *,
    host: str = "127.0.0.1:8787",
    peer: str = "127.0.0.1",
    scheme: str = "http",
) -> httpx.AsyncClient:
    ctx = DashboardContext(db=runtime.db, clock=clock, access=access, runtime=runtime)
    transport = httpx.ASGITransport(
        app=create_app(Metrics(), ServiceParts(dashboard=ctx)), client=(peer, 40000)
    )
    return httpx.AsyncClient(transport=transport, base_url=f"{scheme}://{host}")


@pytest.fixture
async def web(runtime: Runtime, clock: FrozenClock) -> AsyncIterator[httpx.AsyncClient]:
    async with client(runtime, clock, Access.for_bind("127.0.0.1", None)) as c:
        yield c


def token_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found is not None, "no CSRF token on the page"
    return found[1]


async def csrf(c: httpx.AsyncClient, page: str = "/effects") -> str:
    response = await c.get(page)
    assert response.status_code == 200, response.text[:300]
    return token_of(response.text)


async def post(c: httpx.AsyncClient, path: str, token: str, **fields: str) -> httpx.Response:
    return await c.post(path, data={"csrf": token, **fields}, headers={"Origin": HERE})


async def dead_effects(db: Database, kind: str, n: int, clock: FrozenClock) -> list[int]:
    now = clock.now()
    rows = await db.fetch(
        "INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at,"
        " expires_at, attempts, last_error, dead_at, dead_reason)"
        " SELECT %(kind)s, %(kind)s || ':' || g, '{}'::jsonb, %(then)s, %(then)s,"
        " %(then)s + interval '20 hours', 5, 'HTTP 503 <b>down</b>', %(now)s, 'permanent'"
        " FROM generate_series(1, %(n)s) g RETURNING id",
        {"kind": kind, "n": n, "now": now, "then": now - timedelta(hours=2)},
    )
    return [int(r["id"]) for r in rows]


async def state(db: Database, effect_id: int) -> dict[str, Any] | None:
    return await db.fetch_one(
        "SELECT dead_at, next_attempt_at, delivered_at FROM nightcrew.effects WHERE id = %s",
        (effect_id,),
    )


async def test_retry_and_drop_one_effect_from_the_page(
    runtime: Runtime, clock: FrozenClock, web: httpx.AsyncClient
) -> None:
    db = runtime.db
    first, second = await dead_effects(db, "mail", 2, clock)
    token = await csrf(web)
    assert f'action="/effects/{first}/retry"' in (await web.get("/effects")).text
    with capture_logs() as logs:
        answer = await post(web, f"/effects/{first}/retry", token)
    assert answer.status_code == 303 and answer.headers["location"] == f"/effects#effect-{first}"
    row = await state(db, first)
    # pending again: due now, the minute lane delivers it (the page never sends from a click)
    assert row is not None and row["dead_at"] is None and row["next_attempt_at"] == clock.now()
    assert (await state(db, second) or {}).get("dead_at") is not None
    done = [e for e in logs if e["event"] == "dashboard_action"]
    assert done == [
        {
            "event": "dashboard_action",
            "log_level": "info",
            "action": "effects.retry",
            "target": "mail",
            "ids": [str(first)],
            "client": "127.0.0.1",
            "outcome": {"retried": 1, "remaining": 0},
        }
    ]
    page = (await web.get("/effects")).text
    assert re.search(rf'<tr class="effect pending" id="effect-{first}">', page)
    assert "HTTP 503 &lt;b&gt;down&lt;/b&gt;" in page and "<b>down</b>" not in page
    assert "effects.retry" in page and "dashboard 127.0.0.1" in page

    answer = await post(web, f"/effects/{second}/drop", token)
    assert answer.status_code == 303
    assert await state(db, second) is None
    actions = await db.fetch(
        "SELECT source, action, ids, client FROM nightcrew.actions ORDER BY id"
    )
    assert actions == [
        {
            "source": "dashboard",
            "action": "effects.retry",
            "ids": [str(first)],
            "client": "127.0.0.1",
        },
        {
            "source": "dashboard",
            "action": "effects.drop",
            "ids": [str(second)],
            "client": "127.0.0.1",
        },
    ]
    # dropping it again: nothing to drop, said as such
    again = await post(web, f"/effects/{second}/drop", token)
    assert again.status_code == 409 and "not undelivered at rest" in again.text


async def test_retry_every_dead_effect_of_a_kind_through_the_confirmation_in_pages(
    runtime: Runtime, clock: FrozenClock, web: httpx.AsyncClient
) -> None:
    db = runtime.db
    mail = await dead_effects(db, "mail", 105, clock)
    other = await dead_effects(db, "queue", 1, clock)
    confirm = await web.get("/effects/retry-dead?kind=mail")
    assert confirm.status_code == 200
    assert "105 dead <b>mail</b> effect(s)" in confirm.text
    assert "Retry 100 dead mail effect(s)" in confirm.text
    # the confirmation itself changed nothing
    assert (
        await db.fetch_one("SELECT count(*) AS n FROM nightcrew.effects WHERE dead_at IS NULL")
    )["n"] == 0
    token = token_of(confirm.text)
    assert (await post(web, "/effects/retry-dead", token, kind="mail")).status_code == 303
    revived = await db.fetch("SELECT id FROM nightcrew.effects WHERE dead_at IS NULL ORDER BY id")
    assert [r["id"] for r in revived] == mail[:100]  # bounded: the oldest 100
    assert "5 dead <b>mail</b> effect(s)" in (await web.get("/effects/retry-dead?kind=mail")).text
    assert (await post(web, "/effects/retry-dead", token, kind="mail")).status_code == 303
    still_dead = await db.fetch("SELECT id FROM nightcrew.effects WHERE dead_at IS NOT NULL")
    assert [r["id"] for r in still_dead] == other
    outcomes = await db.fetch(
        "SELECT outcome FROM nightcrew.actions WHERE action = 'effects.retry_dead' ORDER BY id"
    )
    assert [o["outcome"] for o in outcomes] == [
        {"retried": 100, "remaining": 5},
        {"retried": 5, "remaining": 0},
    ]
    assert (await web.get("/effects/retry-dead?kind=<script>")).status_code == 400


async def test_enable_a_parked_source_and_see_why_it_was_refused(
    runtime: Runtime, clock: FrozenClock, web: httpx.AsyncClient
) -> None:
    db = runtime.db
    row = await db.fetch_one(
        "INSERT INTO news.sources (name, feed_url, shard, consecutive_failures, last_error,"
        " parked_at, next_check_at) VALUES ('Office wire', 'http://10.20.0.7/wire.xml', 'demo',"
        " 5, '10.20.0.7 is not a public address', %(now)s, %(now)s) RETURNING id",
        {"now": clock.now()},
    )
    assert row is not None
    page = (await web.get("/news")).text
    assert "NEWS_ALLOWED_PRIVATE_HOSTS=10.20.0.7" in page
    assert "Enable frees it at once after that." in page
    answer = await post(web, f"/news/sources/{row['id']}/enable", token_of(page))
    assert answer.status_code == 303
    source = await db.fetch_one(
        "SELECT enabled, parked_at, consecutive_failures FROM news.sources WHERE id = %s",
        (row["id"],),
    )
    assert source == {"enabled": True, "parked_at": None, "consecutive_failures": 0}
    assert "news.source_enable" in (await web.get("/news")).text


async def test_a_bad_runs_filter_says_what_was_wrong_and_news_lanes_are_offered(
    runtime: Runtime, clock: FrozenClock, web: httpx.AsyncClient
) -> None:
    await runtime.db.execute(
        "INSERT INTO news.sources (name, feed_url, shard) VALUES ('a', 'https://a.example/f', 'eu')"
    )
    runs = (await web.get("/runs")).text
    assert '<option value="news:eu">news:eu</option>' in runs
    bad = await web.get("/runs?lane=nope")
    assert bad.status_code == 400
    assert "no lane &#39;nope&#39; here; the lanes are daily, minute, news:eu" in bad.text
    assert (await web.get("/runs?lane=news:eu")).status_code == 200


def _snapshot_sql() -> str:
    return (
        "SELECT (SELECT md5(coalesce(string_agg(e::text, '|' ORDER BY e.id), '')) FROM"
        " nightcrew.effects e) AS effects,"
        " (SELECT md5(coalesce(string_agg(s::text, '|' ORDER BY s.id), '')) FROM news.sources s)"
        " AS sources,"
        " (SELECT count(*) FROM nightcrew.runs) AS runs,"
        " (SELECT count(*) FROM nightcrew.actions) AS actions"
    )


ACTIONS = [
    ("/effects/{effect}/retry", {}),
    ("/effects/{effect}/drop", {}),
    ("/effects/retry-dead", {"kind": "mail"}),
    ("/news/sources/{source}/enable", {}),
    ("/news/letters/replay", {"stage": "fetch"}),
    ("/news/letters/purge", {"stage": "fetch", "id": "x"}),
    ("/runs/run-now", {"lane": "minute"}),
]


@pytest.mark.parametrize(("path", "fields"), ACTIONS)
async def test_every_action_is_refused_without_csrf_from_another_site_or_without_access(
    runtime: Runtime, clock: FrozenClock, path: str, fields: dict[str, str]
) -> None:
    db = runtime.db
    [effect] = await dead_effects(db, "mail", 1, clock)
    source = await db.fetch_one(
        "INSERT INTO news.sources (name, feed_url, parked_at, consecutive_failures)"
        " VALUES ('p', 'https://p.example/f', %(now)s, 5) RETURNING id",
        {"now": clock.now()},
    )
    assert source is not None
    target = path.format(effect=effect, source=source["id"])
    before = await db.fetch_one(_snapshot_sql())
    open_access = Access.for_bind("127.0.0.1", None)

    async with client(runtime, clock, open_access) as c:
        token = await csrf(c)
        # no token, a wrong one, another session's
        for offered in ("", "0" * 64, token[::-1]):
            answer = await c.post(
                target, data={"csrf": offered, **fields}, headers={"Origin": HERE}
            )
            assert answer.status_code == 403, (target, offered)
        # a token of this session but no cookie to go with it (another browser's token)
        async with client(runtime, clock, open_access) as other:
            answer = await other.post(
                target, data={"csrf": token, **fields}, headers={"Origin": HERE}
            )
            assert answer.status_code == 403
        # the right token, sent from another site's page
        for origin in ("https://evil.example", "null", "http://127.0.0.1:9999"):
            answer = await c.post(
                target, data={"csrf": token, **fields}, headers={"Origin": origin}
            )
            assert answer.status_code == 403, origin
        answer = await c.post(
            target,
            data={"csrf": token, **fields},
            headers={"Referer": "https://evil.example/page"},
        )
        assert answer.status_code == 403
        # and a GET never acts (the snapshot below says so)
        await c.get(target + "?" + "&".join(f"{k}={v}" for k, v in fields.items()))
    # open (no token) beyond loopback: a client elsewhere may not act, whatever its Host says
    async with client(runtime, clock, open_access, peer="192.0.2.10") as c:
        token = await csrf(c)
        answer = await c.post(target, data={"csrf": token, **fields}, headers={"Origin": HERE})
        assert answer.status_code == 403 and "not a loopback client" in answer.text
    # open (no token), through a proxy on this machine that no setting names: every client
    # of the proxy would look local
    async with client(runtime, clock, open_access) as c:
        token = await csrf(c)
        answer = await c.post(
            target,
            data={"csrf": token, **fields},
            headers={"Origin": HERE, "X-Forwarded-For": "203.0.113.9"},
        )
        assert answer.status_code == 403 and "NIGHTCREW_DASHBOARD_TOKEN" in answer.text
    # with a token: not signed in, from anywhere
    token_access = Access.for_bind("0.0.0.0", TOKEN)
    async with client(runtime, clock, token_access, host="d.example", peer="192.0.2.10") as c:
        c.cookies.set(CSRF_COOKIE, "A" * 43)
        answer = await c.post(
            target, data={"csrf": "0" * 64, **fields}, headers={"Origin": "http://d.example"}
        )
        assert answer.status_code == 403 and "not signed in" in answer.text
    assert await db.fetch_one(_snapshot_sql()) == before


async def test_signed_in_with_the_token_an_action_works_from_another_machine(
    runtime: Runtime, clock: FrozenClock
) -> None:
    [effect] = await dead_effects(runtime.db, "queue", 1, clock)
    access = Access.for_bind("0.0.0.0", TOKEN)
    # its cookies are Secure: HTTPS, as a TLS front end gives it
    async with client(
        runtime, clock, access, host="d.example", peer="192.0.2.10", scheme="https"
    ) as c:
        signed = await c.post(
            "/login",
            data={"token": TOKEN, "next": "/effects"},
            headers={"Origin": "https://d.example"},
        )
        assert signed.status_code == 303
        page = await c.get("/effects")
        answer = await c.post(
            f"/effects/{effect}/retry",
            data={"csrf": token_of(page.text)},
            headers={"Origin": "https://d.example"},
        )
        assert answer.status_code == 303
    assert (await state(runtime.db, effect) or {}).get("dead_at") is None
    row = await runtime.db.fetch_one("SELECT client FROM nightcrew.actions")
    assert row == {"client": "192.0.2.10"}


async def finished(db: Database) -> None:
    """Until the run started in the background has ended (a page's "run now" answers first)."""
    for _ in range(600):
        if await db.fetch_one("SELECT status FROM nightcrew.runs") != {"status": "running"}:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the run did not end within 30 s")


LANE_LOCK = "SELECT pg_advisory_lock(hashtextextended('nightcrew.runs:' || %s, 0))"


async def test_run_now_racing_a_scheduled_run_of_the_lane_makes_one_run_one_report(
    runtime: Runtime, clock: FrozenClock, fresh_db_url: str, web: httpx.AsyncClient
) -> None:
    """Both wait on the lane's lock, held here, and the first to start is held inside its work
    (a table its first job reads is locked), so the second certainly sees it running."""
    db = runtime.db
    token = await csrf(web, "/runs")
    slot = clock.now().replace(second=0, microsecond=0)
    holder = await psycopg.AsyncConnection.connect(fresh_db_url, autocommit=True)
    try:
        await holder.execute(LANE_LOCK, ("minute",))
        await holder.execute("BEGIN")
        await holder.execute("LOCK TABLE public.import_items IN ACCESS EXCLUSIVE MODE")
        clicked = asyncio.create_task(post(web, "/runs/run-now", token, lane="minute"))
        ticked = asyncio.create_task(
            run_lane(runtime, clock, "minute", trigger="scheduled", slot=slot)
        )
        await asyncio.sleep(0.5)
        assert await db.fetch_one("SELECT count(*) AS n FROM nightcrew.runs") == {"n": 0}
        await holder.execute("SELECT pg_advisory_unlock_all()")
        await asyncio.wait({clicked, ticked}, timeout=30, return_when="FIRST_COMPLETED")
        # whichever lost is answered while the winner is still held in its work
        await asyncio.sleep(0.5)
        running = await db.fetch("SELECT id, trigger, status FROM nightcrew.runs")
        assert len(running) == 1 and running[0]["status"] == "running"
        await holder.execute("COMMIT")
        answer = await clicked
        scheduled = await ticked
    finally:
        await holder.close()
    await finished(db)
    [run] = await db.fetch("SELECT id, trigger, status, report, requested_by FROM nightcrew.runs")
    assert run["status"] == "completed" and run["report"]["lane"] == "minute"
    if run["trigger"] == "manual":  # the click won: the tick found the lane taken
        assert scheduled is None
        assert answer.status_code == 303 and answer.headers["location"] == f"/runs/{run['id']}"
        assert run["requested_by"] == "dashboard 127.0.0.1"
    else:  # the tick won: the click is told so
        assert isinstance(scheduled, LaneReport)
        assert answer.status_code == 409 and "minute is running already" in answer.text


async def test_run_now_records_who_asked_and_the_run_page_says_so(
    runtime: Runtime, clock: FrozenClock, web: httpx.AsyncClient
) -> None:
    token = await csrf(web, "/runs")
    answer = await post(web, "/runs/run-now", token, lane="minute")
    assert answer.status_code == 303
    location = answer.headers["location"]
    await finished(runtime.db)
    page = (await web.get(location)).text
    assert "requested by dashboard 127.0.0.1" in page
    runs = (await web.get("/runs")).text
    assert "by dashboard 127.0.0.1" in runs and "runs.run_now" in runs
    refused = await post(web, "/runs/run-now", token, lane="weekly")
    assert refused.status_code == 400 and "not a lane here" in refused.text


async def test_the_counts_refresh_from_live_json(
    runtime: Runtime, clock: FrozenClock, web: httpx.AsyncClient
) -> None:
    page = (await web.get("/effects")).text
    assert 'data-live="effects.mail.dead"' in page and 'id="read-at"' in page
    await dead_effects(runtime.db, "mail", 3, clock)
    live = await web.get("/live.json")
    assert live.status_code == 200 and live.headers["content-type"] == "application/json"
    body = live.json()
    assert body["values"]["effects.mail.dead"] == 3 and body["values"]["effects.dead"] == 3
    assert body["read_at_text"] == clock.now().strftime("%H:%M:%S")
    script = await web.get("/static/live.js")
    assert script.status_code == 200 and "/live.json" in script.text
    assert "script-src 'self'" in script.headers["content-security-policy"]
    assert "unsafe-inline" not in script.headers["content-security-policy"]


async def test_an_open_dashboard_behind_an_unnamed_proxy_says_so_once_and_does_not_act(
    runtime: Runtime, clock: FrozenClock
) -> None:
    from structlog.testing import capture_logs

    [effect] = await dead_effects(runtime.db, "mail", 1, clock)
    async with client(runtime, clock, Access.for_bind("127.0.0.1", None)) as c:
        token = await csrf(c)
        with capture_logs() as logs:
            for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
                answer = await c.post(
                    f"/effects/{effect}/retry",
                    data={"csrf": token},
                    headers={"Origin": HERE, header: "for=203.0.113.9"},
                )
                assert answer.status_code == 403, header
                assert "NIGHTCREW_TRUSTED_PROXIES" in answer.text
        # without the proxy's header the same client acts
        assert (await post(c, f"/effects/{effect}/retry", token)).status_code == 303
    said = [e for e in logs if e["event"] == "dashboard_open_behind_a_proxy"]
    assert len(said) == 1 and said[0]["header"] == "x-forwarded-for"
