"""The command line imports what a command needs when it runs, not at its start: `nightcrew
--help` in a fresh interpreter loads no driver and no web stack (bench.cli_startup times it)."""

from __future__ import annotations

import subprocess
import sys

# what a running command loads (its adapters, serve's app), never `--help`
NOT_AT_START = (
    "starlette",
    "uvicorn",
    "anyio",
    "jinja2",
    "psycopg",
    "psycopg_pool",
    "obstore",
    "httpx",
    "openai",
    "stripe",
    "aio_pika",
    "redis",
    "feedparser",
    "pydantic",
)

_PROBE = """
import sys
sys.argv = ["nightcrew", "--help"]
from nightcrew.cli import main
try:
    main()
except SystemExit:
    pass
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})), file=sys.stderr)
"""


def test_help_imports_no_driver_and_no_web_stack() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Usage" in done.stdout  # the help was printed: the probe ran the real command
    loaded = set(done.stderr.split())
    assert "typer" in loaded and "nightcrew" in loaded
    assert sorted(loaded.intersection(NOT_AT_START)) == []
