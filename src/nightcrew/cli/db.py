"""`nightcrew db`: apply or verify the schema."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nightcrew.cli.common import (
    _print_json,
    _run,
    _settings,
    db_app,
    open_database,
)


# --- db ------------------------------------------------------------------------------------------
@db_app.command("migrate")
def db_migrate(
    skip_reference: Annotated[
        bool,
        typer.Option(
            "--skip-reference",
            help="Apply only nightcrew's own tables (a production platform database).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Apply the numbered migrations that have not been applied yet."""
    from nightcrew.db.migrate import migrate

    settings = _settings()

    async def work() -> dict[str, list[str]]:
        async with open_database(settings) as db:
            return (await migrate(db, skip_reference=skip_reference)).to_json()

    result = _run(work, settings)
    if as_json:
        _print_json(result)
        return
    for label in result["applied"]:
        typer.echo(f"applied  {label}")
    for label in result["skipped"]:
        typer.echo(f"skipped  {label} (reference schema)")
    if not result["applied"]:
        typer.echo(f"up to date ({len(result['already_applied'])} migrations already applied)")


@db_app.command("check")
def db_check(
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Compare the database with what nightcrew needs: column types, function signatures,
    triggers, unique indexes, and what the role it connects as may do (grants, row-level
    security). One line per mismatch; exit 1 if any."""
    from nightcrew.db.check import check_schema

    settings = _settings()

    async def work() -> dict[str, Any]:
        async with open_database(settings) as db:
            return (await check_schema(db)).to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
    else:
        for table, result in report["tables"].items():
            typer.echo(f"{_label(result)} {table}")
            for problem in [*result["problems"], *result["privileges"]]:
                typer.echo(f"          - {problem}")
            for note in result["notes"]:
                typer.echo(f"          = {note}")
            for advice in result["advice"]:
                typer.echo(f"          ~ {advice}")
        for name, result in report["functions"].items():
            if result["ok"]:
                typer.echo(f"ok      function {name}{result['expected']}")
            for problem in result["problems"]:
                typer.echo(f"{_label(result)} {problem}")
            for problem in result["privileges"]:
                typer.echo(f"DENIED  {problem}")
        for problem in report["role"]["problems"]:
            typer.echo(f"DENIED  {problem}")
        shown = {
            p
            for result in report["functions"].values()
            for p in [*result["problems"], *result["privileges"]]
        } | set(report["role"]["problems"])
        for problem in report["problems"]:
            if problem not in shown:
                typer.echo(f"MISSING {problem}")
        typer.echo("schema ok" if report["ok"] else "schema incomplete")
    if not report["ok"]:
        raise typer.Exit(1)


def _label(result: dict[str, Any]) -> str:
    if result["ok"]:
        return "ok     "
    if result["missing"]:
        return "MISSING"
    return "WRONG  " if result["problems"] else "DENIED "


# --- effects -------------------------------------------------------------------------------------
