"""`nightcrew lifecycle`: the lanes, the reconciler, the overage escalation."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nightcrew.cli.common import Lane, NowOption, _fail, _run_and_print, lifecycle_app
from nightcrew.clock import Clock
from nightcrew.errors import NightcrewError
from nightcrew.log import event

if TYPE_CHECKING:
    from nightcrew.jsonable import JsonObject
    from nightcrew.runtime import Runtime


# --- lifecycle -----------------------------------------------------------------------------------
@lifecycle_app.command("run")
def lifecycle_run(
    lane: Annotated[Lane, typer.Argument(help="Which lane to run once.")],
    now: NowOption = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Report what the run would do; change nothing."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run one lane once and print its report."""
    from nightcrew.lifecycle.lanes import run_lane
    from nightcrew.operator_actions import CLI, run_lane_now

    async def job(runtime: Runtime, clock: Clock) -> JsonObject:
        if dry_run:  # no run record, so nothing to be exclusive of
            report = await run_lane(runtime, clock, lane.value, dry_run=True)
            assert report is not None  # manual runs always run
            return report.to_json()
        # the dashboard's "run now" too: refused while the lane runs, never doubling a slot
        if as_json or not sys.stderr.isatty():
            return await run_lane_now(runtime, clock, CLI, lane.value)
        with _job_progress(f"{lane.value} lane") as progress:
            return await run_lane_now(runtime, clock, CLI, lane.value, progress=progress)

    def cannot_start(exc: BaseException) -> None:
        from nightcrew.lifecycle.lanes import could_not_start

        could_not_start(lane.value, trigger="manual", slot=None, exc=exc)

    _run_and_print(
        job,
        now=now,
        as_json=as_json,
        summary=_print_lane_summary,
        cannot_start=None if dry_run else cannot_start,
    )


def _print_lane_summary(report: JsonObject) -> None:
    run = "dry run (nothing changed)" if report["dry_run"] else f"run {report['run_id']}"
    typer.echo(
        f"{report['lane']} lane as of {report['now']} — {run}, {report['durationMs']:.0f} ms"
    )
    for name, job in report["jobs"].items():
        counts = ", ".join(
            f"{k}={v}"
            for k, v in job.items()
            if isinstance(v, int) and not isinstance(v, bool) and k != "durationMs"
        )
        status = {"ok": "ok     ", "skipped": "skipped", "failed": "FAILED "}[job["status"]]
        detail = job.get("error") or (
            f"skipped: {job['skipped']}" if job.get("skipped") else counts
        )
        typer.echo(f"  {status} {name:<36} {job['durationMs']:>7.1f} ms  {detail}")
    for failure in report["errors"]:
        ids = ", ".join(
            f"{k}={v}"
            for k, v in failure.items()
            if k not in ("job", "event", "error") and isinstance(v, str | int)
        )
        typer.echo(f"  ! {failure['event']}: {failure['error']}" + (f" ({ids})" if ids else ""))


@lifecycle_app.command("reconcile")
def lifecycle_reconcile(
    apply: Annotated[
        bool, typer.Option("--apply", help="Perform mutations (default: dry run).")
    ] = False,
    quarantine_missing: Annotated[
        bool,
        typer.Option(
            "--quarantine-missing", help="(apply) Null the audio of episodes whose object is gone."
        ),
    ] = False,
    skip_orphan_delete: Annotated[
        bool, typer.Option("--skip-orphan-delete", help="Report orphans only, even with --apply.")
    ] = False,
    bypass_cap_for_backfill: Annotated[
        bool,
        typer.Option(
            "--bypass-cap-for-backfill",
            help="(apply) Disable only the storage-cap trigger for the backfill.",
        ),
    ] = False,
    min_orphan_age_hours: Annotated[
        int,
        typer.Option(
            "--min-orphan-age-hours",
            metavar="N",
            help="Minimum orphan age in hours (clamped to 24-720).",
        ),
    ] = 24,
    now: NowOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Reconcile stored audio with the episodes table: dry run first, read, then --apply."""
    from nightcrew.lifecycle.reconcile.core import ReconcileOptions
    from nightcrew.lifecycle.reconcile.engine import run_reconcile

    options = ReconcileOptions(
        mode="apply" if apply else "dryrun",
        quarantine_missing=quarantine_missing,
        skip_orphan_delete=skip_orphan_delete,
        bypass_cap_for_backfill=bypass_cap_for_backfill,
        min_orphan_age_hours=min_orphan_age_hours,
    )

    async def job(runtime: Runtime, clock: Clock) -> JsonObject:
        if as_json or not sys.stderr.isatty():
            report = await run_reconcile(runtime, clock, options)
        else:
            report = await _with_progress(runtime, clock, options, run_reconcile)
        event("reconcile_completed", **report.summary().to_json())
        return report.to_json()

    _run_and_print(job, now=now, as_json=as_json, summary=_print_reconcile_summary)


@contextmanager
def _job_progress(title: str) -> Iterator[Callable[[str, int, int], None]]:
    """A bar on stderr (a terminal only): jobs done of the lane's, and the one running."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(title, total=None)

        def tick(job: str, done: int, total: int) -> None:
            state = "done" if done == total else job
            bar.update(task, description=f"{title}: {state}", completed=done, total=total)
            bar.refresh()  # a job's start and end are rare: draw each, not the next 10 Hz frame

        yield tick


async def _with_progress(runtime: Any, clock: Clock, options: Any, run: Any) -> Any:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),  # stdout is the report's
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=None)

        def tick(phase: str, count: int) -> None:
            bar.update(task, description=f"{phase}: {count:,}")

        return await run(runtime, clock, options, progress=tick)


def _print_reconcile_summary(report: JsonObject) -> None:
    mode = "APPLY" if report["mode"] == "apply" else "dry run (nothing changed)"
    listing, size, missing = report["listing"], report["sizeBackfill"], report["missing"]
    typer.echo(f"storage reconcile — {mode}, as of {report['now']}, {report['durationMs']:.0f} ms")
    typer.echo(
        f"  listing        {listing.get('objects', 0):,} objects, "
        f"{listing.get('bytes', 0):,} bytes, {listing.get('listRequests', 0)} list requests"
    )
    typer.echo(
        f"  size backfill  {size.get('mismatched', 0):,} wrong or missing sizes, "
        f"{size.get('written', 0):,} written, "
        f"{len(size.get('blockedOverCap', [])):,} blocked by the storage cap"
    )
    typer.echo(
        f"  missing        {missing.get('count', 0):,} episodes without their object, "
        f"{missing.get('quarantined', 0):,} quarantined"
    )
    if report["outbox"]:
        o = report["outbox"]
        typer.echo(f"  outbox         {o['delivered']:,} delivered, {o['failed']:,} failed")
    for key, label in (
        ("orphans", "orphan audio"),
        ("episodeImages", "episode images"),
        ("transcribePrep", "expired prep"),
    ):
        s = report[key]
        typer.echo(
            f"  {label:<14} {s['count']:,} found ({s['bytes']:,} bytes), "
            f"{s['tooYoung']:,} too young, {s['eligible']:,} eligible, "
            f"{s['deleted']:,} deleted"
        )
        for sample in s["sample"][:5]:
            typer.echo(f"                   {sample['key']}")
    typer.echo(f"  media jobs     {report['mediaJobs'].get('flagged', 0)} wedged")
    typer.echo(f"  over cap       {len(report['overCap'])} billing accounts (report only)")
    for failure in report["errors"]:
        typer.echo(f"  ! {failure.get('event')}: {failure.get('error')}")
    if report["mode"] != "apply":
        typer.echo("  (--json shows up to 20 sample keys per category; --apply to act)")


@lifecycle_app.command("overage")
def lifecycle_overage(
    account: Annotated[
        str, typer.Option("--account", metavar="ID", help="The billing account's id.")
    ],
    now: NowOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report what would happen; change nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run the overage escalation for one account (what the payment webhook calls)."""
    import uuid

    from nightcrew.lifecycle.overage import reconcile_account_overage

    try:
        account_id = str(uuid.UUID(account))
    except ValueError:
        _fail(f"--account: {account!r} is not a billing account id (a UUID)", 2)

    async def job(runtime: Runtime, clock: Clock) -> JsonObject:
        view = runtime.dry_run_view(clock) if dry_run else runtime
        report = await reconcile_account_overage(view, clock, account_id)
        if report.scanned == 0:
            raise NightcrewError(f"no billing account {account_id}")
        return {"account_id": account_id, "dry_run": dry_run, **report.to_json()}

    _run_and_print(job, now=now, as_json=as_json, summary=_print_overage_summary)


def _print_overage_summary(report: JsonObject) -> None:
    mode = "dry run (nothing changed)" if report["dry_run"] else "done"
    typer.echo(f"overage escalation for {report['account_id']} — {mode}")
    for key in ("armed", "emails_sent", "suspended_podcasts", "restored_podcasts"):
        typer.echo(f"  {key:<20} {report[key]}")
    for claim in report["claims"]:
        typer.echo(f"  claimed stage {claim['stage']}")
    for failure in report["errors"]:
        typer.echo(f"  ! {failure.get('event')}: {failure.get('error')}")
