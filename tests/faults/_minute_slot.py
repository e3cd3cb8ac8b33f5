"""Run the minute lane's 04:00 slot as a scheduled run, in a process of its own, through the
command line's own error handling (one line on stderr, exit 2 when the database is lost), with
whatever settings the environment gives — the defaults, unless the test sets some.

``python -m tests.faults._minute_slot`` (DATABASE_URL and the rest from the environment)
"""

from __future__ import annotations

import sys

import typer

from nightcrew.assembly import open_runtime
from nightcrew.cli.common import _run, _settings
from nightcrew.clock import FrozenClock
from nightcrew.lifecycle.lanes import run_lane
from tests.conftest import NOW


def main() -> int:
    settings = _settings()
    clock = FrozenClock(NOW)

    async def work() -> None:
        async with open_runtime(settings, clock) as runtime:
            await run_lane(runtime, clock, "minute", trigger="scheduled", slot=NOW)

    try:
        _run(work, settings)
    except typer.Exit as exit_:
        return int(exit_.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
