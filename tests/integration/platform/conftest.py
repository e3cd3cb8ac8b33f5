"""Fixtures for running nightcrew on the platform twin (tests/support/platform_twin.sql).

The twin is built once per session as two template databases — the bare platform, and the
platform after `nightcrew db migrate --skip-reference` — and every test gets a clone of one.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from tests.support.platform_twin import (
    clone_database,
    create_twin,
    drop_database,
    migrate_skip_reference,
)

_counter = itertools.count()


@pytest.fixture(scope="session")
def bare_twin_template(pg_admin_url: str) -> Iterator[str]:
    """The platform as spec 000 shapes it, and nothing of nightcrew's."""
    name = f"nightcrew_twin_bare_{os.getpid()}"
    create_twin(pg_admin_url, name)
    yield name
    drop_database(pg_admin_url, name)


@pytest.fixture(scope="session")
def twin_template(pg_admin_url: str, bare_twin_template: str) -> Iterator[str]:
    """The platform with nightcrew installed the production way (--skip-reference)."""
    name = f"nightcrew_twin_{os.getpid()}"
    drop_database(pg_admin_url, name)
    migrate_skip_reference(clone_database(pg_admin_url, bare_twin_template, name))
    yield name
    drop_database(pg_admin_url, name)


@pytest.fixture
def bare_twin_url(pg_admin_url: str, bare_twin_template: str) -> Iterator[str]:
    """A fresh platform twin of this test's own, nightcrew not yet installed."""
    name = f"nightcrew_twin_b_{os.getpid()}_{next(_counter)}"
    yield clone_database(pg_admin_url, bare_twin_template, name)
    drop_database(pg_admin_url, name)


@pytest.fixture
def twin_url(pg_admin_url: str, twin_template: str) -> Iterator[str]:
    """A fresh platform twin of this test's own, with nightcrew's schema installed."""
    name = f"nightcrew_twin_t_{os.getpid()}_{next(_counter)}"
    yield clone_database(pg_admin_url, twin_template, name)
    drop_database(pg_admin_url, name)
