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
  the default DRAIN_BUDGET_SECONDS would deliver; for comparison, the same sends in the same
  batches without the database (the HTTP client's own ceiling here);
* the idle cost: the table topped up to M delivered rows, then ``deliver_effects`` (the whole
  minute-lane sweep: adopt the feed outbox, drain, purge, counts) with nothing due, median and
  p95 of R runs, plus EXPLAIN (ANALYZE, BUFFERS) of the claim, the purge and the counts.

Target (issue): effects/s reported for 100,000 effects against a ~5 ms sink; the idle sweep at
1M delivered rows stays an index lookup, under 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
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
from nightcrew.adapters.mail import Email, ResendMailer
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.assembly import open_runtime
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
CLIENT_ALONE_SENDS = 5000

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
    stats = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "other": 0, "connections": 0}
    keys: set[str] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats["connections"] += 1
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
                elif method == "GET" and target == "/stats":  # the peak is since the last read
                    body = json.dumps({**stats, "distinct_keys": len(keys)}).encode()
                    stats["max_in_flight"] = stats["in_flight"]
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


def _claim_params() -> dict[str, Any]:
    return {
        "now": NOW,
        "lease_until": NOW + outbox.CLAIM_LEASE,
        "limit": DRAIN_BATCH,
        "kinds": None,
    }


# outbox.counts() runs its query under this setting (see its comment).
COUNTS_AS_RUN = "SET LOCAL enable_seqscan = off"


async def _explain(
    db: Database, query: str, params: dict[str, Any], *, as_run: str | None = None
) -> str:
    """The plan, in a rolled-back transaction; ``as_run``: a SET LOCAL the code runs it under."""
    async with db.session() as conn:
        await conn.execute("BEGIN")
        if as_run:
            await conn.execute(as_run)
        rows = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON) " + query, params
        )
        await conn.execute("ROLLBACK")
    return "\n".join(r["QUERY PLAN"] for r in rows)


async def _client_alone(mailer: ResendMailer, n: int, prefix: str) -> dict[str, float]:
    """The drain's sending pattern without its database: the same mailer and sink, batches of
    DRAIN_BATCH with DRAIN_CONCURRENCY in flight — the HTTP client's own ceiling here."""

    async def one(gate: asyncio.Semaphore, i: int) -> None:
        async with gate:
            result = await mailer.send(
                Email(
                    to=f"calibrate{i}@example.test",
                    subject="Calibration",
                    text="Your storage is over its cap.",
                    html="<p>Your storage is over its cap.</p>",
                    idempotency_key=f"{prefix}:{i}",
                )
            )
        assert result.outcome == "sent", result

    cpu_started = time.process_time()
    started = time.perf_counter()
    for first in range(0, n, DRAIN_BATCH):
        gate = asyncio.Semaphore(DRAIN_CONCURRENCY)
        await asyncio.gather(*(one(gate, i) for i in range(first, min(n, first + DRAIN_BATCH))))
    wall = time.perf_counter() - started
    return {"n": n, "rate": n / wall, "cpu_ms": (time.process_time() - cpu_started) / n * 1000}


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
        async with open_runtime(
            Settings.model_validate(
                {
                    "DATABASE_URL": url,
                    "RESEND_API_BASE": sink.url,
                    "RESEND_API_KEY": API_KEY,
                    "RESEND_FROM_EMAIL": FROM_EMAIL,
                }
            ),
            clock,
            db=db,
            queues=PostgresQueueProducer(db, clock),
            store=open_store("memory://"),
            feedcache=RecordingFeedCache(),
            billing=NoBilling(),
            mail=ResendMailer(http, api_base=sink.url, api_key=API_KEY, from_email=FROM_EMAIL),
        ) as runtime:
            # --- delivery -------------------------------------------------------------------------
            assert isinstance(runtime.mail, ResendMailer)
            await _client_alone(runtime.mail, 500, "warm-up")  # the connections, the code paths
            out["claim_plan_busy"] = await _explain(db, outbox.SQL["claim_due"], _claim_params())
            sink_before = await sink.stats(http)
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
                sink={
                    k: v if k == "max_in_flight" else v - sink_before[k]
                    for k, v in (await sink.stats(http)).items()
                },
            )

            # --- idle, right after the drain: dead index entries not vacuumed yet ---------------
            first = await _idle_runs(runtime, clock, 1)
            after = await _idle_runs(runtime, clock, repeat)
            out["idle_unvacuumed"] = {
                "first_ms": first[0],
                "median_ms": statistics.median(after),
                "counts_plan": await _explain(db, outbox.SQL["counts"], {}, as_run=COUNTS_AS_RUN),
                "stats": await db.fetch_one(
                    "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count"
                    " FROM pg_stat_user_tables WHERE relid = 'nightcrew.effects'::regclass"
                ),
            }

            # --- the HTTP client alone, for comparison --------------------------------------------
            out["client"] = await _client_alone(runtime.mail, min(n, CLIENT_ALONE_SENDS), "alone")

            # --- idle, at M delivered rows ------------------------------------------------------
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
                "claim_due": await _explain(db, outbox.SQL["claim_due"], _claim_params()),
                "purge_delivered": await _explain(
                    db,
                    outbox.SQL["purge_delivered"],
                    {"before": NOW - DELIVERED_RETENTION, "limit": PURGE_BATCH},
                ),
                "counts": await _explain(db, outbox.SQL["counts"], {}, as_run=COUNTS_AS_RUN),
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

    s, sink_stats, c = r["settled"], r["sink"], r["client"]
    waves = math.ceil(DRAIN_BATCH / DRAIN_CONCURRENCY)
    print(f"   seeded in {r['seed_s']:.1f} s")
    print(
        f"   drain (batch {DRAIN_BATCH}, {DRAIN_CONCURRENCY} in flight): {r['delivered']:,} "
        f"delivered in {r['drain_s']:.2f} s → {r['rate']:,.0f} effects/s "
        f"({r['drain_calls']} drain calls, the last finding nothing; "
        f"retried {r['retried']}, dead {r['dead']})"
    )
    print(
        f"   one minute-lane run ({DRAIN_BUDGET_SECONDS:.0f} s budget), computed from that "
        f"rate, not run: ~{r['rate'] * DRAIN_BUDGET_SECONDS:,.0f} effects"
    )
    print(
        f"   bench process CPU during the drain: {r['cpu_s']:.1f} s of {r['drain_s']:.1f} s "
        f"wall ({100 * r['cpu_s'] / r['drain_s']:.0f}% of one core; "
        f"{r['cpu_s'] / r['delivered'] * 1000:.2f} ms per effect)"
    )
    print(
        f"   for comparison: the sink's ceiling {DRAIN_CONCURRENCY / SINK_DELAY_SECONDS:,.0f}/s "
        f"({DRAIN_CONCURRENCY} in flight, 5 ms each), "
        f"{DRAIN_BATCH / (waves * SINK_DELAY_SECONDS):,.0f}/s with the batch barrier "
        f"({waves} waves per {DRAIN_BATCH})"
    )
    print(
        f"   for comparison: the HTTP client alone (same ResendMailer, sink and batches, "
        f"no database, {c['n']:,} sends): {c['rate']:,.0f}/s, "
        f"{c['cpu_ms']:.2f} ms CPU per send"
    )
    if importlib.util.find_spec("sniffio") is None:
        print(
            "   note: sniffio is not installed; httpcore then retries `import sniffio` for every "
            "lock it creates (encode/httpcore#1103)"
        )
    rss = f"{r['rss_peak_mib']:.1f} MiB" if r["rss_peak_mib"] is not None else "n/a"
    print(f"   peak RSS during the drain: {rss} (before: {r['rss_before_mib']:.1f} MiB)")
    print(
        f"   rows after: delivered {s['delivered']:,}, pending {s['pending']}, dead {s['dead']}, "
        f"attempts ≠ 1: {s['attempts_not_1']}, with an error: {s['with_error']}"
    )
    once = sink_stats["requests"] == sink_stats["distinct_keys"] == args.effects
    print(
        f"   sink, during the drain: {sink_stats['requests']:,} requests, "
        f"{sink_stats['distinct_keys']:,} distinct Idempotency-Keys, max "
        f"{sink_stats['max_in_flight']} in flight, {sink_stats['connections']} new connections, "
        f"{sink_stats['other']} other requests → "
        f"{'each effect sent exactly once' if once else 'MISMATCH with ' + str(args.effects)}"
    )
    print(
        f"\n   -- EXPLAIN (ANALYZE, BUFFERS) claim_due with {args.effects:,} due "
        "(before the drain, rolled back)\n"
        + "\n".join("   " + line for line in r["claim_plan_busy"].splitlines())
    )
    u = r["idle_unvacuumed"]
    st = u["stats"] or {}
    print(
        f"\n== idle sweep right after the drain, before any VACUUM of ours (the planner's "
        f"statistics from before the drain unless autovacuum ran: autovacuum "
        f"runs {st.get('autovacuum_count')}, autoanalyze runs {st.get('autoanalyze_count')}; "
        f"{st.get('n_dead_tup', 0):,} dead tuples): first {u['first_ms']:.2f} ms, then median "
        f"{u['median_ms']:.2f} ms of {args.repeat}"
    )
    print(
        "\n   -- EXPLAIN (ANALYZE, BUFFERS) counts, in that state\n"
        + "\n".join("   " + line for line in u["counts_plan"].splitlines())
    )
    t = r["table"]
    times = r["idle_ms"]
    median, p95 = statistics.median(times), _pct(times, 0.95)
    print(
        f"\n== idle sweep at {t['delivered']:,} delivered rows ({t['rows']:,} rows, "
        f"{t['undelivered']} undelivered, {t['size']}; {r['top_up']:,} added in "
        f"{r['top_up_s']:.1f} s, then VACUUM ANALYZE)"
    )
    print(
        f"   deliver_effects (adopt, drain, purge, counts), {len(times)} runs after 3 warm-up: "
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
