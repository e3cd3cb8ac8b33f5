"""`nightcrew lifecycle reconcile` as an operator runs it — including being killed mid-run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.test_cli import _env, _nightcrew, run

pytestmark = pytest.mark.acceptance
BASE = "https://media.example"
EPISODES = 3000


def _seed(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO public.podcasts (slug, title) VALUES ('lost', 'Lost') RETURNING id"
        ).fetchone()
        assert row is not None
        podcast = str(row[0])
        conn.execute(
            "INSERT INTO public.episodes (podcast_id, status, published_at, audio_url)"
            " SELECT %(p)s::uuid, 'published', now(),"
            " %(base)s || '/podcasts/' || %(p)s::text || '/e/' || g || '/a.mp3'"
            " FROM generate_series(1, %(n)s) g",
            {"p": podcast, "base": BASE, "n": EPISODES},
        )
        conn.execute(
            "INSERT INTO public.automation_jobs (episode_id, trigger_type)"
            " SELECT id, 'time' FROM public.episodes"
        )
    return podcast


def _state(url: str) -> tuple[int, int, int]:
    """(quarantined, untouched, inconsistent) episodes, and checks each transition is whole."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT e.audio_url IS NULL AS cleared, e.status, e.published_at IS NULL AS unpub,"
            " j.status AS job, (SELECT count(*) FROM public.feed_invalidation_outbox) AS intents"
            " FROM public.episodes e JOIN public.automation_jobs j ON j.episode_id = e.id"
        ).fetchall()
    quarantined = sum(1 for r in rows if r[0] and r[1] == "draft" and r[2] and r[3] == "canceled")
    untouched = sum(
        1 for r in rows if not r[0] and r[1] == "published" and not r[2] and r[3] == "pending"
    )
    intents = rows[0][4] if rows else 0
    assert intents == quarantined, "one outbox intent per published demotion, no more, no less"
    return quarantined, untouched, len(rows) - quarantined - untouched


def test_dry_run_then_apply_from_the_command_line(fresh_db_url: str, tmp_path: Path) -> None:
    _seed(fresh_db_url)
    env = _env(DATABASE_URL=fresh_db_url, STORAGE_URL=f"file://{tmp_path}", R2_PUBLIC_URL=BASE)
    dry = run("lifecycle", "reconcile", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["mode"] == "dryrun" and report["missing"]["count"] == EPISODES
    assert len(report["missing"]["sample"]) == 20  # enough for an operator to judge
    assert _state(fresh_db_url) == (0, EPISODES, 0)

    human = run("lifecycle", "reconcile", env=env)
    assert human.returncode == 0 and "3,000 episodes without their object" in human.stdout

    # what the README's first steps run: a configuration problem, so exit 2 and one line
    no_base = run("lifecycle", "reconcile", env=_env(DATABASE_URL=fresh_db_url))
    assert no_base.returncode == 2
    [line] = no_base.stderr.strip().splitlines()
    assert "R2_PUBLIC_URL is unset" in line


@pytest.mark.slow
def test_sigkill_mid_quarantine_leaves_no_half_quarantined_episode(
    fresh_db_url: str, tmp_path: Path
) -> None:
    _seed(fresh_db_url)
    env = _env(DATABASE_URL=fresh_db_url, STORAGE_URL=f"file://{tmp_path}", R2_PUBLIC_URL=BASE)
    args = [_nightcrew(), "lifecycle", "reconcile", "--apply", "--quarantine-missing", "--json"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and _state(fresh_db_url)[0] < 50:
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    quarantined, untouched, inconsistent = _state(fresh_db_url)
    assert inconsistent == 0  # every episode is wholly old or wholly new
    assert quarantined >= 50 and quarantined + untouched == EPISODES
    # the kill landed mid-run: had the process finished first, this would prove nothing
    assert quarantined < EPISODES, "the reconcile finished before the kill; seed more episodes"

    again = run(
        "lifecycle", "reconcile", "--apply", "--quarantine-missing", "--json", env=env, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["missing"]["quarantined"] == EPISODES - quarantined
    assert _state(fresh_db_url) == (EPISODES, 0, 0)
