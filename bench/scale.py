"""Benchmark: how every job of both lanes grows with the platform, at three sizes.

    python -m bench.scale [--sizes 0.03,0.1,0.3] [--repeat 3] [--repeat-slow 1]
                          [--svg docs/scale.svg] [--quick]

A size factor s builds, in one database and with the other benchmarks' own builders:

* ``bench.minute_lane``: 1M·s ``import_items`` (95% completed), 1M·s episodes, 100k·s podcast
  imports and media jobs — all fresh, so the minute lane is idle;
* ``bench.overage``: 100k·s billing accounts, 300k·s podcasts, 1.2M·s episodes (12 per
  account, so that each of the 1% of accounts with 1 GB episodes is over its 10 GB cap);
* ``bench.reconcile``: 1M·s episodes with URLs and 1M·s objects as sparse local files (1% of
  them orphans, 1% missing, 1% wrong sizes);
* ``bench.effects``: 1M·s delivered effects (the history the idle drain must not read);

plus the few rows no builder makes: 0.1% of the podcasts paused and expired, and stale
unconfirmed signups as many as 1% of the accounts. Then it times, at that size, the real job
entry points: the four minute watchdogs, the whole idle minute tick, ``deliverEffects`` idle
and ``drain`` with a fixed 1,000 due mails, pause expiry, hard deletion of a fixed batch (one
podcast, 2,000 objects, 200 episodes), the reaper, the reconciler (dry run and apply), the
overage scan and the first overage sweep, and a news run (``bench.news``: 2,000·s feeds x 50
items on loopback, a fresh database).

Each time is a median: ``--repeat`` runs for the jobs that take seconds or less (x5, after three
warm-ups, for the millisecond jobs of the minute lane, whose medians move with the machine's
load), ``--repeat-slow`` for the reconciler, the overage sweep and the news run (each changes
the data, so a repetition would measure another job). The exponent is the least-squares slope
of log(time) on log(s): every table a job reads grows in proportion to s, so it is the exponent
in the size of the data the job must read (for the fixed batches, the table they sit in).

Targets (issue 26): exponent <= 1.1 for every job; <= 0.2 for the minute lane and the idle
effects drain. A job that misses gets EXPLAIN (ANALYZE, BUFFERS) of its main query at the
largest size. The plot (time vs s, log-log, one line per job) goes to ``--svg``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import bench.news as bench_news
from bench import effects as bench_effects
from bench import minute_lane as bench_minute
from bench import overage as bench_overage
from bench import reconcile as bench_reconcile
from bench._db import admin_url, drop, recreate
from bench.hard_delete import _load as load_doomed_podcast
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.mail import RecordingMailer
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.assembly import open_runtime
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.effects import outbox
from nightcrew.effects.deliver import deliver_effects, drain
from nightcrew.lifecycle import deletions, overage, pauses, signups
from nightcrew.lifecycle import watchdogs as wd
from nightcrew.lifecycle.lanes import run_lane
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.log import configure_logging
from nightcrew.runtime import Runtime

NOW = bench_minute.NOW  # every builder seeds relative to the same instant
DB_NAME = "nightcrew_bench_scale"
NEWS_DB_NAME = "nightcrew_bench_scale_news"
ACCOUNTS = 100_000  # at s = 1: the 100k accounts / 300k podcasts / 1M episodes
ROWS = 1_000_000  # at s = 1: episodes per builder, objects, import items, delivered effects
NEWS_FEEDS = 2_000  # at s = 1; s = 0.1 is bench.news's own 200 feeds
NEWS_ITEMS = 50
DUE_MAILS = 1_000  # the effects drain's fixed work
DOOMED_OBJECTS, DOOMED_EPISODES = 2_000, 200  # the hard deletion's fixed batch
FLAT, LINEAR = 0.2, 1.1
OVERAGE_SWEEP = "overage sweep, first (arms the 1%)"
EPISODES_PER_ACCOUNT = (
    12  # 4 per podcast: each of the 1%'s accounts stores 12 GB, over its 10 GB cap
)
QUICK_FACTOR = 0.002  # --quick: 200 accounts, 2,000 rows per builder; seconds


@dataclass(frozen=True)
class Job:
    name: str
    reads: str  # the data whose size the exponent is measured against
    target: float


JOBS = [
    Job("sweepStalledImports", "import_items, podcast_imports", FLAT),
    Job("sweepStalledExternalLinks", "episodes", FLAT),
    Job("sweepStuckHostingMigrationPreviews", "podcast_imports", FLAT),
    Job("sweepWedgedMediaJobs", "media_jobs", FLAT),
    Job("minute tick (run_lane, all five)", "all of the above + effects", FLAT),
    Job("deliverEffects, idle", "effects (delivered history)", FLAT),
    Job(f"drain, {DUE_MAILS:,} due mails", "effects", LINEAR),
    Job("reactivateExpiredPauses", "podcasts (0.1% due)", LINEAR),
    Job("hardDeleteExpiredPodcasts, fixed batch", "podcasts, episodes", LINEAR),
    Job("reapUnconfirmedUsers", "auth.users (stale: 1% of accounts)", LINEAR),
    Job("reconciler, dry run", "episodes + objects", LINEAR),
    Job("reconciler, apply", "episodes + objects", LINEAR),
    Job("overage scan (sliced)", "accounts + episodes", LINEAR),
    Job(OVERAGE_SWEEP, "accounts + episodes", LINEAR),
    Job("news run, first", "feeds x items", LINEAR),
    Job("news run, second (unchanged)", "feeds x items", LINEAR),
]
BY_NAME = {job.name: job for job in JOBS}


@dataclass
class SizeResult:
    factor: float
    load_s: float = 0.0
    total_s: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)  # seconds
    touched: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    walls: dict[str, float] = field(default_factory=dict)  # where this size's wall time went

    def median(self, job: str) -> float:
        return statistics.median(self.times[job])


def exponent(sizes: list[float], times: list[float]) -> float:
    """Least-squares slope of log(time) on log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(t, 1e-9)) for t in times]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


async def _time(work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await work()
    return time.perf_counter() - started, result


# --- building the platform ---------------------------------------------------------------------
async def build(url: str, factor: float, root: Path) -> tuple[list[str], dict[str, int]]:
    """The platform at size ``factor``; the reconciler's podcast ids, and the row counts.

    Each builder gets a pool of its own: they leave session temp tables behind (``pods``), and
    the next builder's CREATE TEMP TABLE of the same name must not meet them."""
    accounts, rows = max(10, round(ACCOUNTS * factor)), max(1_000, round(ROWS * factor))
    db = await Database.open(url)
    try:
        await migrate(db)
        # first, so its `pods` (every podcast in the table) holds only its own podcasts
        await bench_minute.populate(db, rows)
    finally:
        await db.close()
    db = await Database.open(url)
    try:
        params = {"now": NOW, "accounts": accounts, "episodes": accounts * EPISODES_PER_ACCOUNT}
        async with db.transaction() as tx:
            for statement in bench_overage.LOAD:
                await tx.execute(statement, params)
            # the owners exist to be mailed; confirmed, so only the stale signups are reaped
            await tx.execute("UPDATE auth.users SET email_confirmed_at = created_at")
    finally:
        await db.close()
    db = await Database.open(url)
    try:
        podcasts = await bench_reconcile.load_db(db, rows)
        await db.execute(bench_effects.SEED_DELIVERED, {"at": NOW - timedelta(hours=1), "n": rows})
        await db.execute("VACUUM ANALYZE")
        # the build leaves a gigabyte of dirty buffers at s = 0.3: flushed here, not by a
        # checkpoint that would slow the commits of whichever job runs while it writes
        await db.execute("CHECKPOINT")
        counts = await db.fetch_one(
            "SELECT (SELECT count(*) FROM public.billing_accounts) AS accounts,"
            " (SELECT count(*) FROM public.podcasts) AS podcasts,"
            " (SELECT count(*) FROM public.episodes) AS episodes,"
            " (SELECT count(*) FROM public.import_items) AS import_items,"
            " (SELECT count(*) FROM public.media_jobs) AS media_jobs,"
            " (SELECT count(*) FROM nightcrew.effects) AS effects,"
            " (SELECT count(*) FROM auth.users) AS users"
        )
    finally:
        await db.close()
    files = bench_reconcile.make_files(root, podcasts, rows)
    assert counts is not None
    return podcasts, {**{k: int(v) for k, v in counts.items()}, "objects": files, "builder_n": rows}


# Rows no builder makes. Each is re-applied before a repetition (not timed): the job consumed
# the previous ones.
PAUSE = """
UPDATE public.podcasts SET status = 'paused', paused_at = %(now)s - interval '40 days',
                           pause_expires_at = %(now)s - interval '1 day'
 WHERE id IN (SELECT id FROM public.podcasts WHERE status = 'active'
               ORDER BY id LIMIT %(n)s)
"""
STALE_SIGNUPS = """
INSERT INTO auth.users (email, created_at)
SELECT 'stale' || g || '-' || %(rep)s || '@bench.test', %(now)s - interval '30 days'
  FROM generate_series(1, %(n)s) g
"""


# --- measuring one size ------------------------------------------------------------------------
async def measure_platform(
    admin: str,
    factor: float,
    repeat: int,
    repeat_slow: int,
    result: SizeResult,
    *,
    explain: bool,
    db_name: str = DB_NAME,
) -> dict[str, str]:
    """Build the platform at ``factor`` and time every lifecycle job on it; with ``explain``,
    the plans of every job's main query (taken before the database is dropped)."""
    root = Path(tempfile.mkdtemp(prefix="nightcrew-bench-scale-"))
    url = recreate(admin, db_name)
    plans: dict[str, str] = {}
    try:
        started = time.perf_counter()
        podcasts, result.rows = await build(url, factor, root)
        rows = result.rows["builder_n"]
        result.load_s = result.walls["build"] = time.perf_counter() - started
        print(
            f"\n== s = {factor:g}: built in {result.load_s:.0f} s — "
            + ", ".join(f"{k} {v:,}" for k, v in result.rows.items()),
            flush=True,
        )
        db = await Database.open(url)
        clock = FrozenClock(NOW)
        try:
            async with open_runtime(
                Settings.model_validate(
                    {"DATABASE_URL": url, "R2_PUBLIC_URL": bench_reconcile.BASE}
                ),
                clock,
                db=db,
                queues=PostgresQueueProducer(db, clock),
                store=open_store(f"file://{root}"),
                feedcache=RecordingFeedCache(),
                billing=NoBilling(),
                mail=RecordingMailer(),
            ) as runtime:
                jobs_started = time.perf_counter()
                await _lifecycle(runtime, clock, result, repeat)
                result.walls["lifecycle jobs"] = time.perf_counter() - jobs_started
                if explain:
                    plans = await _plans(
                        db,
                        max(1, result.rows["podcasts"] // 1000),
                        max(1, result.rows["accounts"] // 100),
                    )
        finally:
            await db.close()
        # the reconciler dates its orphans by the real clock (the files are two days old), so
        # it runs through bench.reconcile's own runner, on its own runtime
        reconcile_started = time.perf_counter()
        dry: list[float] = []
        for _ in range(repeat_slow):
            run = await bench_reconcile.reconcile_once(
                url, f"file://{root}", ReconcileOptions(), age=timedelta(0)
            )
            dry.append(run["wall_s"])
        result.times["reconciler, dry run"] = dry
        s = run["report"].summary()
        result.touched["reconciler, dry run"] = f"{result.rows['objects']:,} objects listed"
        applied: list[float] = []
        for rep in range(repeat_slow):
            if rep:  # put back what the apply run deleted; the wrong sizes stay fixed
                bench_reconcile.restore_orphans("local", f"file://{root}", podcasts, rows)
            run = await bench_reconcile.reconcile_once(
                url, f"file://{root}", ReconcileOptions(mode="apply"), age=timedelta(0)
            )
            applied.append(run["wall_s"])
            if rep == 0:
                s = run["report"].summary()
                result.touched["reconciler, apply"] = (
                    f"{s.size_written:,} sizes, {s.orphans_deleted:,} orphans, "
                    f"{s.outbox_drained:,} outbox"
                )
                phases = run["report"].phases_ms
                result.notes.append(
                    "reconciler apply phases: "
                    + ", ".join(f"{k} {v / 1000:.1f} s" for k, v in phases.items() if v >= 50)
                )
        result.times["reconciler, apply"] = applied
        result.walls["reconciler"] = time.perf_counter() - reconcile_started
    finally:
        cleanup_started = time.perf_counter()
        drop(admin, db_name)
        # rm(1): shutil.rmtree spent minutes on 300k files here
        await asyncio.to_thread(subprocess.run, ["rm", "-rf", str(root)], check=False)
        result.walls["clean-up"] = time.perf_counter() - cleanup_started
    return plans


async def _lifecycle(runtime: Runtime, clock: FrozenClock, result: SizeResult, repeat: int) -> None:
    db = runtime.db
    fast = repeat * 5
    # --- the minute lane, idle: each sweep alone, then the whole tick --------------------------
    sweeps: list[tuple[str, Callable[[Runtime, Any], Awaitable[Any]]]] = [
        ("sweepStalledImports", wd.sweep_stalled_imports),
        ("sweepStalledExternalLinks", wd.sweep_stalled_external_links),
        ("sweepStuckHostingMigrationPreviews", wd.sweep_stuck_hosting_migration_previews),
        ("sweepWedgedMediaJobs", wd.sweep_wedged_media_jobs),
    ]
    for _ in range(3):  # warm the pool, the plan cache and shared buffers
        await run_lane(runtime, clock, "minute")
    for name, sweep in sweeps:
        times = []
        for _ in range(fast):
            t, report = await _time(functools.partial(sweep, runtime, clock))
            times.append(t)
        result.times[name] = times
        result.touched[name] = str(sum(report.counts().values()))
    times = []
    for _ in range(fast):
        t, lane = await _time(lambda: run_lane(runtime, clock, "minute"))
        times.append(t)
        assert lane is not None and not lane.errors, lane
    result.times["minute tick (run_lane, all five)"] = times
    result.touched["minute tick (run_lane, all five)"] = str(sum(lane.totals.values()))

    # --- effects: idle over the delivered history, then a fixed batch due ---------------------
    times = []
    for _ in range(fast):
        t, drained = await _time(lambda: deliver_effects(runtime, clock))
        times.append(t)
    result.times["deliverEffects, idle"] = times
    result.touched["deliverEffects, idle"] = str(drained.delivered + drained.purged)
    name = f"drain, {DUE_MAILS:,} due mails"
    times = []
    for rep in range(repeat):
        await db.execute(
            bench_effects.SEED_PENDING.replace("'bench:'", f"'bench-{rep}:'"),
            {"now": NOW, "expires_at": NOW + outbox.EFFECT_MAX_AGE, "n": DUE_MAILS},
        )
        t, drained = await _time(lambda: drain(runtime, clock, budget_seconds=3600.0))
        times.append(t)
        assert drained.delivered == DUE_MAILS, drained.to_json()
    result.times[name] = times
    result.touched[name] = f"{drained.delivered:,} delivered"

    # --- the daily lane's jobs ------------------------------------------------------------------
    due = max(1, result.rows["podcasts"] // 1000)
    times = []
    for _ in range(repeat):
        await db.execute(PAUSE, {"now": NOW, "n": due})
        t, paused = await _time(lambda: pauses.reactivate_expired_pauses(runtime, clock))
        times.append(t)
    result.times["reactivateExpiredPauses"] = times
    result.touched["reactivateExpiredPauses"] = f"{len(paused.reactivated):,} reactivated"

    name = "hardDeleteExpiredPodcasts, fixed batch"
    times = []
    for _ in range(repeat):
        await load_doomed_podcast(db, runtime.store, DOOMED_OBJECTS, DOOMED_EPISODES)
        t, deleted = await _time(lambda: deletions.hard_delete_expired_podcasts(runtime, clock))
        times.append(t)
        assert not deleted.errors, deleted.to_json()
    result.times[name] = times
    counts = deleted.counts()
    result.touched[name] = (
        f"{counts.get('podcasts_deleted', 1)} podcast, {DOOMED_EPISODES} episodes, "
        f"{counts.get('objects_deleted', 0):,} objects"
    )

    stale = max(1, result.rows["accounts"] // 100)
    times = []
    for rep in range(repeat):
        await db.execute(STALE_SIGNUPS, {"now": NOW, "n": stale, "rep": rep})
        t, reaped = await _time(lambda: signups.reap_unconfirmed_users(runtime, clock))
        times.append(t)
    result.times["reapUnconfirmedUsers"] = times
    result.touched["reapUnconfirmedUsers"] = f"{reaped.deleted:,} deleted"

    times = []
    for _ in range(repeat):
        t, rows = await _time(lambda: overage.scan(runtime))
        times.append(t)
    result.times["overage scan (sliced)"] = times
    result.touched["overage scan (sliced)"] = f"{len(rows):,} selected"
    t, swept = await _time(lambda: overage.run_overage_escalation(runtime, clock))
    result.times[OVERAGE_SWEEP] = [t]
    result.touched[OVERAGE_SWEEP] = f"{swept.armed:,} armed, {swept.emails_sent:,} mails"


# --- the news run --------------------------------------------------------------------------------
async def measure_news(
    admin: str, factor: float, repeat_slow: int, result: SizeResult, *, db_name: str = NEWS_DB_NAME
) -> None:
    feeds = max(1, round(NEWS_FEEDS * factor))
    # bench.news drops and recreates its database by this module-level name: ours, so a
    # bench.news run beside this one keeps its own
    bench_news.DB_NAME = db_name
    server = bench_news.FeedServer(feeds, NEWS_ITEMS)
    try:
        reps = [
            await bench_news.repetition(
                admin, server, bench_news.feed_paths(feeds), feeds * NEWS_ITEMS
            )
            for _ in range(repeat_slow)
        ]
    finally:
        server.stop()
    result.times["news run, first"] = [r.first_s for r in reps]
    result.times["news run, second (unchanged)"] = [r.second_s for r in reps]
    result.touched["news run, first"] = f"{reps[-1].first.processed_count:,} articles"
    result.touched["news run, second (unchanged)"] = f"{feeds:,} feeds hashed"


# --- plans for the jobs that miss ---------------------------------------------------------------
Setup = list[tuple[str, dict[str, Any]]]  # statements run first, in the rolled-back transaction

# A doomed podcast like the hard deletion's batch (its objects do not matter to the plan).
DOOMED = [
    "INSERT INTO public.podcasts (id, slug, title, status, deletion_scheduled_at)"
    " VALUES (%(id)s, 'bench-plan-doomed', 'Bench', 'pending_deletion', %(due)s)",
    "INSERT INTO public.episodes (podcast_id, title, status)"
    " SELECT %(id)s, 'Episode ' || g, 'published' FROM generate_series(1, %(n)s) g",
]


def _plan_queries(
    podcast: str, account: str, due: int, stale: int
) -> dict[str, tuple[str, dict[str, Any], Setup]]:
    """Each job's main queries as they run: (SQL, parameters, setup). The setup puts back the
    work the timed runs consumed (due pauses, stale signups, a doomed podcast), so each plan
    is the plan of a run with work to do. Labels: "<job>" or "<job> (<which query>)"."""
    minute: dict[str, tuple[str, dict[str, Any], Setup]] = {
        label: (wd.SQL[q], {"now": NOW, **cast(dict[str, Any], p)}, [])
        for label, (q, p) in bench_minute.EXPLAINED.items()
    }
    scan: tuple[str, dict[str, Any], Setup] = (
        overage.SQL["scan"],
        {"slices": 2, "slice": 0},
        [("SET LOCAL enable_nestloop = off", {})],  # overage.SCAN_SETTINGS
    )
    paused: Setup = [(PAUSE, {"now": NOW, "n": due})]
    doomed_id = "00000000-0000-4000-8000-00000000d00d"
    doomed: Setup = [
        (q, {"id": doomed_id, "due": NOW - timedelta(days=1), "n": DOOMED_EPISODES}) for q in DOOMED
    ]
    return {
        **minute,
        "deliverEffects, idle": (outbox.SQL["counts"], {}, [(bench_effects.COUNTS_AS_RUN, {})]),
        f"drain, {DUE_MAILS:,} due mails": (
            outbox.SQL["claim_due"],
            bench_effects._claim_params(),
            [],
        ),
        "reactivateExpiredPauses": (pauses.SQL["due_paused_podcasts"], {"now": NOW}, paused),
        "reactivateExpiredPauses (reactivate_podcast, one)": (
            pauses.SQL["reactivate_podcast"],
            {"id": podcast, "now": NOW},
            [
                (
                    "UPDATE public.podcasts SET status = 'paused', pause_expires_at = %(at)s"
                    " WHERE id = %(id)s",
                    {"id": podcast, "at": NOW - timedelta(days=1)},
                )
            ],
        ),
        "hardDeleteExpiredPodcasts, fixed batch": (
            deletions.SQL["due_deletions"],
            {"now": NOW},
            doomed,
        ),
        "hardDeleteExpiredPodcasts, fixed batch (delete_podcast, cascades)": (
            deletions.SQL["delete_podcast"],
            {"id": doomed_id, "now": NOW},
            doomed,
        ),
        "reapUnconfirmedUsers": (
            signups.SQL["reap_unconfirmed_users"],
            {"retention_days": signups.UNCONFIRMED_USER_RETENTION_DAYS, "now": NOW},
            [(STALE_SIGNUPS, {"now": NOW, "n": stale, "rep": "plan"})],
        ),
        "overage scan (sliced)": scan,
        OVERAGE_SWEEP: scan,
        OVERAGE_SWEEP + " (measure_account, one, run per selected account)": (
            overage.SQL["measure_account"],
            {"account_id": account},
            [],
        ),
    }


async def _plans(db: Database, due: int, stale: int) -> dict[str, str]:
    sample = await db.fetch_one(
        "SELECT p.id AS podcast, p.billing_account_id AS account FROM public.podcasts p"
        " WHERE p.billing_account_id IS NOT NULL AND p.status = 'active' ORDER BY p.id LIMIT 1"
    )
    assert sample is not None
    plans: dict[str, str] = {}
    queries = _plan_queries(str(sample["podcast"]), str(sample["account"]), due, stale)
    for job, (query, params, setup) in queries.items():
        async with db.session() as conn:
            await conn.execute("BEGIN")  # rolled back: EXPLAIN ANALYZE runs the writes
            for statement, args in setup:
                await conn.execute(statement, args)
            rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query, params)
            await conn.execute("ROLLBACK")
        plans[job] = "\n".join(r["QUERY PLAN"] for r in rows)
    return plans


# --- output --------------------------------------------------------------------------------------
def _fmt(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def verdicts(results: list[SizeResult]) -> dict[str, tuple[float | None, bool | None]]:
    sizes = [r.factor for r in results]
    out: dict[str, tuple[float | None, bool | None]] = {}
    for job in JOBS:
        if len(results) < 2 or any(job.name not in r.times for r in results):
            out[job.name] = (None, None)
            continue
        k = exponent(sizes, [r.median(job.name) for r in results])
        out[job.name] = (k, k <= job.target)
    return out


def table(results: list[SizeResult]) -> str:
    header = ["job", "reads", *[f"s={r.factor:g}" for r in results], "exponent", "target"]
    header.append("rows touched (largest)")
    rows = [header]
    for job in JOBS:
        k, met = verdicts(results)[job.name]
        cells = [_fmt(r.median(job.name)) if job.name in r.times else "—" for r in results]
        verdict = "—" if met is None else ("met" if met else "MISSED")
        rows.append(
            [
                job.name,
                job.reads,
                *cells,
                "—" if k is None else f"{k:.2f}",
                f"≤ {job.target} {verdict}",
                results[-1].touched.get(job.name, ""),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


COLOURS = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
]  # fmt: skip


def svg(results: list[SizeResult]) -> str:
    """Time vs size, log-log, one line per job; drawn by hand (matplotlib is not a dependency)."""
    width, height, left, top, plot_w, plot_h = 980, 560, 70, 30, 520, 470
    sizes = [r.factor for r in results]
    medians = {
        j.name: [r.median(j.name) for r in results] for j in JOBS if j.name in results[0].times
    }
    every = [t for ts in medians.values() for t in ts]
    lo_t = 10 ** math.floor(math.log10(min(every)))
    hi_t = 10 ** math.ceil(math.log10(max(every)))
    lo_s, hi_s = math.log10(min(sizes)), math.log10(max(sizes))
    span_s = (hi_s - lo_s) or 1.0

    def x(s: float) -> float:
        return left + (math.log10(s) - lo_s) / span_s * plot_w

    def y(t: float) -> float:
        frac = (math.log10(t) - math.log10(lo_t)) / (math.log10(hi_t) - math.log10(lo_t))
        return top + plot_h - frac * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#333"/>',
    ]
    decade = math.log10(lo_t)
    while decade <= math.log10(hi_t) + 1e-9:
        t = 10**decade
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
            'stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        decade += 1
    for s in sizes:
        out.append(
            f'<line x1="{x(s):.1f}" x2="{x(s):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#ddd"/>'
        )
        label = f"s={s:g} ({round(ACCOUNTS * s):,} accts)"
        out.append(
            f'<text x="{x(s):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{label}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">size factor s '
        "(log): 100k·s accounts, 300k·s podcasts, 1M·s episodes and objects</text>"
    )
    out.append(
        f'<text x="14" y="{top + plot_h / 2}" transform="rotate(-90 14 {top + plot_h / 2})" '
        'text-anchor="middle">median time (log)</text>'
    )
    k_of = verdicts(results)
    for i, (name, ts) in enumerate(medians.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{x(s):.1f},{y(t):.1f}" for s, t in zip(sizes, ts, strict=True))
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for s, t in zip(sizes, ts, strict=True):
            out.append(f'<circle cx="{x(s):.1f}" cy="{y(t):.1f}" r="3" fill="{colour}"/>')
        k, met = k_of[name]
        note = "" if k is None else f" — k {k:.2f}{'' if met else ' MISSED'}"
        ly = top + 10 + i * 17
        out.append(
            f'<line x1="{left + plot_w + 20}" x2="{left + plot_w + 40}" y1="{ly}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="3"/>'
        )
        text = (name + note).replace("&", "&amp;").replace("<", "&lt;")
        out.append(f'<text x="{left + plot_w + 46}" y="{ly + 4}">{text}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


NO_PLAN = {
    "minute tick (run_lane, all five)": "the five sweeps at once: see their own plans",
    "reconciler, dry run": "the listing and its joins, not one query: see bench.reconcile_plans",
    "reconciler, apply": "the listing and its writes, not one query: see bench.reconcile_plans",
    "news run, first": "no one query: see bench.news --profile",
    "news run, second (unchanged)": "no one query: see bench.news --profile",
}


def report(results: list[SizeResult], plans: dict[str, str]) -> bool:
    print("\n== results (medians; exponent = least-squares slope of log time on log s)\n")
    print(table(results))
    print()
    for r in results:
        print(
            f"   s = {r.factor:g}: built in {r.load_s:.0f} s, measured and dropped in "
            f"{r.total_s:.0f} s in all ("
            + ", ".join(f"{k} {v:.0f} s" for k, v in r.walls.items())
            + ")"
        )
        for note in r.notes:
            print(f"     {note}")
    missed = [name for name, (_, met) in verdicts(results).items() if met is False]
    print(f"\n   targets missed: {', '.join(missed) if missed else 'none'}")
    for name in missed:
        own = {k: v for k, v in plans.items() if k == name or k.startswith(name + " (")}
        if not own:
            why = NO_PLAN.get(name, "no one query")
            print(f"\n   -- {name}: no plan printed ({why})")
            continue
        for label, plan in own.items():
            print(f"\n   -- EXPLAIN (ANALYZE, BUFFERS) {label}, at s = {results[-1].factor:g}")
            for line in plan.splitlines():
                print("   " + line)
    return not missed


async def run(
    admin: str, factors: list[float], repeat: int, repeat_slow: int, *, tag: str = ""
) -> tuple[list[SizeResult], dict[str, str]]:
    results: list[SizeResult] = []
    plans: dict[str, str] = {}
    for i, factor in enumerate(factors):
        started = time.perf_counter()
        result = SizeResult(factor)
        last = i == len(factors) - 1
        plans = await measure_platform(
            admin, factor, repeat, repeat_slow, result, explain=last, db_name=DB_NAME + tag
        )
        news_started = time.perf_counter()
        await measure_news(admin, factor, repeat_slow, result, db_name=NEWS_DB_NAME + tag)
        result.walls["news"] = time.perf_counter() - news_started
        result.total_s = time.perf_counter() - started
        results.append(result)
        print(f"   s = {factor:g} done in {result.total_s:.0f} s", flush=True)
    return results, plans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.03,0.1,0.3", help="factors of 100k accounts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per median (x5 for ms jobs)")
    parser.add_argument("--repeat-slow", type=int, default=1, help="runs of the slow jobs")
    parser.add_argument("--svg", default="docs/scale.svg", help="where the plot goes ('' = none)")
    parser.add_argument("--quick", action="store_true", help="one tiny size: proves it runs")
    args = parser.parse_args()
    factors = [QUICK_FACTOR] if args.quick else sorted(float(s) for s in args.sizes.split(","))
    configure_logging("error")  # the jobs' events would drown the figures
    print(f"$ {' '.join(['python -m bench.scale', *sys.argv[1:]])}")
    print(f"   started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; sizes {factors}", flush=True)
    started = time.perf_counter()
    with admin_url() as admin:
        results, plans = asyncio.run(run(admin, factors, args.repeat, args.repeat_slow))
    ok = report(results, plans)
    if args.svg and len(results) >= 2:
        Path(args.svg).write_text(svg(results))
        print(f"\n   plot: {args.svg}")
    print(f"   total {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
