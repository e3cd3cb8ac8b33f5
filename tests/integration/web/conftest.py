"""The browser the dashboard's Chromium tests drive: Debian's chromium through Playwright,
one per test module; skipped, saying why, where there is none."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.browser import CHROMIUM_ARGS, chromium_path


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install -e '.[test]')")
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium to drive: apt-get install -y chromium (.ci/run does)")
    async with async_playwright() as p:
        try:
            launched = await p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        except Exception as exc:  # the reason is the skip message
            pytest.skip(f"Chromium at {executable} did not start: {exc}")
        try:
            yield launched
        finally:
            await launched.close()
