"""Assembly: the runtime with every domain's parts plugged in — the one place serve, the CLI,
the demo, the benchmarks and the tests open a runtime from.

It sits above the domains (``runtime.py`` sits below them, so that a domain can take a Runtime
without the runtime importing any domain): the lifecycle's effect kinds are registered here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.effects.deliver import BUILT_IN
from nightcrew.lifecycle.effect_kinds import effect_handlers
from nightcrew.runtime import Runtime, assemble


@asynccontextmanager
async def open_runtime(
    settings: Settings, clock: Clock, **overrides: Any
) -> AsyncIterator[Runtime]:
    """Every adapter, from Settings, with the lifecycle's effect kinds. ``overrides`` replace
    single adapters by field name (a test's recording mailer, a benchmark's memory store);
    ``db=`` an open Database is used as it is, not opened (nor closed); ``reviewer=`` replaces
    the news worker's configured reviewer (the demo's offline rules)."""
    async with assemble(settings, clock, effect_handlers=effect_handlers(), **overrides) as runtime:
        yield runtime


def effect_kinds() -> tuple[str, ...]:
    """Every kind of effect an assembled runtime delivers (what the dashboard lists and
    accepts), built in or registered."""
    return (*BUILT_IN, *effect_handlers())
