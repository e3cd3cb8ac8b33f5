"""The ``nightcrew`` command sets the collector up before any command runs (gc_tuning.py):
its imports frozen out of the collector's walks, young collections every 10,000 allocations.
Checked in a process of its own: the collector's settings are the whole process's."""

from __future__ import annotations

import subprocess
import sys

from nightcrew.gc_tuning import YOUNG_THRESHOLD

PROBE = """
import gc, sys
from nightcrew.cli import common
sys.argv = ["nightcrew", "--help"]
try:
    common.main()
except SystemExit:
    pass
print(gc.get_threshold()[0], gc.get_freeze_count(), file=sys.stderr)
"""


def test_the_command_freezes_its_imports_and_collects_the_young_less_often() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    threshold, frozen = (int(x) for x in probe.stderr.split()[-2:])
    assert threshold == YOUNG_THRESHOLD != 700  # CPython's default young threshold is 700
    assert frozen > 10_000  # the CLI's imports: typer, pydantic, psycopg, nightcrew, ...
