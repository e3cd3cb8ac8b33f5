"""Benchmark: the storage reconciler over 1,000,000 episodes and 1,000,000 objects.

    python -m bench.reconcile [--store local|s3] [--n N] [--runs 3] [--apply] [--profile]
                              [--no-rclone]

Data: N/1000 podcasts; N episodes; one object per episode except the 1% whose object is
missing; 1% of the recorded sizes wrong; plus N/100 orphan objects (1%) that no episode
references — N objects in all, as sparse files in a local store (real sizes, no disk blocks),
two days old. ``--store local`` (the default, N = 1,000,000): sparse files in a local folder.
``--store s3`` (N = 100,000 by default: moto fills slowly and keeps every byte in memory): the
same layout as small real objects (1,000-1,999 bytes, the recorded sizes scaled alike) in a
``moto`` S3 server on 127.0.0.1, in its own process. Then it times, on this machine:

* ``rclone lsf -R --format pst`` over the same store — the folder, or the bucket through
  rclone's S3 backend at the moto endpoint with ``--fast-list --use-server-modtime`` (its
  cheapest listing: one request per 1,000 keys, no HEADs) — the listing a dedicated tool
  manages;
* the reconciler's dry run (the real ``run_reconcile``), with its store requests (list pages,
  HEADs) and peak RSS (VmHWM, reset just before through /proc/self/clear_refs);
* with ``--apply``, as many apply runs (sizes written, orphans deleted, outbox drained), each
  from a fresh copy of the database and with the orphans put back;
* with ``--profile``, one more dry run under cProfile and one under py-spy (when installed).

Targets (issue 14): dry run <= 1.0x the rclone listing of the same store (nightcrew compares
everything in the time rclone only lists); peak RSS <= 256 MB; store requests exactly the
list pages the data dictates (N/1000 + prefixes) plus one HEAD per seeded missing object —
checked for every run, the bench exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench._db import admin_url, drop, proc_kib, recreate, reset_peak_rss
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.assembly import open_runtime
from nightcrew.clock import FrozenClock, SystemClock
from nightcrew.config import Settings
from nightcrew.db.connection import with_dbname
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.log import configure_logging

BASE = "https://media.bench"


def size_of(i: int, scale: int = 1) -> int:
    return (1_000_000 + (i % 1000) * 1000) // scale  # 1-2 MB, like short audio (or scaled)


def seeded_missing(n: int) -> int:
    """Episodes whose object the data leaves out (every 100th): the HEADs a run must make."""
    return len(range(0, n, 100))


def orphan_keys(podcasts: list[str], n: int) -> list[tuple[str, int]]:
    """(key, j) of the N/100 orphans nobody references: what an apply run deletes."""
    return [
        (f"podcasts/{podcasts[j % len(podcasts)]}/e/orphan{j}/a.mp3", j) for j in range(n // 100)
    ]


def object_keys(podcasts: list[str], n: int) -> list[tuple[str, int]]:
    """(key, i) of every object: each episode's except the 1% seeded missing, and the
    orphans."""
    keys = [(f"podcasts/{podcasts[i // 1000]}/e/ep{i}/a.mp3", i) for i in range(n) if i % 100 != 0]
    return keys + orphan_keys(podcasts, n)


async def fill_bucket(
    store: Any, podcasts: list[str], n: int, scale: int, *, only_orphans: bool = False
) -> int:
    """Small real objects, 64 puts in flight."""
    keys = orphan_keys(podcasts, n) if only_orphans else object_keys(podcasts, n)
    gate = asyncio.Semaphore(64)

    async def put(key: str, i: int) -> None:
        async with gate:
            await store.put(key, b"\0" * size_of(i, scale))

    await asyncio.gather(*(put(k, i) for k, i in keys))
    return len(keys)


def make_files(root: Path, podcasts: list[str], n: int, *, only_orphans: bool = False) -> int:
    """Sparse files: the listing sees real sizes, the disk stores no blocks."""
    old = time.time() - 2 * 86400
    keys = orphan_keys(podcasts, n) if only_orphans else object_keys(podcasts, n)
    for key, i in keys:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            fh.truncate(size_of(i))
        os.utime(path, (old, old))
    return len(keys)


async def load_db(db: Database, n: int, scale: int = 1) -> list[str]:
    await migrate(db)
    rows = await db.fetch(
        "INSERT INTO public.podcasts (slug, title) SELECT 'bench-' || g, 'Bench ' || g"
        " FROM generate_series(0, %(p)s - 1) g RETURNING id",
        {"p": max(1, n // 1000)},
    )
    podcasts = [str(r["id"]) for r in rows]
    async with db.transaction() as tx:
        await tx.execute("CREATE TEMP TABLE pods (n int, id uuid) ON COMMIT DROP")
        await tx.execute(
            "INSERT INTO pods SELECT ord - 1, id::uuid FROM unnest(%(ids)s::text[])"
            " WITH ORDINALITY AS t(id, ord)",
            {"ids": podcasts},
        )
        await tx.execute(
            "INSERT INTO public.episodes (podcast_id, title, status, published_at, audio_url,"
            " audio_file_size_bytes)"
            " SELECT p.id, 'E' || g, 'published', %(now)s,"
            "  %(base)s || '/podcasts/' || p.id::text || '/e/ep' || g || '/a.mp3',"
            "  (1000000 + (g %% 1000) * 1000) / %(scale)s"
            "  + CASE WHEN g %% 100 = 1 THEN 7 ELSE 0 END"
            " FROM generate_series(0, %(n)s - 1) g JOIN pods p ON p.n = g / 1000",
            {"n": n, "base": BASE, "now": datetime.now(UTC), "scale": scale},
        )
    await db.execute("VACUUM ANALYZE public.episodes")
    return podcasts


def time_rclone(target: str, env: dict[str, str] | None = None) -> float:
    rclone = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    started = time.perf_counter()
    subprocess.run(
        [rclone, "lsf", "-R", "--format", "pst", target],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    return time.perf_counter() - started


def rclone_s3_env(endpoint: str) -> dict[str, str]:
    """rclone's S3 backend at the moto endpoint (the remote is then ``:s3:BUCKET``), listing
    as cheaply as it can: the server's modification times (no HEAD per object for the mtime
    metadata) and one recursive listing (``--fast-list``: a request per 1,000 keys)."""
    return {
        "RCLONE_USE_SERVER_MODTIME": "true",
        "RCLONE_FAST_LIST": "true",
        "RCLONE_S3_PROVIDER": "Other",
        "RCLONE_S3_ENDPOINT": endpoint,
        "RCLONE_S3_ACCESS_KEY_ID": "bench",
        "RCLONE_S3_SECRET_ACCESS_KEY": "bench",
        "RCLONE_S3_REGION": "us-east-1",
        "RCLONE_S3_FORCE_PATH_STYLE": "true",
    }


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 in a process of its own; yields its endpoint."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


S3_CREDENTIALS = {"access_key_id": "bench", "secret_access_key": "bench", "region": "us-east-1"}


async def reconcile_once(
    url: str, store_url: str, options: ReconcileOptions, *, age: timedelta
) -> dict[str, Any]:
    db = await Database.open(url)
    try:
        clock = FrozenClock(SystemClock().now() + age)
        store = open_store(store_url, credentials=S3_CREDENTIALS)
        async with open_runtime(
            Settings.model_validate({"DATABASE_URL": url, "R2_PUBLIC_URL": BASE}),
            clock,
            db=db,
            queues=PostgresQueueProducer(db, clock),
            store=store,
            feedcache=RecordingFeedCache(),
            billing=NoBilling(),
        ) as runtime:
            reset_peak_rss()
            started = time.perf_counter()
            report = await run_reconcile(runtime, clock, options)
            wall = time.perf_counter() - started
            peak = proc_kib("VmHWM") / 1024
    finally:
        await db.close()
    return {"wall_s": wall, "peak_rss_mib": peak, "stats": store.stats, "report": report}


@contextmanager
def prepared_store(kind: str, podcasts: list[str], n: int) -> Iterator[tuple[str, str, Any, int]]:
    """(STORAGE_URL, rclone target, rclone env, objects) of the data, local or on moto."""
    if kind == "local":
        root = Path(tempfile.mkdtemp(prefix="nightcrew-bench-reconcile-"))
        try:
            started = time.perf_counter()
            objects = make_files(root, podcasts, n)
            print(f"wrote {objects:,} files in {time.perf_counter() - started:.0f} s", flush=True)
            yield f"file://{root}", str(root), {}, objects
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    with moto_server() as endpoint:
        store_url = f"s3://bench?endpoint={endpoint}&region=us-east-1"
        store = open_store(store_url, credentials=S3_CREDENTIALS)
        import boto3

        boto = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        )
        boto.create_bucket(Bucket="bench")
        started = time.perf_counter()
        objects = asyncio.run(fill_bucket(store, podcasts, n, 1000))
        print(f"put {objects:,} objects in {time.perf_counter() - started:.0f} s", flush=True)
        yield store_url, ":s3:bench", rclone_s3_env(endpoint), objects


async def _load(admin: str, name: str, n: int, scale: int) -> tuple[str, list[str]]:
    url = recreate(admin, name)
    db = await Database.open(url)
    try:
        started = time.perf_counter()
        podcasts = await load_db(db, n, scale)
        print(f"loaded {n:,} episodes in {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        await db.close()
    return url, podcasts


def clone(admin: str, template: str, name: str) -> str:
    """A fresh copy of the loaded database (CREATE DATABASE … TEMPLATE): each apply run starts
    from the same wrong sizes, missing objects and orphans."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    return with_dbname(admin, name)


def restore_orphans(kind: str, store_url: str, podcasts: list[str], n: int) -> None:
    """Put back the orphans an apply run deleted (nothing else is deleted without
    --quarantine-missing, and the database is a fresh copy)."""
    if kind == "local":
        make_files(Path(store_url.removeprefix("file://")), podcasts, n, only_orphans=True)
    else:
        store = open_store(store_url, credentials=S3_CREDENTIALS)
        asyncio.run(fill_bucket(store, podcasts, n, 1000, only_orphans=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("local", "s3"), default="local")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--runs", type=int, default=3, help="runs per median (dry and apply)")
    parser.add_argument(
        "--apply", action="store_true", help="also time apply runs, each from a fresh copy"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more dry run under cProfile, and one under py-spy when it is installed "
        "(neither counted)",
    )
    parser.add_argument(
        "--no-rclone",
        action="store_true",
        help="skip the rclone listing (e.g. to time only the apply run against the dry run)",
    )
    # one dry run and nothing else: the process py-spy records (--profile)
    parser.add_argument("--single-dry-run", nargs=3, metavar=("DB", "STORE", "AGE_S"))
    args = parser.parse_args()
    configure_logging("warning")
    if args.single_dry_run:
        db_url, store_url, age_s = args.single_dry_run
        age = timedelta(seconds=float(age_s))
        asyncio.run(reconcile_once(db_url, store_url, ReconcileOptions(), age=age))
        return
    n = args.n or (1_000_000 if args.store == "local" else 100_000)
    scale = 1 if args.store == "local" else 1000
    # local files are made two days old; S3 objects are new, so the clock moves two days on
    age = timedelta(0) if args.store == "local" else timedelta(days=2)
    checks: list[bool] = []
    with admin_url() as admin:
        # this process's own: a second bench run beside it (bench.scale, another checkout)
        # must not drop the database out from under it
        name = f"nightcrew_bench_reconcile_{os.getpid()}"
        url, podcasts = asyncio.run(_load(admin, name, n, scale))
        try:
            with prepared_store(args.store, podcasts, n) as (store_url, target, env, objects):
                rclone = (
                    [] if args.no_rclone else [time_rclone(target, env) for _ in range(args.runs)]
                )
                dry = [
                    asyncio.run(reconcile_once(url, store_url, ReconcileOptions(), age=age))
                    for _ in range(args.runs)
                ]
                checks.append(report(args, n, objects, rclone, dry, len(podcasts)))
                if args.profile:
                    profile_once(url, store_url, age)
                if args.apply:
                    applied = []
                    for _ in range(args.runs):
                        copy = clone(admin, name, f"{name}_apply")
                        restore_orphans(args.store, store_url, podcasts, n)
                        applied.append(
                            asyncio.run(
                                reconcile_once(
                                    copy, store_url, ReconcileOptions(mode="apply"), age=age
                                )
                            )
                        )
                    drop(admin, f"{name}_apply")
                    checks.append(report_apply(applied, n, len(podcasts), objects, dry))
        finally:
            drop(admin, name)
    if not all(checks):
        raise SystemExit("a store request count differs from what the data dictates")


def profile_once(url: str, store_url: str, age: timedelta) -> None:
    """One dry run under cProfile (the top 25 functions by own and by cumulative time, and
    the whole profile in a file for snakeviz), then, when py-spy is installed, one in a child
    process under py-spy (native frames of PostgreSQL's driver and the store included)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    asyncio.run(reconcile_once(url, store_url, ReconcileOptions(), age=age))
    profile.disable()
    out = Path(tempfile.gettempdir()) / "nightcrew-reconcile-dryrun.prof"
    profile.dump_stats(out)
    stats = pstats.Stats(profile)
    print(f"\n   profile of one dry run (cProfile, saved to {out}), by own time:")
    stats.sort_stats("tottime").print_stats(25)
    print("   by cumulative time:")
    stats.sort_stats("cumulative").print_stats(25)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("   py-spy not installed (pip install py-spy): no sampling profile")
        return
    raw = Path(tempfile.gettempdir()) / "nightcrew-reconcile-dryrun.py-spy.txt"
    subprocess.run(
        [
            py_spy,
            "record",
            "--format",
            "raw",
            "--output",
            str(raw),
            "--rate",
            "200",
            "--",
            sys.executable,
            "-m",
            "bench.reconcile",
            "--single-dry-run",
            url,
            store_url,
            str(age.total_seconds()),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print_py_spy(raw)


def print_py_spy(raw: Path, top: int = 20) -> None:
    """The functions most often on top of the stack, from py-spy's raw (collapsed) output:
    one ``frame;frame;… count`` line per distinct stack."""
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        leaf = stack.rsplit(";", 1)[-1]
        own[leaf] = own.get(leaf, 0) + samples
    print(f"\n   profile of one dry run (py-spy, {total:,} samples; flamegraph input: {raw}):")
    for leaf, samples in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"   {100 * samples / max(1, total):5.1f}%  {leaf}")


def expected_pages(objects: int, podcasts: int) -> tuple[int, int]:
    """(pages, objects per prefix) the data dictates: the prefix listing's pages, then one
    page per 1,000 objects of each podcast prefix."""
    per_prefix = -(-objects // podcasts) if podcasts else 0
    return -(-podcasts // 1000) + podcasts * -(-per_prefix // 1000), per_prefix


def request_check(stats: Any, n: int, objects: int, podcasts: int) -> tuple[bool, str]:
    """The store requests against the data, each exactly: list pages as above, and one HEAD
    per episode whose object was seeded missing (the only candidates a run may HEAD)."""
    pages, per_prefix = expected_pages(objects, podcasts)
    missing = seeded_missing(n)
    ok = stats.list_pages == pages and stats.heads == missing
    return ok, (
        f"{stats.list_pages:,} list pages (expected {pages:,}: the prefix listing + "
        f"{podcasts:,} prefixes x ceil({per_prefix:,}/1000)), {stats.heads:,} HEADs (expected "
        f"{missing:,}: the seeded missing objects) — {'met exactly' if ok else 'MISSED'}"
    )


def report_apply(
    applied: list[dict[str, Any]],
    n: int,
    podcasts: int,
    objects: int,
    dry: list[dict[str, Any]],
) -> bool:
    walls = [a["wall_s"] for a in applied]
    a, st = applied[-1]["report"], applied[-1]["stats"]
    peak = max(x["peak_rss_mib"] for x in applied)
    ok, requests = request_check(st, n, objects, podcasts)
    print(
        f"   apply run:                  median {statistics.median(walls):.2f} s "
        f"({', '.join(f'{t:.2f}' for t in walls)}), peak RSS {peak:.0f} MiB; "
        f"{a.size_backfill.written:,} sizes written, {a.orphans.deleted:,} orphans deleted"
    )
    print(
        f"   apply store requests: {requests}; {st.delete_requests:,} delete requests "
        f"({a.orphans.deleted:,} orphans, batches of 1,000)"
    )
    ratio = statistics.median(walls) / statistics.median(d["wall_s"] for d in dry)
    print(f"   apply / dry run: {ratio:.2f}x (target <= 2.0: {'met' if ratio <= 2 else 'MISSED'})")
    print(
        "   apply phases (last run): "
        + ", ".join(f"{k} {v / 1000:.2f} s" for k, v in a.phases_ms.items())
    )
    return ok


def report(
    args: argparse.Namespace,
    n: int,
    objects: int,
    rclone: list[float],
    dry: list[dict[str, Any]],
    podcasts: int,
) -> bool:
    last = dry[-1]
    r, stats = last["report"], last["stats"]
    where = "local store, sparse files" if args.store == "local" else "moto S3, small objects"
    print(f"\n== {n:,} episodes, {objects:,} objects ({where}), {os.cpu_count()} cores")
    if rclone:
        print(
            f"   rclone lsf -R --format pst: median {statistics.median(rclone):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in rclone)})"
        )
    walls = [d["wall_s"] for d in dry]
    print(
        f"   reconcile dry run:          median {statistics.median(walls):.2f} s "
        f"({', '.join(f'{t:.2f}' for t in walls)}); listing "
        f"{r.listing.partitions:,} partitions, {r.listing.list_concurrency} at once, "
        f"{r.listing.objects_per_second:,} objects/s"
    )
    if rclone:
        ratio = statistics.median(walls) / statistics.median(rclone)
        print(
            f"   ratio to rclone: {ratio:.2f} (target <= 1.0: {'met' if ratio <= 1 else 'MISSED'})"
        )
    peak = max(d["peak_rss_mib"] for d in dry)
    print(f"   peak RSS: {peak:.0f} MiB (target <= 256: {'met' if peak <= 256 else 'MISSED'})")
    ok, requests = request_check(stats, n, objects, podcasts)
    print(f"   store requests: {requests}")
    print(
        "   phases (last dry run): "
        + ", ".join(f"{k} {v / 1000:.2f} s" for k, v in r.phases_ms.items())
    )
    print(
        f"   found: {r.size_backfill.mismatched:,} wrong sizes, "
        f"{r.missing.count:,} missing, {r.orphans.found:,} orphans "
        f"({r.orphans.eligible:,} eligible)"
    )
    return ok


if __name__ == "__main__":
    main()
