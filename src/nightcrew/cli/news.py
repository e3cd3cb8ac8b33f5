"""`nightcrew news run`: one run (inline) or pass (pipeline) of a shard, and its report in words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from nightcrew.cli.common import (
    NowOption,
    _clock,
    _fail,
    _print_json,
    _run,
    _settings,
    news_app,
    open_runtime,
)

if TYPE_CHECKING:
    from nightcrew.jsonable import JsonObject
    from nightcrew.news.report import Trigger


@news_app.command("run")
def news_run(
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            help="Which shard to run (default: the one NEWS_SHARDS names, else 'default').",
        ),
    ] = None,
    manual: Annotated[
        bool,
        typer.Option(
            "--manual",
            help="A manual run, recorded in the run history as lane news:SHARD (refused while"
            " a run of it is running; a held lock is answered with a skipped report).",
        ),
    ] = False,
    scheduled: Annotated[
        bool,
        typer.Option(
            "--scheduled",
            help="Record the run as scheduled, not manual: for a cron or timer that calls this"
            " command (a held lock is then a warning, as serve's own slots make it).",
        ),
    ] = False,
    now: NowOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run one shard of the news worker once and print its report.

    With NEWS_PIPELINE=rabbitmq this is a pass, under the shard lock as a run: the shard's due
    sources go to the fetch queue and the pass waits for them, then admits at most the queue
    limit of what waits, oldest first; the stage workers do the rest.
    A run fenced out by a newer holder of the shard's lease ends as superseded (exit 0)."""
    from nightcrew.news.schedule import run_or_enqueue, shard_lane
    from nightcrew.operator_actions import CLI, run_lane_now

    settings = _settings()
    clock = _clock(now)
    if shard is None:
        shard = _default_shard(settings.news_shard_list)
    elif not shard.strip():
        _fail("news run: --shard is empty; give a shard name (NEWS_SHARDS names them)", 2)

    async def work() -> JsonObject:
        assert shard is not None  # chosen above; mypy cannot see into the closure
        async with open_runtime(settings, clock) as runtime:
            if manual:  # the dashboard's "run now": in the run history, one at a time
                return await run_lane_now(runtime, clock, CLI, shard_lane(shard))
            trigger: Trigger = "scheduled" if scheduled else "manual"
            report = await run_or_enqueue(runtime, clock, shard, trigger=trigger)
            return report.to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
        return
    _print_report(report)


def _default_shard(configured: list[str]) -> str:
    """The shard a `news run` without --shard runs, said on stderr (never a silent guess); with
    several in NEWS_SHARDS there is no right guess, and the command asks."""
    if len(configured) > 1:
        _fail(f"news run: give --shard (NEWS_SHARDS names {', '.join(configured)})", 2)
    shard = configured[0] if configured else "default"
    source = "the one NEWS_SHARDS names" if configured else "NEWS_SHARDS is not set"
    typer.echo(
        f"nightcrew: news run: no --shard given: running shard {shard!r} ({source})", err=True
    )
    return shard


def _print_report(report: JsonObject) -> None:
    """Either engine's report in words: an inline run's, or a pipeline pass's — what it found
    and decided, its own figures, and its workers' results since the previous report, named as
    theirs (--json keeps the spec's field names)."""
    pipeline = report.get("pipeline") == "rabbitmq"
    status = report.get("status") or ("skipped" if report.get("skipped") else "completed")
    if status == "skipped":
        state = "skipped (locked)"
    elif status == "superseded":
        state = "superseded (a newer holder of the shard's lease wrote first)"
    else:
        state = "deferred" if report["deferredReasons"] else "done"
    what = "pass " if pipeline else ""
    typer.echo(f"news shard {report['shard']}: {what}{state}, {report['durationMs']:.0f} ms")
    # aiReviewedCount counts every verdict, the offline rules' too: the label says whose
    reviewer = report.get("reviewer") or "model"
    rows: list[tuple[str, object]] = [
        ("queued", report["queuedCount"]),
        ("processed (written)", report["processedCount"]),
        (f"reviewed ({reviewer})", report["aiReviewedCount"]),
        ("accepted", report["acceptedCount"]),
        ("rejected", report["rejectedCount"]),
        ("translated", report.get("translatedCount", 0)),
        *_tokens_row(report, reviewer),
        ("deferred", report["deferredCount"]),
        ("retried (no thumbnail)", report["retriedCount"]),
        ("locked", report["lockedCount"]),
        ("review locks held elsewhere", report["redisAiReviewLockSkippedCount"]),
        ("Redis", "yes" if report["redisEnabled"] else "no (PostgreSQL leases)"),
    ]
    if pipeline:
        rows += [
            ("sources enqueued", report["enqueuedSources"]),
            ("sources not fetched in time", report["unfetchedSources"]),
            ("admitted into the stages", report["admittedCount"]),
            ("sent again", report["resentCount"]),
            ("relayed from the outbox", report["relayedCount"]),
        ]
        for stage, states in report["stages"].items():
            counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "empty"
            rows.append((f"stage {stage}", counts))
    for label, value in rows:
        typer.echo(f"  {label:<32} {value}")
    if report.get("backpressureDbArticleCountError"):
        typer.echo(f"  ! article count failed: {report['backpressureDbArticleCountError']}")
    for reason in report["deferredReasons"]:
        typer.echo(f"  deferred: {reason}")
    for failure in report["fetchErrors"]:
        typer.echo(f"  ! {failure['source']}: {failure['error']}")
    for failure in report.get("writeErrors", []):
        typer.echo(f"  ! {failure['url']}: {failure['error']}")
    for dropped in report.get("droppedItems", []):
        typer.echo(f"  - {dropped['source']}: {dropped['count']} dropped ({dropped['reason']})")
    workers = report.get("workers")
    if pipeline and workers is not None:
        since = workers.get("since")
        typer.echo(f"  the workers, {f'since {since}' if since else 'since the start'}:")
        for label, name in (
            ("written", "processedCount"),
            (f"reviewed ({reviewer})", "aiReviewedCount"),
            ("accepted", "acceptedCount"),
            ("rejected", "rejectedCount"),
            ("translated", "translatedCount"),
            ("review locks held elsewhere", "redisAiReviewLockSkippedCount"),
            ("fetches behind another's lease", "fetchLeaseSkippedCount"),
            ("waiting for a review retry", "reviewRetryCount"),
        ):
            typer.echo(f"    {label:<30} {workers[name]}")
        for label, value in _tokens_row(workers, reviewer):
            typer.echo(f"    {label:<30} {value}")
        if not workers["redisEnabled"]:
            typer.echo("    Redis                          failed in a worker")
        for failure in workers["writeErrors"]:
            typer.echo(f"    ! {failure['url']}: {failure['error']}")


def _tokens_row(figures: JsonObject, reviewer: str) -> list[tuple[str, object]]:
    """The model's tokens (prompt / completion), for a model's report only: the offline rules
    spend none."""
    if reviewer != "model":
        return []
    prompt, answer = figures.get("aiPromptTokens", 0), figures.get("aiCompletionTokens", 0)
    return [("model tokens (prompt/completion)", f"{prompt} / {answer}")]
