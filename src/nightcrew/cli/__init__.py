"""The command line. Thin: parse, build a Runtime, call a lane, print its report.

One module per command group (db, effects, lifecycle, news, news_sources, news_pipeline,
serve); ``common`` holds the Typer
apps and the exit-code discipline: 0 when a run completed, 1 when a check found problems or a
run failed outright, 2 when nothing could start — always with one line on stderr.
"""

from __future__ import annotations

from nightcrew.cli import (  # noqa: F401 - they register
    db,
    effects,
    lifecycle,
    news,
    news_pipeline,
    news_sources,
    serve,
)
from nightcrew.cli.common import app, main

__all__ = ["app", "main"]
