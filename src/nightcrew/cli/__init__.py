"""The command line. Thin: parse, build a Runtime, call a lane, print its report.

One module per command group (db, effects, lifecycle, news, news_sources, news_pipeline,
serve); ``common`` holds the Typer
apps and the exit-code discipline: 0 when a run completed, 1 when a check found problems or a
run failed outright, 2 when nothing could start — always with one line on stderr.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["app", "main"]


def main() -> None:
    """The ``nightcrew`` command. ``--version`` answers before the commands are imported."""
    if sys.argv[1:] == ["--version"]:
        from nightcrew import __version__

        print(f"nightcrew {__version__}")
        return
    _commands().main()


def _commands() -> Any:
    from nightcrew.cli import (  # noqa: F401 - they register
        common,
        db,
        effects,
        lifecycle,
        news,
        news_pipeline,
        news_sources,
        serve,
    )

    return common


def __getattr__(name: str) -> Any:
    # ``from nightcrew.cli import app``: the Typer app with every command registered
    if name == "app":
        return _commands().app
    raise AttributeError(name)
