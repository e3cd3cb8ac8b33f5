"""What the suite leaves behind, checked when it ends: nothing new in the checkout (``git status
--ignored``), and no key without a TTL in the tests' Redis database. A run that leaves either
fails, naming what it left, whatever its tests said.

Two things are not the suite's to answer for: Python's own bytecode caches (``__pycache__``,
written by any import) and, for untracked files, the directories people edit (``src``,
``tests``, ``bench``, ``docs``: a file created there while the suite runs is someone's work, not
a test's output). Ignored files are checked everywhere: a test's output is what .gitignore
hides (``.hypothesis/``, ``.pytest_cache/``, ``.nightcrew/``).

Hypothesis keeps its example database outside the checkout (in the system's temporary
directory, so examples still replay from run to run), and pytest's cache provider is off
(``-p no:cacheprovider`` in pyproject.toml).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from tests.support.services import REDIS_URL, REDIS_VARIABLE, configured, skip_reason

CHECKOUT = Path(__file__).resolve().parents[2]
EDITED = ("src/", "tests/", "bench/", "docs/")

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "nightcrew-hypothesis")

_before: set[str] | None = None


def checkout_state(root: Path = CHECKOUT) -> set[str] | None:
    """``git status --ignored`` entries that would be a test's output; None outside git."""
    try:
        out = subprocess.run(
            ["git", "status", "--ignored", "--porcelain"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    entries = set()
    for line in out.splitlines():
        status, path = line[:2], line[3:]
        if "__pycache__" in path:
            continue
        if status == "??" and path.startswith(EDITED):
            continue
        if status in ("??", "!!"):
            entries.add(f"{status} {path}")
    return entries


def redis_keys_without_ttl(url: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        return sorted(
            key.decode(errors="replace")
            for key in client.scan_iter(count=1000)
            if client.ttl(key) == -1
        )
    finally:
        client.close()


def _xdist_worker(session: pytest.Session) -> bool:
    # under pytest-xdist the controller checks, once every worker is done: a worker finishing
    # early would see another's test in flight (a key between its SADD and its EXPIRE)
    return hasattr(session.config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    global _before
    if not _xdist_worker(session):
        _before = checkout_state()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _xdist_worker(session):
        return
    problems: list[str] = []
    after = checkout_state()
    if _before is not None and after is not None and (left := sorted(after - _before)):
        problems.append(f"the suite wrote into the checkout: {', '.join(left)}")
    if REDIS_URL and skip_reason(REDIS_VARIABLE, configured(REDIS_VARIABLE)) is None:
        if bare := redis_keys_without_ttl(REDIS_URL):
            shown = ", ".join(bare[:10]) + (" …" if len(bare) > 10 else "")
            problems.append(f"{len(bare)} Redis key(s) left without a TTL: {shown}")
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for problem in problems:
            if reporter is not None:
                reporter.write_line(f"HYGIENE: {problem}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
