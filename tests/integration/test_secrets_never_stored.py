"""A key an upstream echoes back is stored nowhere and shown nowhere: Resend (a loopback
stand-in) answers 401 quoting the request's Authorization header, and the API key appears in
no row nightcrew wrote, on no dashboard page and in no log line — replaced at the database
seam, before any truncation, and by the log pipeline."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from structlog.testing import capture_logs
from werkzeug import Request, Response

from nightcrew.adapters.feedcache import HttpFeedCache
from nightcrew.adapters.mail import ResendMailer
from nightcrew.clock import FrozenClock
from nightcrew.db.connection import ConnectionPolicy
from nightcrew.db.database import Database
from nightcrew.http import ServiceParts, create_app
from nightcrew.lifecycle.lanes import run_lane
from nightcrew.log import REDACTED, SecretScrubber, SecretValues
from nightcrew.metrics import Metrics
from nightcrew.web.access import Access
from nightcrew.web.context import DashboardContext
from tests.conftest import NOW, make_runtime
from tests.integration.lifecycle.test_overage import _account
from tests.support.servers import RecordingServer

KEY = "re_live_9f8e7d6c5b4a39281706f5e4d3c2b1a0"


@pytest.fixture
async def guarded_db(fresh_db_url: str) -> AsyncIterator[Database]:
    """The test database as `serve` opens it: knowing the configured secrets."""
    db = await Database.open(fresh_db_url, policy=ConnectionPolicy(secrets=(KEY,)))
    try:
        yield db
    finally:
        await db.close()


def _echo_authorization(request: Request) -> Response:
    # a debug proxy's or a mis-set API base's answer: the request quoted back, 200+ characters
    # so that the adapter's 200-character cut falls inside the key
    padding = "x" * 130  # the cut falls 25 characters into the key
    body = f"unauthorized {padding} you sent Authorization: {request.headers['Authorization']}"
    return Response(body, status=401, content_type="text/plain")


async def test_an_echoed_api_key_is_in_no_row_page_or_log_line(
    guarded_db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    db = guarded_db
    await _account(db)
    resend_server.responder = _echo_authorization
    clock = FrozenClock(NOW)
    runtime = await make_runtime(
        db,
        clock,
        fresh_db_url,
        env={"PUBLIC_APP_URL": "https://app.example"},
        mail=ResendMailer(
            http, api_base=resend_server.url, api_key=KEY, from_email="billing@podcasts.example"
        ),
        feedcache=HttpFeedCache(http, feed_server.url, "feed-secret-0123456789abcdef"),
    )
    scrubber = SecretScrubber([KEY])
    with capture_logs(processors=[scrubber]) as logs:
        report = await run_lane(runtime, clock, "daily")
    assert report is not None
    # the upstream did echo it: the test is not vacuous
    [sent] = [r for r in resend_server.requests if r.path == "/emails"]
    assert sent.headers["Authorization"] == f"Bearer {KEY}"

    stored = await db.fetch(
        "SELECT 'effect' AS what, last_error AS text FROM nightcrew.effects"
        " UNION ALL SELECT 'run', report::text FROM nightcrew.runs"
    )
    errors = [r["text"] for r in stored if r["what"] == "effect" and r["text"]]
    assert errors and all("Resend answered 401" in e for e in errors), stored
    assert any(REDACTED in e for e in errors), errors
    for row in stored:
        assert not _has_key(row["text"] or ""), row

    app = create_app(
        Metrics(),
        ServiceParts(dashboard=DashboardContext(db=db, clock=clock, access=Access(token=None))),
    )
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        pages = [await c.get("/effects"), await c.get(f"/runs/{report.run_id}")]
        pages.append(await c.get(f"/runs/{report.run_id}/report.json"))
    for page in pages:
        assert page.status_code == 200, page.url
        assert not _has_key(page.text), page.url

    lines = [json.dumps(e, default=str) for e in logs]
    assert any("Resend answered 401" in line for line in lines)
    assert not [line for line in lines if _has_key(line)]


def _has_key(text: str) -> bool:
    """The key, or any 12 characters of it in a row."""
    return any(KEY[i : i + 12] in text for i in range(len(KEY) - 11))


def test_a_secret_cut_by_a_truncation_is_still_replaced() -> None:
    values = SecretValues([KEY])
    cut = f"Resend answered 401: Authorization: Bearer {KEY}"[:60]
    assert KEY[:10] in cut and values.redact(cut).endswith(REDACTED)
    assert not _has_key(values.redact(cut))
    # a text that merely shares a short run of characters with the key is left alone
    assert values.redact("build re_live") == "build re_live"


def test_a_secret_quoted_whole_and_then_cut_at_the_end_loses_both() -> None:
    values = SecretValues([KEY])
    text = (f"sent {KEY}, the proxy echoed {KEY}")[:-10]
    redacted = values.redact(text)
    assert not _has_key(redacted) and redacted.count(REDACTED) == 2


async def test_a_report_stored_before_secrets_were_kept_out_is_shown_without_them(
    db: Database, fresh_db_url: str
) -> None:
    """A run report written with the key in it (before stored text was redacted) is shown
    without it, on the run's page and in its JSON alike."""
    clock = FrozenClock(NOW)
    runtime = await make_runtime(db, clock, fresh_db_url, env={"RESEND_API_KEY": KEY})
    [row] = await db.fetch(
        "INSERT INTO nightcrew.runs (lane, trigger, started_at, finished_at, status, report)"
        " VALUES ('daily', 'manual', %(at)s, %(at)s, 'completed', %(report)s) RETURNING id",
        {"at": NOW, "report": json.dumps({"errors": [{"error": f"echoed Bearer {KEY}"}]})},
    )
    app = create_app(
        Metrics(),
        ServiceParts(
            dashboard=DashboardContext(
                db=db, clock=clock, access=Access(token=None), runtime=runtime
            )
        ),
    )
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        shown = [await c.get(f"/runs/{row['id']}"), await c.get(f"/runs/{row['id']}/report.json")]
    for page in shown:
        assert page.status_code == 200, page.url
        assert not _has_key(page.text) and REDACTED in page.text, page.text
