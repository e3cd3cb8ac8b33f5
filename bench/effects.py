"""Benchmark: the effects outbox's drain, busy and idle.

    python -m bench.effects [--effects 100000] [--delivered 1000000] [--repeat 21]

Data: N pending ``mail`` effects (one INSERT … SELECT generate_series, due now), delivered over
real HTTP by the real ``ResendMailer`` to a loopback sink — a minimal HTTP/1.1 server in its own
process that answers 200 ``{"id": …}`` after ~5 ms, keeps connections alive, and counts the
requests and the distinct ``Idempotency-Key`` values it received. Measured on this machine and
real PostgreSQL:

* delivery: ``drain`` (one minute-lane process, DRAIN_BATCH claimed per statement,
  DRAIN_CONCURRENCY in flight) until nothing is due: effects delivered per second, the process's
  CPU time and peak RSS, and — computed from that rate, not run — what one minute-lane run with
  the default DRAIN_BUDGET_SECONDS would deliver;
* the idle cost: the table topped up to M delivered rows, then ``deliver_effects`` (the whole
  minute-lane sweep: adopt the feed outbox, drain, purge, counts) with nothing due, median and
  p95 of R runs, plus EXPLAIN (ANALYZE, BUFFERS) of the claim, the purge and the counts.

Target (issue): effects/s reported for 100,000 effects against a ~5 ms sink; the idle sweep at
1M delivered rows stays an index lookup, under 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import statistics
import time
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any

import httpx

from bench._db import admin_url, drop, proc_kib, recreate, reset_peak_rss
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.mail import ResendMailer
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.effects import outbox
from nightcrew.effects.deliver import (
    DELIVERED_RETENTION,
    DRAIN_BATCH,
    DRAIN_BUDGET_SECONDS,
    DRAIN_CONCURRENCY,
    PURGE_BATCH,
    deliver_effects,
    drain,
)
from nightcrew.log import configure_logging
from nightcrew.runtime import USER_AGENT, Runtime

NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
SINK_DELAY_SECONDS = 0.005
API_KEY = "re_bench"
FROM_EMAIL = "bench@example.test"

SEED_PENDING = """
INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at, expires_at)
SELECT 'mail', 'bench:' || g,
       jsonb_build_object('to', 'user' || g || '@example.test', 'subject', 'Bench notice ' || g,
                          'text', 'Your storage is over its cap.',
                          'html', '<p>Your storage is over its cap.</p>'),
       %(now)s, %(now)s, %(expires_at)s
  FROM generate_series(1, %(n)s) g
"""

# Delivered history: kind 'queue', delivered an hour ago — inside the retention, so the
# sweep's purge has nothing to delete and the idle path is what is measured.
SEED_DELIVERED = """
INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at, expires_at,
                               attempts, last_attempt_at, delivered_at)
SELECT 'queue', 'bench-delivered:' || g,
       jsonb_build_object('queue', 'bench', 'body', jsonb_build_object('n', g)),
       %(at)s, %(at)s, %(at)s + interval '20 hours', 1, %(at)s, %(at)s
  FROM generate_series(1, %(n)s) g
"""

SETTLED = """
SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL) AS delivered,
       count(*) FILTER (WHERE delivered_at IS NULL AND dead_at IS NULL) AS pending,
       count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
       count(*) FILTER (WHERE attempts <> 1) AS attempts_not_1,
       count(*) FILTER (WHERE last_error IS NOT NULL) AS with_error
  FROM nightcrew.effects WHERE kind = 'mail'
"""


# --- the sink: its own process, so it does not share the benchmark's event loop --------------
async def _sink(conn: Connection, delay: float) -> None:
    stats = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "other": 0}
    keys: set[str] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *lines = head.split("\r\n")
                method, target, _ = request_line.split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                if length:
                    await reader.readexactly(length)
                status = "200 OK"
                if method == "POST" and target == "/emails":
                    stats["requests"] += 1
                    keys.add(headers.get("idempotency-key", ""))
                    stats["in_flight"] += 1
                    stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
                    await asyncio.sleep(delay)
                    stats["in_flight"] -= 1
                    body = json.dumps({"id": f"bench-{stats['requests']}"}).encode()
                elif method == "GET" and target == "/stats":
                    body = json.dumps({**stats, "distinct_keys": len(keys)}).encode()
                else:
                    stats["other"] += 1
                    status, body = "404 Not Found", b'{"error": "not found"}'
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
    conn.send(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def _sink_main(conn: Connection, delay: float) -> None:
    asyncio.run(_sink(conn, delay))


class Sink:
    def __init__(self, delay: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_sink_main, args=(child, delay), daemon=True)
        self._proc.start()
        if not parent.poll(30):
            raise RuntimeError("the sink did not start")
        self.url = f"http://127.0.0.1:{parent.recv()}"

    async def stats(self, client: httpx.AsyncClient) -> dict[str, int]:
        response = await client.get(f"{self.url}/stats")
        response.raise_for_status()
        result: dict[str, int] = response.json()
        return result

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.join(timeout=10)


# --- the measurements ----------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def _explain(db: Database, query: str, params: dict[str, Any]) -> str:
    async with db.session() as conn:
        await conn.execute("BEGIN")
        rows = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON) " + query, params
        )
        await conn.execute("ROLLBACK")
    return "\n".join(r["QUERY PLAN"] for r in rows)


async def _idle_runs(runtime: Runtime, clock: FrozenClock, repeat: int) -> list[float]:
    times: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        report = await deliver_effects(runtime, clock)
        times.append((time.perf_counter() - started) * 1000)
        assert report.delivered == report.purged == report.adopted == 0, report.to_json()
        assert not any(report.pending.values()), report.pending
    return times


async def measure(url: str, sink: Sink, n: int, delivered: int, repeat: int) -> dict[str, Any]:
    db = await Database.open(url)
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, connect=5.0),
        headers={"User-Agent": USER_AGENT},
        follow_redirects=False,
        trust_env=False,  # straight to the loopback sink, whatever proxy the environment names
    )
    out: dict[str, Any] = {}
    try:
        await migrate(db)
        started = time.perf_counter()
        await db.execute(
            SEED_PENDING, {"now": NOW, "expires_at": NOW + outbox.EFFECT_MAX_AGE, "n": n}
        )
        await db.execute("VACUUM ANALYZE nightcrew.effects")
        out["seed_s"] = time.perf_counter() - started

        clock = FrozenClock(NOW)
        runtime = Runtime(
            settings=Settings.model_validate(
                {
                    "DATABASE_URL": url,
                    "RESEND_API_BASE": sink.url,
                    "RESEND_API_KEY": API_KEY,
                    "RESEND_FROM_EMAIL": FROM_EMAIL,
                }
            ),
            db=db,
            queues=PostgresQueueProducer(db, clock),
            store=open_store("memory://"),
            feedcache=RecordingFeedCache(),
            billing=NoBilling(),
            mail=ResendMailer(http, api_base=sink.url, api_key=API_KEY, from_email=FROM_EMAIL),
        )

        # --- delivery -------------------------------------------------------------------------
        rss_before = proc_kib("VmRSS")
        rss_reset = reset_peak_rss()
        calls = 0
        total = retried = dead = 0
        cpu_started = time.process_time()
        started = time.perf_counter()
        while True:
            report = await drain(runtime, clock, budget_seconds=3600.0)
            calls += 1
            total += report.delivered
            retried += report.retried
            dead += report.dead
            if report.delivered + report.retried + report.dead + report.released == 0:
                break
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        out.update(
            delivered=total,
            retried=retried,
            dead=dead,
            drain_calls=calls,
            drain_s=wall,
            cpu_s=cpu,
            rate=total / wall,
            rss_peak_mib=proc_kib("VmHWM") / 1024 if rss_reset else None,
            rss_before_mib=rss_before / 1024,
            settled=await db.fetch_one(SETTLED),
            sink=await sink.stats(http),
        )

        # --- idle, right after the drain: dead index entries not vacuumed yet ------------------
        first = await _idle_runs(runtime, clock, 1)
        after = await _idle_runs(runtime, clock, repeat)
        out["idle_unvacuumed"] = {"first_ms": first[0], "median_ms": statistics.median(after)}

        # --- idle, at M delivered rows ---------------------------------------------------------
        started = time.perf_counter()
        have = await db.fetch_one(
            "SELECT count(*) AS n FROM nightcrew.effects WHERE delivered_at IS NOT NULL"
        )
        top_up = max(0, delivered - int(have["n"] if have else 0))
        await db.execute(SEED_DELIVERED, {"at": NOW - timedelta(hours=1), "n": top_up})
        await db.execute("VACUUM ANALYZE nightcrew.effects")
        out["top_up"] = top_up
        out["top_up_s"] = time.perf_counter() - started
        out["table"] = await db.fetch_one(
            "SELECT count(*) AS rows,"
            " count(*) FILTER (WHERE delivered_at IS NOT NULL) AS delivered,"
            " count(*) FILTER (WHERE delivered_at IS NULL) AS undelivered,"
            " pg_size_pretty(pg_total_relation_size('nightcrew.effects')) AS size"
            " FROM nightcrew.effects"
        )
        await _idle_runs(runtime, clock, 3)  # warm the pool, the plan cache, shared buffers
        times = await _idle_runs(runtime, clock, repeat)
        out["idle_ms"] = times
        out["plans"] = {
            "claim_due": await _explain(
                db,
                outbox.SQL["claim_due"],
                {
                    "now": NOW,
                    "lease_until": NOW + outbox.CLAIM_LEASE,
                    "limit": DRAIN_BATCH,
                    "kinds": None,
                },
            ),
            "purge_delivered": await _explain(
                db,
                outbox.SQL["purge_delivered"],
                {"before": NOW - DELIVERED_RETENTION, "limit": PURGE_BATCH},
            ),
            "counts": await _explain(db, outbox.SQL["counts"], {}),
        }
    finally:
        await http.aclose()
        await db.close()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=100_000, help="pending mail effects")
    parser.add_argument(
        "--delivered", type=int, default=1_000_000, help="delivered rows for the idle sweep"
    )
    parser.add_argument("--repeat", type=int, default=21, help="idle sweeps timed")
    args = parser.parse_args()
    configure_logging("error")  # a delivered effect is an info event each: 100k lines

    sink = Sink(SINK_DELAY_SECONDS)
    try:
        with admin_url() as admin:
            name = "nightcrew_bench_effects"
            url = recreate(admin, name)
            print(
                f"\n== {args.effects:,} pending mail effects → loopback sink {sink.url} "
                f"(200 after {SINK_DELAY_SECONDS * 1000:.0f} ms, own process)",
                flush=True,
            )
            try:
                r = await measure(url, sink, args.effects, args.delivered, args.repeat)
            finally:
                drop(admin, name)
    finally:
        sink.stop()

    s, sink_stats = r["settled"], r["sink"]
    ceiling = DRAIN_CONCURRENCY / SINK_DELAY_SECONDS
    batch_ceiling = DRAIN_BATCH / (math.ceil(DRAIN_BATCH / DRAIN_CONCURRENCY) * SINK_DELAY_SECONDS)
    print(f"   seeded in {r['seed_s']:.1f} s")
    print(
        f"   drain (batch {DRAIN_BATCH}, {DRAIN_CONCURRENCY} in flight): {r['delivered']:,} "
        f"delivered in {r['drain_s']:.2f} s → {r['rate']:,.0f} effects/s "
        f"({r['drain_calls']} drain call(s); retried {r['retried']}, dead {r['dead']})"
    )
    print(
        f"   one minute-lane run ({DRAIN_BUDGET_SECONDS:.0f} s budget), computed from that "
        f"rate, not run: ~{r['rate'] * DRAIN_BUDGET_SECONDS:,.0f} effects"
    )
    print(
        f"   ceiling at this sink: {ceiling:,.0f}/s ({DRAIN_CONCURRENCY} × 1/5 ms); with the "
        f"batch barrier ({math.ceil(DRAIN_BATCH / DRAIN_CONCURRENCY)} waves per "
        f"{DRAIN_BATCH}) {batch_ceiling:,.0f}/s"
    )
    print(
        f"   bench process CPU: {r['cpu_s']:.1f} s of {r['drain_s']:.1f} s wall "
        f"({100 * r['cpu_s'] / r['drain_s']:.0f}%)"
    )
    rss = f"{r['rss_peak_mib']:.1f} MiB" if r["rss_peak_mib"] is not None else "n/a"
    print(f"   peak RSS during the drain: {rss} (before: {r['rss_before_mib']:.1f} MiB)")
    print(
        f"   rows after: delivered {s['delivered']:,}, pending {s['pending']}, dead {s['dead']}, "
        f"attempts ≠ 1: {s['attempts_not_1']}, with an error: {s['with_error']}"
    )
    once = sink_stats["requests"] == sink_stats["distinct_keys"] == args.effects
    print(
        f"   sink: {sink_stats['requests']:,} requests, {sink_stats['distinct_keys']:,} distinct "
        f"Idempotency-Keys, max {sink_stats['max_in_flight']} in flight, "
        f"{sink_stats['other']} other requests → "
        f"{'each effect sent exactly once' if once else 'MISMATCH with ' + str(args.effects)}"
    )
    u = r["idle_unvacuumed"]
    print(
        f"\n== idle sweep right after the drain (dead index entries not yet vacuumed): "
        f"first {u['first_ms']:.2f} ms, then median {u['median_ms']:.2f} ms"
    )
    t = r["table"]
    times = r["idle_ms"]
    median, p95 = statistics.median(times), _pct(times, 0.95)
    print(
        f"\n== idle sweep at {t['delivered']:,} delivered rows ({t['rows']:,} rows, "
        f"{t['undelivered']} undelivered, {t['size']}; {r['top_up']:,} added in "
        f"{r['top_up_s']:.1f} s)"
    )
    print(
        f"   deliver_effects (adopt, drain, purge, counts), {len(times)} runs: "
        f"median {median:.2f} ms, p95 {p95:.2f} ms, min {min(times):.2f}, max {max(times):.2f}"
    )
    print(f"   target: < 20 ms → {'met' if median < 20 and p95 < 20 else 'MISSED'}")
    for label, plan in r["plans"].items():
        print(
            f"\n   -- EXPLAIN (ANALYZE, BUFFERS) {label}\n"
            + "\n".join("   " + line for line in plan.splitlines())
        )


if __name__ == "__main__":
    asyncio.run(main())
