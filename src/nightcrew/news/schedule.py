"""The news worker's schedules: one per shard, running the shard the way NEWS_PIPELINE says —
the inline engine (``engines/inline.py``), or a pass of the pipeline engine that feeds the
RabbitMQ stage queues (``engines/pipeline/passes.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from nightcrew import runs
from nightcrew.clock import Clock
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.report import NewsReport, Trigger
from nightcrew.runtime import Runtime
from nightcrew.scheduler import Schedule


async def run_or_enqueue(
    runtime: Runtime, clock: Clock, shard: str, *, trigger: Trigger
) -> NewsReport:
    """``inline``: the whole run, here. ``rabbitmq``: a pass; the stage workers do the rest."""
    if runtime.settings.news_pipeline == "rabbitmq":
        return await run_pass(runtime, clock, shard, trigger=trigger)
    return await run_shard(runtime, clock, shard, trigger=trigger)


def shard_lane(shard: str) -> str:
    """A shard's lane in the run history (the Runs page's ``news:<shard>``)."""
    return f"news:{shard}"


async def run_shard_now(
    runtime: Runtime,
    clock: Clock,
    shard: str,
    *,
    requested_by: str | None,
    on_started: Callable[[runs.RunHandle], None] | None = None,
) -> NewsReport | None:
    """A manual run of ``shard`` in the run history (lane ``news:<shard>``), as `news run
    --manual` and the dashboard's "run now" start it: exclusive of the lane's other runs
    (runs.LaneBusy), and the shard lease still guards the work itself."""

    async def work(handle: runs.RunHandle) -> NewsReport:
        return await run_or_enqueue(runtime, clock, shard, trigger="manual")

    return await runs.recorded(
        runtime.db,
        clock,
        runs.RunSpec(lane=shard_lane(shard), requested_by=requested_by, on_started=on_started),
        work,
        report_json=lambda report: report.to_json(),
    )


def news_schedules(runtime: Runtime, clock: Clock) -> tuple[Schedule, ...]:
    """One schedule per NEWS_SHARDS entry, every NEWS_RUN_INTERVAL_MINUTES; each slot is
    claimed in the run history (one replica runs it) and the shard lease guards the rest."""
    minutes = runtime.settings.news_run_interval_minutes
    cron = "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"

    def runner_for(shard: str) -> Callable[[datetime], Awaitable[bool]]:
        lane = shard_lane(shard)

        async def run(slot: datetime) -> bool:
            async def work(handle: runs.RunHandle) -> NewsReport:
                return await run_or_enqueue(runtime, clock, shard, trigger="scheduled")

            report = await runs.recorded(
                runtime.db,
                clock,
                runs.RunSpec(lane=lane, slot=slot),
                work,
                report_json=lambda report: report.to_json(),
            )
            return report is not None

        return run

    return tuple(
        Schedule(name=f"news:{shard}", cron=cron, runner=runner_for(shard))
        for shard in runtime.settings.news_shard_list
    )
