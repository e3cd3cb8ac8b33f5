"""The suite's own after-check (``tests/support/hygiene.py``) on a git checkout of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.hygiene import checkout_state


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_a_tests_output_is_seen_and_bytecode_and_edited_code_are_not(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text(".hypothesis/\n__pycache__/\n*.log\n")
    _git(tmp_path, "add", ".gitignore")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    before = checkout_state(tmp_path)
    assert before == set()
    (tmp_path / ".hypothesis").mkdir()
    (tmp_path / ".hypothesis" / "examples").write_text("x")
    (tmp_path / "run.log").write_text("x")
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "src" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "__pycache__" / "m.pyc").write_bytes(b"")
    (tmp_path / "src" / "new_module.py").write_text("")
    assert checkout_state(tmp_path) == {"!! .hypothesis/", "!! run.log", "?? report.json"}


def test_outside_git_there_is_nothing_to_compare(tmp_path: Path) -> None:
    assert checkout_state(tmp_path / "nowhere") is None
