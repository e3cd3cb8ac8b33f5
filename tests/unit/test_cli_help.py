"""Every help page, as `nightcrew … --help` prints it: labels that say something."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from nightcrew.cli import app

TYPE_ONLY = re.compile(r"<(?:str|int|float|bool)(?: range)?>")


def _paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _paths(sub, (*path, name))


PATHS = list(_paths(typer.main.get_command(app)))


def _help(*path: str) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "160"}, terminal_width=160)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "nightcrew")
def test_no_help_page_labels_a_parameter_with_only_its_python_type(path: tuple[str, ...]) -> None:
    page = _help(*path)
    assert not TYPE_ONLY.search(page), page


def test_the_labels_that_say_something_stay() -> None:
    assert re.search(r"--shard +SHARD ", _help("news", "run"))
    assert re.search(r"--now +ISO ", _help("lifecycle", "run"))
    assert "<minute|daily>" in _help("lifecycle", "run")
    worker = _help("news", "worker")
    assert "<fetch|enrich|review|write|all>" in worker and "1<=x<=1000" in worker
    assert re.search(r"--json +Print", _help("news", "run"))  # a flag: no label at all


def test_the_top_level_help_names_both_workers_and_serve() -> None:
    page = " ".join(_help().split())
    assert "lifecycle: the podcast platform's lanes" in page
    assert "news: the news platform's RSS ingestion" in page and "news worker" in page
    assert "RabbitMQ pipeline" in page
    assert "serve: the dashboard, /health and /metrics" in page
