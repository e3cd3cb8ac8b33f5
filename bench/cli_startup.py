"""How long the command line takes to start: `nightcrew --version`, `--help`, each command's
`--help`, and the imports a command adds when it runs (its modules, then the runtime's
adapters), each the median of ``--runs`` fresh processes on this machine.

    .venv/bin/python -m bench.cli_startup [--runs 7]

Targets (issue 36): `--version` <= 0.35 s, `--help` <= 0.6 s."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

NIGHTCREW = str(Path(sys.executable).parent / "nightcrew")

COMMANDS = [
    ("nightcrew --version", [NIGHTCREW, "--version"]),
    ("nightcrew --help", [NIGHTCREW, "--help"]),
    ("nightcrew lifecycle run --help", [NIGHTCREW, "lifecycle", "run", "--help"]),
    ("nightcrew news run --help", [NIGHTCREW, "news", "run", "--help"]),
    ("nightcrew serve --help", [NIGHTCREW, "serve", "--help"]),
    ("nightcrew db migrate --help", [NIGHTCREW, "db", "migrate", "--help"]),
]
# what a command imports once it runs, on top of the command line itself
IMPORTS = [
    ("settings (nightcrew.config)", "nightcrew.config"),
    ("the runtime and its adapters (nightcrew.runtime)", "nightcrew.runtime"),
    ("a lane's jobs (nightcrew.lifecycle.lanes)", "nightcrew.lifecycle.lanes"),
    ("the news run (nightcrew.news.engines.inline)", "nightcrew.news.engines.inline"),
    ("serve's web app (nightcrew.http)", "nightcrew.http"),
]


def _median(argv: list[str], runs: int) -> float:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"median of {args.runs} fresh processes each")
    for label, argv in COMMANDS:
        print(f"  {label:<52} {_median(argv, args.runs):6.3f} s")
    base = _median([sys.executable, "-c", "import nightcrew.cli.common"], args.runs)
    print(f"  {'python + the command line (nightcrew.cli.common)':<52} {base:6.3f} s")
    for label, module in IMPORTS:
        both = _median([sys.executable, "-c", f"import nightcrew.cli.common, {module}"], args.runs)
        print(f"  + {label:<50} {both - base:+6.3f} s")


if __name__ == "__main__":
    main()
