"""POST /reconcile: the secret first, then the flags, then the report; and the OpenAPI contract."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import settings

from nightcrew.http import ServiceParts, create_app
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.metrics import Metrics
from nightcrew.web.throttle import SignInThrottle

SECRET = "reconcile-secret-0123456789"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[ReconcileOptions] = []

    async def __call__(self, options: ReconcileOptions) -> dict[str, Any]:
        self.calls.append(options)
        return {"mode": options.mode, "options": options.to_json()}


def client(recorder: Recorder, secret: str | None = SECRET) -> httpx.AsyncClient:
    fast = SignInThrottle(failure_delay=0.0, backoff_max=0.0)
    app = create_app(
        Metrics(),
        ServiceParts(reconcile=recorder, reconciler_secret=secret, reconcile_throttle=fast),
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://nc")


@pytest.mark.parametrize(
    ("secret", "header"),
    [
        (SECRET, None),
        (SECRET, "Bearer wrong-secret"),
        (SECRET, f"Basic {SECRET}"),
        (SECRET, SECRET),
        (None, "Bearer anything"),  # unset secret: fail closed
        ("", "Bearer "),
    ],
)
async def test_401_before_any_flag_is_read(secret: str | None, header: str | None) -> None:
    recorder = Recorder()
    headers = {"Authorization": header} if header is not None else {}
    async with client(recorder, secret) as c:
        # even a malformed flag is not looked at: the answer is 401, not 400
        response = await c.post("/reconcile?minOrphanAgeHours=abc&bogus=1", headers=headers)
    assert response.status_code == 401 and response.json() == {"error": "unauthorized"}
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert recorder.calls == []


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("bogus=1", "bogus"),
        ("minOrphanAgeHours=abc", "minOrphanAgeHours"),
        ("mode=delete-everything", "mode"),
        ("quarantineMissing=perhaps", "quarantineMissing"),
        ("mode=apply&mode=dryrun", "mode"),
    ],
)
async def test_400_names_the_bad_flag(query: str, named: str) -> None:
    recorder = Recorder()
    async with client(recorder) as c:
        response = await c.post(
            f"/reconcile?{query}", headers={"Authorization": f"Bearer {SECRET}"}
        )
    assert response.status_code == 400 and named in response.json()["error"]
    assert recorder.calls == []


async def test_flags_reach_the_reconciler_and_the_age_is_clamped() -> None:
    recorder = Recorder()
    async with client(recorder) as c:
        dry = await c.post("/reconcile", headers={"Authorization": f"Bearer {SECRET}"})
        applied = await c.post(
            "/reconcile?mode=apply&quarantineMissing=true&minOrphanAgeHours=1",
            headers={"Authorization": f"Bearer {SECRET}"},
        )
    assert dry.status_code == 200 and dry.json()["mode"] == "dryrun"
    assert applied.json()["options"]["minOrphanAgeHours"] == 24
    assert recorder.calls == [
        ReconcileOptions(),
        ReconcileOptions(mode="apply", quarantine_missing=True, min_orphan_age_hours=24),
    ]


async def test_openapi_is_served() -> None:
    async with client(Recorder()) as c:
        spec = (await c.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.")
    params = [p["name"] for p in spec["paths"]["/reconcile"]["post"]["parameters"]]
    assert params == [
        "mode",
        "quarantineMissing",
        "skipOrphanDelete",
        "bypassCapForBackfill",
        "minOrphanAgeHours",
    ]


# Property-based: every operation, with generated parameters, against the live ASGI app; the
# responses must match the documented schemas and status codes, and nothing may answer 5xx.
_recorder = Recorder()
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    create_app(
        Metrics(),
        ServiceParts(
            reconcile=_recorder,
            reconciler_secret=SECRET,
            reconcile_throttle=SignInThrottle(failure_delay=0.0, backoff_max=0.0),
        ),
    ),
)
# Every case carries the right bearer token (added below), so schemathesis must not also
# generate the security header itself: a "missing Authorization" negative case would have the
# token put back and be judged wrongly accepted. The 401 paths have their own tests above.
# Deterministic: the same cases every run, so CI never flakes on a random draw.
schema.config.generation.update(with_security_parameters=False, deterministic=True)


@schema.parametrize()
@settings(max_examples=25, deadline=None)
def test_the_api_honours_its_openapi_description(case: Any) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {SECRET}"})
