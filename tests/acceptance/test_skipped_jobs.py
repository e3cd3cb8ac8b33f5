"""A job that did not run says so: `skipped` and why, never `ok`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.test_cli import _env, run

pytestmark = pytest.mark.acceptance

NOW = "2026-11-29T04:00:00Z"
REASON = "R2_PUBLIC_URL is unset"


def test_the_daily_lane_says_skipped_for_the_reconciler_without_r2_public_url(
    fresh_db_url: str, tmp_path: Path
) -> None:
    env = _env(DATABASE_URL=fresh_db_url, STORAGE_URL=f"file://{tmp_path / 'media'}")
    env.pop("R2_PUBLIC_URL", None)

    human = run("lifecycle", "run", "daily", "--now", NOW, env=env)
    assert human.returncode == 0, human.stderr
    [line] = [ln for ln in human.stdout.splitlines() if "runReconcile" in ln]
    words = line.split()
    assert words[0] == "skipped" and words[1] == "runReconcile", line
    assert f"skipped: {REASON}" in line
    # the jobs that did run still say ok
    [deletions] = [ln for ln in human.stdout.splitlines() if "hardDeleteExpiredPodcasts" in ln]
    assert deletions.split()[0] == "ok", deletions

    as_json = run("lifecycle", "run", "daily", "--json", "--now", NOW, env=env)
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    job = report["jobs"]["runReconcile"]
    assert job["status"] == "skipped", job
    assert REASON in job["skipped"]
    assert report["jobs"]["hardDeleteExpiredPodcasts"]["status"] == "ok"
    assert report["errors"] == []
    events = [json.loads(ln) for ln in as_json.stderr.splitlines() if ln.startswith("{")]
    [skipped] = [e for e in events if e["event"] == "scheduled_reconcile_skipped"]
    assert REASON in skipped["reason"]
