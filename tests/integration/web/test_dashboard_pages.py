"""Every dashboard page against a real database: status, escaping, filters, pagination, access.

The app runs in-process through httpx's ASGI transport (what Starlette's TestClient wraps; the
async form shares the test's event loop with the database pool)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.errors import ConfigError
from nightcrew.http import ServiceParts, create_app
from nightcrew.metrics import Metrics
from nightcrew.web.access import COOKIE, Access
from nightcrew.web.context import DashboardContext
from nightcrew.web.pages.sign_in import safe_next
from tests.integration.web import seed

PAGES = ["/", "/runs", "/deletions", "/overage", "/watchdogs", "/effects", "/news"]
TOKEN = "correct horse battery staple 1234567890 and more"


def client(
    db: Database,
    clock: FrozenClock,
    access: Access,
    host: str = "127.0.0.1:8787",
    *,
    peer: str = "127.0.0.1",
    scheme: str = "http",
) -> httpx.AsyncClient:
    app = create_app(
        Metrics(), ServiceParts(dashboard=DashboardContext(db=db, clock=clock, access=access))
    )
    transport = httpx.ASGITransport(app=app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url=f"{scheme}://{host}")


@pytest.fixture
async def open_client(db: Database, clock: FrozenClock) -> AsyncIterator[httpx.AsyncClient]:
    async with client(db, clock, Access.for_bind("127.0.0.1", None)) as c:
        yield c


def run_ids(html: str) -> list[int]:
    return [int(m) for m in re.findall(r'<tr class="run">\s*<td><a href="/runs/(\d+)">', html)]


async def test_every_page_answers_and_escapes_what_it_prints(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    night = await seed.night(db, clock.now())
    for path in [*PAGES, f"/runs/{night.daily_run}", f"/runs/{night.failed_run}"]:
        response = await open_client.get(path)
        assert response.status_code == 200, (path, response.text[:500])
        assert response.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in response.headers["content-security-policy"]
        assert response.headers["x-frame-options"] == "DENY"
        body = response.text
        # the one script is our own file, never inline
        scripts = re.findall(r"<script[^>]*>", body)
        assert scripts == ['<script src="/static/live.js" defer>'], path
        assert "<img" not in body, path
        assert "onerror=" not in body.replace("onerror=&#34;", ""), path
    # the hostile texts are shown — escaped — where they belong
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    for path in ["/deletions", "/overage", "/effects", "/news", f"/runs/{night.daily_run}"]:
        assert escaped in (await open_client.get(path)).text, path
    failed = (await open_client.get(f"/runs/{night.failed_run}")).text
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in failed


async def test_a_run_opens_in_words_and_as_json(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    night = await seed.night(db, clock.now())
    page = (await open_client.get(f"/runs/{night.daily_run}")).text
    assert "its deletion date passed, so the podcast and everything under it were deleted" in page
    assert "4 file(s), 7,168 bytes from storage; feed cache told via queue" in page
    assert f'href="/runs/{night.daily_run}/report.json"' in page
    raw = await open_client.get(f"/runs/{night.daily_run}/report.json")
    assert raw.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert raw.json()["jobs"]["hardDeleteExpiredPodcasts"]["podcasts"][0]["slug"] == seed.HOSTILE
    skipped = (await open_client.get(f"/runs/{night.skipped_run}")).text
    assert 'class="status skipped"' in skipped
    assert "another worker held the shard" in skipped
    assert (await open_client.get("/runs/999999")).status_code == 404
    assert (await open_client.get("/runs/999999/report.json")).status_code == 404


async def test_runs_filter_by_lane_status_and_day(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    night = await seed.night(db, clock.now())
    everything = run_ids((await open_client.get("/runs")).text)
    assert everything == [night.skipped_run, night.daily_run, night.minute_run, night.failed_run]
    assert run_ids((await open_client.get("/runs?lane=daily")).text) == [
        night.daily_run,
        night.failed_run,
    ]
    assert run_ids((await open_client.get("/runs?status=failed")).text) == [night.failed_run]
    skipped = (await open_client.get("/runs?status=skipped")).text
    assert run_ids(skipped) == [night.skipped_run]
    # a completed run whose report says it was skipped is shown as skipped, not completed
    assert '<span class="status skipped">skipped</span>' in skipped
    assert '<span class="status completed' not in skipped
    completed = run_ids((await open_client.get("/runs?status=completed")).text)
    assert completed == [night.daily_run, night.minute_run]  # a skipped run is not "completed"
    yesterday = (clock.now() - timedelta(days=1, hours=1)).date().isoformat()
    assert run_ids((await open_client.get(f"/runs?lane=daily&date={yesterday}")).text) == [
        night.failed_run
    ]
    # the lane filter offers every lane of the history
    page = (await open_client.get("/runs")).text
    for lane in ("daily", "minute", "news:world"):
        assert f'<option value="{lane}"' in page


@pytest.mark.parametrize(
    "query",
    ["status=bogus", "date=yesterday", "before=not-a-cursor", "lane=%00"],
)
async def test_a_bad_filter_is_a_400_that_names_it(
    open_client: httpx.AsyncClient, query: str
) -> None:
    response = await open_client.get(f"/runs?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] + ":" in response.text


async def test_runs_are_paged_newest_first_without_gaps_or_repeats(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    now = clock.now()
    started = {}
    for i in range(120):  # two runs per instant: the keyset's tie-break must hold
        at = now - timedelta(minutes=i // 2)
        started[await seed.run(db, "minute", at, {"n": i}, trigger="manual")] = at
    expected = sorted(started, key=lambda run_id: (started[run_id], run_id), reverse=True)
    seen: list[int] = []
    url = "/runs?lane=minute"
    pages = 0
    while url:
        html = (await open_client.get(url)).text
        seen += run_ids(html)
        pages += 1
        found = re.search(r'href="(/runs\?[^"]*before=[^"]*)" rel="next"', html)
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert pages == 3
    assert seen == expected


async def test_deletions_are_paged(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    now = clock.now()
    await db.execute(
        "INSERT INTO nightcrew.podcast_deletions (podcast_id, slug, deleted_at,"
        " storage_cleaned_at, invalidated_at)"
        " SELECT gen_random_uuid(), 'show-' || g, %(now)s - g * interval '1 hour', %(now)s,"
        " %(now)s FROM generate_series(1, 75) g",
        {"now": now},
    )
    first = (await open_client.get("/deletions")).text
    slugs = re.findall(r"<td>(show-\d+)<br>", first)
    assert slugs == [f"show-{g}" for g in range(1, 51)]
    older = re.search(r'href="(/deletions\?before=[^"]*)" rel="next"', first)
    assert older is not None
    second = (await open_client.get(older.group(1))).text
    assert re.findall(r"<td>(show-\d+)<br>", second) == [f"show-{g}" for g in range(51, 76)]
    assert 'rel="next"' not in second


async def test_watchdogs_chart_and_overage_clock(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    await seed.night(db, clock.now())
    page = (await open_client.get("/watchdogs")).text
    assert "<svg" in page and page.count('class="bar"') == 24
    assert "<b>3</b> import message(s) re-sent" in page
    overage = (await open_client.get("/overage")).text
    assert "owner@example.test" in overage
    assert "warning 2 of 4 sent" in overage
    assert "<td>22</td>" in overage  # days left
    assert (
        "Restored in the last 30 days" in overage
        and "00000000-0000-0000-0000-0000000000aa" in overage
    )


async def test_open_dashboard_answers_loopback_host_names_only(
    db: Database, clock: FrozenClock
) -> None:
    access = Access.for_bind("127.0.0.1", None)
    for host in ("127.0.0.1:8787", "localhost:8787", "[::1]:8787"):
        async with client(db, clock, access, host) as c:
            assert (await c.get("/runs")).status_code == 200, host
    # a page elsewhere that rebinds its own name to 127.0.0.1 sends its own Host
    async with client(db, clock, access, "attacker.example:8787") as c:
        assert (await c.get("/runs")).status_code == 421
        assert (await c.get("/login")).status_code == 421


def test_beyond_loopback_a_token_is_required() -> None:
    with pytest.raises(ConfigError, match="NIGHTCREW_DASHBOARD_TOKEN"):
        Access.for_bind("0.0.0.0", None)
    with pytest.raises(ConfigError):
        Access.for_bind("192.0.2.10", "")
    assert Access.for_bind("::1", None).token is None
    assert Access.for_bind("0.0.0.0", TOKEN).hosts is None


async def test_sign_in_with_the_token_keeps_a_strict_http_only_cookie(
    db: Database, clock: FrozenClock
) -> None:
    access = Access.for_bind("0.0.0.0", TOKEN)
    async with client(db, clock, access, "dashboard.example:8787") as c:
        for path in [*PAGES, "/runs/1", "/runs/1/report.json"]:
            response = await c.get(path)
            assert response.status_code == 303, path
            assert response.headers["location"].startswith("/login?next="), path
        form = await c.get("/login?next=/effects")
        assert form.status_code == 200 and 'name="token"' in form.text
        wrong = await c.post("/login", data={"token": "guess", "next": "/effects"})
        assert wrong.status_code == 401 and COOKIE not in wrong.headers.get("set-cookie", "")
        right = await c.post("/login", data={"token": TOKEN, "next": "/effects"})
        assert right.status_code == 303 and right.headers["location"] == "/effects"
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert TOKEN not in cookie  # the cookie is derived from the token, not the token
        assert (await c.get("/effects")).status_code == 200
        await c.post("/logout")
        assert (await c.get("/effects")).status_code == 303
        c.cookies.set(COOKIE, "forged")
        assert (await c.get("/effects")).status_code == 303


def test_sign_in_redirects_only_within_the_site() -> None:
    assert safe_next("/runs?lane=daily") == "/runs?lane=daily"
    for target in ("//attacker.example/", "https://attacker.example/", "/\\attacker", "", None):
        assert safe_next(target) == "/"


async def test_a_database_that_is_gone_is_a_503_page_not_a_traceback(
    fresh_db_url: str, clock: FrozenClock
) -> None:
    gone = await Database.open(fresh_db_url)
    await gone.execute("DROP TABLE nightcrew.runs CASCADE")  # what an unmigrated database is
    try:
        async with client(gone, clock, Access.for_bind("127.0.0.1", None)) as c:
            response = await c.get("/runs")
        assert response.status_code == 503
        assert "runs" in response.text and "Traceback" not in response.text
        assert "run `nightcrew db migrate` first" in response.text
    finally:
        await gone.close()


async def test_odd_stored_reports_still_render(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    """Reports are stored JSON from any version, or cut short: a page never 500s on one."""
    now = clock.now()
    odd = [
        ["a", "list"],
        {"duration_ms": "NaN", "jobs": {"sweepStalledImports": [1, 2]}},
        {"duration_ms": 1e300, "errors": 5, "jobs": {"x": "not a job"}},
        {"jobs": {"sweepWedgedMediaJobs": {"job_ids": 3, "duration_ms": None}}},
        {"durationMs": -1, "jobs": {"sweepStalledImports": {"durationMs": "1e999"}}},
        {"jobs": {"hardDeleteExpiredPodcasts": {"podcasts": [{"bytes_deleted": None}]}}},
        {"jobs": {"runReconcile": {"report": {"missing": None, "orphans": []}}}},
        {"items_requeued": 1.5, "links_requeued": "2", "jobs": {"runOverageEscalation": None}},
    ]
    ids = [
        await seed.run(db, "daily" if i % 2 else "minute", now - timedelta(minutes=i), r)
        for i, r in enumerate(odd)
    ]
    assert (await open_client.get("/runs")).status_code == 200
    assert (await open_client.get("/watchdogs")).status_code == 200
    for run_id in ids:
        assert (await open_client.get(f"/runs/{run_id}")).status_code == 200, run_id
    raw = await open_client.get(f"/runs/{ids[0]}/report.json")
    assert raw.json() == ["a", "list"]  # the JSON view shows what is stored


@pytest.mark.parametrize("spelling", ["durationMs", "duration_ms"])
async def test_a_lane_run_shows_how_long_it_took_whichever_spelling_its_report_has(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient, spelling: str
) -> None:
    """A lane's report says durationMs, as every report does; one stored before the lanes
    spelled it so says duration_ms, and its run still shows the time the run measured."""
    job = {"ok": True, "status": "ok", spelling: 350.0, "podcasts_reactivated": 1}
    report = {"lane": "daily", spelling: 1234.5, "errors": [], "jobs": {"pauses": job}}
    run_id = await seed.run(db, "daily", clock.now() - timedelta(hours=1), report)

    page = (await open_client.get(f"/runs/{run_id}")).text
    assert "(1.2 s)" in page  # measured, not the row's 2 s from start to finish
    assert "<td>350 ms</td>" in page  # the job's own
    assert "duration ms" not in page  # a duration is no count
    listing = (await open_client.get("/runs")).text
    row = re.search(rf'<a href="/runs/{run_id}">.*?</tr>', listing, re.S)
    assert row is not None and "<td>1.2 s</td>" in row.group()


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/runs/99999999999999999999999", 404),  # beyond bigint: no table scan, no 500
        ("/runs/" + "9" * 5000, 404),
        ("/runs/abc", 404),
        ("/runs?date=9999-12-31", 400),
        ("/runs?date=0001-01-01", 400),
    ],
)
async def test_out_of_range_ids_and_days_are_client_errors(
    open_client: httpx.AsyncClient, path: str, status: int
) -> None:
    assert (await open_client.get(path)).status_code == status


async def test_a_login_with_too_many_fields_is_a_400(db: Database, clock: FrozenClock) -> None:
    async with client(db, clock, Access.for_bind("0.0.0.0", TOKEN), "d.example") as c:
        response = await c.post("/login", content="a=1&b=2&c=3&d=4&e=5&f=6")
        assert response.status_code == 400


async def test_the_overview_counts_past_the_lists_it_shows(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    now = clock.now()
    await db.execute(
        "INSERT INTO nightcrew.podcast_deletions (podcast_id, slug, deleted_at)"
        " SELECT gen_random_uuid(), 'left-' || g, %(now)s FROM generate_series(1, 130) g",
        {"now": now},
    )
    await db.execute(
        "INSERT INTO news.sources (name, feed_url, parked_at)"
        " SELECT 'f' || g, 'http://127.0.0.1:9/' || g, %(now)s FROM generate_series(1, 120) g",
        {"now": now},
    )
    page = (await open_client.get("/")).text
    assert '<b data-live="deletions.leftovers">130</b> deletion(s) with leftovers' in page
    assert '<b data-live="news.parked">120</b> parked feed(s)' in page
    assert "(the oldest 100 of 130)" in (await open_client.get("/deletions")).text
    assert "(the newest 100 of 120)" in (await open_client.get("/news")).text


async def test_every_dashboard_route_is_guarded_and_none_changes_anything(
    db: Database, clock: FrozenClock
) -> None:
    """Listed from the app itself, so a page added later cannot forget the guard."""
    from starlette.routing import Mount, Route

    access = Access.for_bind("0.0.0.0", TOKEN)
    app = create_app(
        Metrics(), ServiceParts(dashboard=DashboardContext(db=db, clock=clock, access=access))
    )
    # the service's own endpoints keep their rules (/reconcile: its bearer secret)
    own = {"/health", "/_health", "/ready", "/metrics", "/openapi.json", "/reconcile"}
    writes = set()
    async with client(db, clock, access, "d.example") as c:
        for route in app.routes:
            if isinstance(route, Mount):
                assert route.path == "/static"
                continue
            assert isinstance(route, Route)
            methods = (route.methods or set()) - {"HEAD"}
            if methods - {"GET"}:
                writes.add((route.path, frozenset(methods)))
            if route.path in own or route.path == "/login" or "GET" not in methods:
                continue
            path = route.path.replace("{run_id}", "1")
            response = await c.get(path)
            assert response.status_code in (303, 401), path
        # the actions: refused before anything when not signed in
        for path, _ in writes:
            if path in ("/login", "/logout", "/reconcile"):
                continue
            target = path.replace("{effect_id}", "1").replace("{source_id}", "1")
            response = await c.post(target, data={"csrf": "x"})
            assert response.status_code == 403, path
    assert writes == {
        ("/login", frozenset({"POST"})),
        ("/logout", frozenset({"POST"})),
        ("/reconcile", frozenset({"POST"})),
        ("/effects/{effect_id}/retry", frozenset({"POST"})),
        ("/effects/{effect_id}/drop", frozenset({"POST"})),
        ("/effects/retry-dead", frozenset({"POST"})),
        ("/news/letters/replay", frozenset({"POST"})),
        ("/news/letters/purge", frozenset({"POST"})),
        ("/news/sources/{source_id}/enable", frozenset({"POST"})),
        ("/runs/run-now", frozenset({"POST"})),
    }


async def test_news_reports_json_is_under_the_dashboards_access(
    db: Database, clock: FrozenClock
) -> None:
    async with client(db, clock, Access.for_bind("0.0.0.0", TOKEN), "d.example") as c:
        assert (await c.get("/news/reports")).status_code == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert (await c.get("/news/reports", headers=bearer)).status_code == 200
    async with client(db, clock, Access.for_bind("127.0.0.1", None), "evil.example") as c:
        assert (await c.get("/news/reports")).status_code == 421


async def test_reconcile_behind_a_same_host_proxy_is_guarded_by_its_bearer_not_the_host(
    db: Database, clock: FrozenClock
) -> None:
    """Spec 000's dry-run-then-apply calls POST /reconcile through a reverse proxy on the same
    host, which forwards the public name: the bearer decides (200 with RECONCILER_SECRET, 401
    without), whatever the Host; the dashboard's pages still refuse that Host (421)."""
    access = Access.for_bind("127.0.0.1", None)
    asked: list[Any] = []

    async def reconcile(options: Any) -> dict[str, Any]:
        asked.append(options)
        return {"dry_run": True}

    app = create_app(
        Metrics(),
        ServiceParts(
            reconcile=reconcile,
            reconciler_secret="s3cret-bearer",
            dashboard=DashboardContext(db=db, clock=clock, access=access),
        ),
    )
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    public = "http://lifecycle-manager.example.test"
    async with httpx.AsyncClient(transport=transport, base_url=public) as c:
        allowed = await c.post("/reconcile", headers={"Authorization": "Bearer s3cret-bearer"})
        refused = await c.post("/reconcile")
        wrong = await c.post("/reconcile", headers={"Authorization": "Bearer guess"})
        page = await c.get("/runs")
    assert allowed.status_code == 200 and allowed.json() == {"dry_run": True}
    assert (refused.status_code, wrong.status_code) == (401, 401)
    assert len(asked) == 1
    assert page.status_code == 421


async def test_the_overview_shows_each_lanes_newest_run_as_the_list_does(
    db: Database, clock: FrozenClock, open_client: httpx.AsyncClient
) -> None:
    night = await seed.night(db, clock.now())
    page = (await open_client.get("/")).text
    rows = {
        lane: row
        for lane, row in re.findall(
            r'<a href="/runs\?lane=([^"]+)">[^<]*</a></td>(.*?)</tr>', page, re.S
        )
    }
    # the news shard's newest run was skipped (another worker held it): shown so, and it is not
    # the shard's last completed run (it has none)
    news = rows["news%3Aworld"]
    assert f'href="/runs/{night.skipped_run}"' in news
    assert '<span class="status skipped">skipped</span>' in news
    assert f'href="/runs/{night.failed_run}"' not in rows["daily"]
    assert f'href="/runs/{night.daily_run}"' in rows["daily"]
    assert '<span class="status completed">completed</span>' in rows["daily"]
