"""Long CLI work shows a progress display on stderr when stderr is a terminal (rich), and
nothing extra when it is not: logs and pipes get only the JSON events and the report."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nightcrew.adapters.storage import open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.lifecycle.reconcile.listing import OVERLAP_PAGES
from tests.acceptance.test_cli import _env, _nightcrew
from tests.conftest import make_runtime

pytestmark = pytest.mark.acceptance
NOW = "2026-11-29T04:00:00Z"


def run_with_tty_stderr(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """stdout to a pipe, stderr to a pseudo-terminal: what an operator's shell gives a
    command whose report is redirected to a file."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [_nightcrew(), *args],
        env={**env, "TERM": "xterm-256color", "COLUMNS": "120"},
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done with its stderr
            break
        if not chunk:
            break
        seen += chunk
    stdout, _ = proc.communicate(timeout=120)
    os.close(leader)
    return proc.returncode, stdout, seen.decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["lifecycle", "run", "daily", "--now", NOW], "daily lane"),
        (["lifecycle", "reconcile", "--now", NOW], "starting"),  # its first frame
    ],
)
def test_a_terminal_gets_a_progress_display_and_a_pipe_does_not(
    fresh_db_url: str, tmp_path: Path, args: list[str], shown: str
) -> None:
    (tmp_path / "media" / "podcasts").mkdir(parents=True)
    env = _env(
        DATABASE_URL=fresh_db_url,
        STORAGE_URL=f"file://{tmp_path / 'media'}",
        R2_PUBLIC_URL="https://media.example.test",
        NIGHTCREW_LOG_LEVEL="warning",
    )
    code, stdout, terminal = run_with_tty_stderr(args, env)
    assert code == 0, terminal
    assert shown in terminal, terminal  # the display was drawn on the terminal
    if args[1] == "run":  # jobs done of the lane's, as the bar counts them
        assert re.search(r"[0-5]/5", terminal), terminal
    assert "\x1b[" not in stdout  # the report on stdout stays plain text

    piped = subprocess.run(
        [_nightcrew(), *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert piped.returncode == 0, piped.stderr
    assert "\x1b[" not in piped.stderr and "\x1b[" not in piped.stdout
    assert all(line.startswith("{") for line in piped.stderr.splitlines()), piped.stderr


async def test_the_listing_reports_objects_per_second_and_an_eta(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    """The reconciler's progress events during the listing carry its rate and, once a podcast
    prefix is done and others are not, an ETA; its report carries the rate too."""
    store = open_store(f"file://{tmp_path}")
    # one lister, prefix after prefix, and more prefixes than the pages the listing may buffer
    # ahead of its COPY (OVERLAP_PAGES): early progress events still have partitions left
    prefixes = OVERLAP_PAGES + 16
    for p in range(prefixes):
        await store.put(f"podcasts/p{p:03d}/e/e1/a.mp3", b"x" * 10)
    clock = FrozenClock(datetime(2026, 11, 29, 4, tzinfo=UTC))
    env = {"R2_PUBLIC_URL": "https://media.example.test", "RECONCILE_LIST_CONCURRENCY": "1"}
    runtime = await make_runtime(db, clock, fresh_db_url, env=env, store=store)
    events: list[tuple[str, int]] = []

    report = await run_reconcile(
        runtime, clock, ReconcileOptions(), progress=lambda phase, n: events.append((phase, n))
    )

    listing = [phase for phase, _ in events if phase.startswith("listing")]
    assert len(listing) == prefixes, events  # one event per page, a page per prefix here
    rate = r"[\d,]+ objects/s"
    assert all(re.fullmatch(rf"listing \({rate}, \d+/{prefixes} podcasts.*\)", p) for p in listing)
    # the third page's prefix was listed after two others were done, and at most OVERLAP_PAGES
    # more can have been listed ahead of the COPY: partitions are left, so an ETA is given
    done = re.fullmatch(rf"listing \({rate}, (\d+)/{prefixes} podcasts, ETA \d+ s\)", listing[2])
    assert done is not None and 2 <= int(done[1]) < prefixes, listing[2]
    assert report.listing.objects == prefixes and report.listing.objects_per_second > 0
    assert report.to_json()["listing"]["objectsPerSecond"] == report.listing.objects_per_second
