"""`nightcrew effects`: list, re-drive and drop what the effects outbox owes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from nightcrew.cli.common import (
    EffectKind,
    _fail,
    _print_json,
    _run,
    _settings,
    effects_app,
    open_database,
    open_runtime,
)
from nightcrew.clock import SystemClock

if TYPE_CHECKING:
    from nightcrew.effects.outbox import Dropped, Effect
    from nightcrew.operator_actions import EffectRetried

KindOption = Annotated[EffectKind | None, typer.Option("--kind", help="Only effects of this kind.")]


@effects_app.command("list")
def effects_list(
    kind: KindOption = None,
    dead: Annotated[bool, typer.Option("--dead", help="Only dead effects (given up).")] = False,
    limit: Annotated[
        int, typer.Option("--limit", min=1, metavar="N", help="At most this many.")
    ] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """Effects not yet delivered: pending (being retried) and dead, oldest first."""
    from nightcrew.effects import outbox

    settings = _settings()

    async def work() -> list[Effect]:
        async with open_database(settings) as db:
            return await outbox.list_undelivered(
                db, kind=kind.value if kind else None, dead=True if dead else None, limit=limit
            )

    found = _run(work, settings)
    if as_json:
        _print_json([e.to_json() for e in found])
        return
    if not found:
        typer.echo("no dead effects" if dead else "nothing owed: every effect is delivered")
        return
    for e in found:
        state = f"dead since {e.dead_at.isoformat()}" if e.dead_at else "pending"
        typer.echo(f"{e.id:>8}  {e.kind:<15} {state:<40} attempts={e.attempts}  {e.key}")
        if e.last_error:
            typer.echo(f"          last error: {e.last_error}")
    if any(e.dead_at for e in found):
        typer.echo("re-drive with: nightcrew effects retry ID  (or --dead [--kind K])")


@effects_app.command("retry")
def effects_retry(
    effect_id: Annotated[int | None, typer.Argument(help="The effect to re-drive.")] = None,
    dead: Annotated[bool, typer.Option("--dead", help="Re-drive every dead effect.")] = False,
    kind: KindOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Make undelivered effects due now with a fresh maximum age, and attempt them at once.

    A retry more than 24 hours after the first attempt is outside the providers' idempotency
    window: an email that did arrive (but was never confirmed) may arrive twice.
    """
    from nightcrew.operator_actions import CLI, retry_effects

    if (effect_id is None) == (not dead):
        _fail("effects retry: give an effect ID or --dead (not both)", 2)
    if kind is not None and not dead:
        _fail("effects retry: --kind goes with --dead", 2)
    settings = _settings()
    clock = SystemClock()

    async def work() -> list[EffectRetried]:
        async with open_runtime(settings, clock) as runtime:
            result = await retry_effects(
                runtime,
                clock,
                CLI,
                ids=[effect_id] if effect_id is not None else [],
                all_dead=dead,
                kind=kind.value if kind else None,
            )
            return result.retried

    outcomes = _run(work, settings)
    if effect_id is not None and not outcomes:
        _fail(
            f"effects retry: no undelivered effect {effect_id} at rest "
            "(delivered, being delivered right now, or no such effect)",
            1,
        )
    if as_json:
        typer.echo(json.dumps([o.to_json() for o in outcomes], indent=2))
        return
    for o in outcomes:
        detail = "delivered" if o.outcome == "delivered" else f"{o.outcome}: {o.error}"
        typer.echo(f"{o.id:>8}  {o.kind:<15} {detail}")
    if not outcomes:
        typer.echo("no dead effects to retry")


@effects_app.command("drop")
def effects_drop(
    effect_id: Annotated[int, typer.Argument(help="The undelivered effect to forget.")],
) -> None:
    """Forget an undelivered effect for good: it will never be delivered."""
    from nightcrew.operator_actions import CLI, drop_effect

    settings = _settings()

    async def work() -> Dropped | None:
        async with open_database(settings) as db:
            return await drop_effect(db, SystemClock(), CLI, effect_id)

    dropped = _run(work, settings)
    if dropped is None:
        _fail(f"effects drop: no undelivered effect {effect_id}", 1)
    typer.echo(f"dropped effect {effect_id} ({dropped.kind} {dropped.key})")
