"""The slowest tests first, so the workers finish together.

A handful of tests take 20-125 s (a worker killed three times, a sign-in throttle measured over
40 guesses, a SIGKILL mid-reconcile). Left in collection order, one of them could start last
and keep the run going minutes after the other workers went idle. ``tests/durations.json``
records how long each test that takes a second or more ran last time it was measured; the
collection is sorted by it, longest first (a stable sort: the rest keep pytest's order, so
module fixtures are still shared), and pyproject's ``--dist load --maxschedchunk 1`` hands the
tests out one at a time in that order — longest-processing-time-first scheduling. (Handing
out whole modules instead, ``--dist loadscope``, so that a module's fixtures are built once,
measured 9 min 11 s against 6 min 45 s: the big modules' waits no longer overlap.)

The file is refreshed by running the suite with ``NIGHTCREW_TEST_DURATIONS=<path>`` (what the
run measured is merged into that file) and copying that file over it (see the README); a test
missing from it is simply scheduled with the fast ones, so a stale file costs time, never
correctness.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
RECORD = "NIGHTCREW_TEST_DURATIONS"
RECORDED_FROM_S = 1.0  # faster tests stay in collection order


def known_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def slowest_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Sort ``items`` in place, longest known duration first; unknown ones keep their order."""
    items.sort(key=lambda item: -durations.get(item.nodeid, 0.0))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slowest_first(items, known_durations())


_seconds: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # under xdist this runs in the controller too, with every worker's reports
    if os.environ.get(RECORD):
        _seconds[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(RECORD)
    if not target or hasattr(session.config, "workerinput"):
        return  # nothing asked, or an xdist worker (the controller writes the whole run)
    # merged into what the file holds: the default run and the slow tier (`-m slow`) each
    # refresh their own tests' entries, and a test now under RECORDED_FROM_S leaves it
    merged = known_durations(Path(target))
    for nodeid, seconds in _seconds.items():
        merged.pop(nodeid, None)
        if seconds >= RECORDED_FROM_S:
            merged[nodeid] = round(seconds, 2)
    Path(target).write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
