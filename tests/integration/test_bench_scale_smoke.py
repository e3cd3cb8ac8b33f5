"""`bench.scale` at its --quick size: every job of both lanes runs on the platform the other
benchmarks' builders make, so a change to a builder or a job's entry point cannot silently
break the scale benchmark. Figures are not checked: at this size they mean nothing."""

from __future__ import annotations

import dataclasses
import os

from bench import scale


async def test_bench_scale_runs_every_job_at_the_quick_size(pg_admin_url: str) -> None:
    # a tag of our own: a bench.scale run beside the suite keeps its databases
    results, plans = await scale.run(
        pg_admin_url, [scale.QUICK_FACTOR], 1, 1, tag=f"_smoke_{os.getpid()}"
    )

    [result] = results
    assert set(result.times) == {job.name for job in scale.JOBS}
    assert all(t > 0 for times in result.times.values() for t in times)
    assert result.touched[f"drain, {scale.DUE_MAILS:,} due mails"].startswith(
        f"{scale.DUE_MAILS:,} delivered"
    )
    assert "sweepStalledExternalLinks" in plans  # the plans a missed target would print
    # the table and the plot, from the one result and a copy of it at twice the size
    bigger = dataclasses.replace(
        result,
        factor=result.factor * 2,
        times={k: [t * 2 for t in v] for k, v in result.times.items()},
    )
    assert "exponent" in scale.table([result, bigger])
    assert scale.svg([result, bigger]).startswith("<svg")
