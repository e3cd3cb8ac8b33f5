"""A small, hostile night for the dashboard's tests: every text a page prints comes from here,
and the attacker-controlled ones (titles, slugs, error texts, feed names) carry markup."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nightcrew.db.database import Database
from tests import factories

HOSTILE = "<script>alert('x')</script>"
HOSTILE_IMG = '<img src=x onerror="alert(1)">'


@dataclass(frozen=True)
class Night:
    minute_run: int
    daily_run: int
    failed_run: int
    skipped_run: int
    account: str


async def run(
    db: Database,
    lane: str,
    started_at: datetime,
    report: dict[str, Any],
    *,
    status: str = "completed",
    trigger: str = "scheduled",
) -> int:
    row = await db.fetch_one(
        "INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, finished_at, status,"
        " report) VALUES (%(lane)s, %(trigger)s, %(slot)s, %(at)s, %(done)s, %(status)s,"
        " %(report)s) RETURNING id",
        {
            "lane": lane,
            "trigger": trigger,
            "slot": started_at if trigger == "scheduled" else None,
            "at": started_at,
            "done": started_at + timedelta(seconds=2),
            "status": status,
            "report": json.dumps(report),
        },
    )
    assert row is not None
    return int(row["id"])


async def night(db: Database, now: datetime) -> Night:
    minute = await run(
        db,
        "minute",
        now - timedelta(hours=2),
        {
            "lane": "minute",
            "items_requeued": 3,
            "links_requeued": 2,
            "errors": [],
            "jobs": {"sweepStalledImports": {"items_requeued": 3, "items_rescued": 1}},
        },
    )
    daily = await run(
        db,
        "daily",
        now - timedelta(hours=1),
        {
            "lane": "daily",
            "podcasts_deleted": 1,
            "errors": [],
            "jobs": {
                "hardDeleteExpiredPodcasts": {
                    "status": "ok",
                    "podcasts_deleted": 1,
                    "podcasts": [
                        {
                            "podcast_id": "00000000-0000-0000-0000-000000000001",
                            "slug": HOSTILE,
                            "objects_deleted": 4,
                            "bytes_deleted": 7168,
                            "invalidated_via": "queue",
                        }
                    ],
                },
                "runOverageEscalation": {
                    "status": "ok",
                    "restored_accounts": 1,
                    "restored": [
                        {
                            "account_id": "00000000-0000-0000-0000-0000000000aa",
                            "since": "2026-11-01T04:00:00+00:00",
                            "podcasts": [HOSTILE],
                        }
                    ],
                },
            },
        },
    )
    failed = await run(
        db,
        "daily",
        now - timedelta(days=1, hours=1),
        {"error": f"QueryError: {HOSTILE_IMG}", "retry": False},
        status="failed",
    )
    skipped = await run(
        db,
        "news:world",
        now - timedelta(minutes=30),
        {"shard": "world", "skipped": True, "reason": "another worker held the shard"},
    )
    await db.execute(
        "INSERT INTO nightcrew.podcast_deletions (podcast_id, slug, deleted_at,"
        " storage_cleaned_at, objects_deleted, bytes_deleted, objects_left, invalidated_at,"
        " attempts, last_error) VALUES"
        " ('00000000-0000-0000-0000-000000000001', %(slug)s, %(at)s, NULL, 2, 2048, 3, %(at)s,"
        " 2, %(error)s),"
        " ('00000000-0000-0000-0000-000000000002', 'clean-show', %(at)s, %(at)s, 9, 90000,"
        " 0, %(at)s, 1, NULL)",
        {"slug": HOSTILE, "at": now - timedelta(hours=1), "error": f"S3 said {HOSTILE_IMG}"},
    )
    owner = await factories.user(db, email="owner@example.test")
    account = await factories.account(
        db,
        owner_user_id=owner,
        content_overage_since=now - timedelta(days=8),
        content_overage_deadline=now + timedelta(days=22),
        content_overage_nag_stage=1,
    )
    await factories.podcast(
        db,
        billing_account_id=account,
        title=HOSTILE,
        overage_suspended_at=now - timedelta(days=1),
    )
    await db.execute(
        "INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at,"
        " expires_at, attempts, last_attempt_at, last_error, dead_at, dead_reason) VALUES"
        " ('mail', 'overage:dead', '{}', %(at)s, %(at)s, %(at)s, 5, %(at)s, %(error)s, %(at)s,"
        " 'permanent'),"
        " ('queue', 'rss:failing', '{}', %(at)s, %(later)s, %(later)s, 2, %(at)s,"
        " 'queue down', NULL, NULL)",
        {"at": now - timedelta(minutes=5), "later": now + timedelta(hours=1), "error": HOSTILE},
    )
    await db.execute(
        "INSERT INTO news.sources (name, feed_url, shard, consecutive_failures, last_error,"
        " parked_at) VALUES (%(name)s, 'http://127.0.0.1:9/feed.xml', 'world', 5, %(error)s,"
        " %(at)s), ('Fine feed', 'http://127.0.0.1:9/fine.xml', 'world', 0, NULL, NULL),"
        " ('Odd shard', 'http://127.0.0.1:9/odd.xml', %(name)s, 0, NULL, NULL)",
        {"name": HOSTILE, "error": HOSTILE_IMG, "at": now - timedelta(hours=3)},
    )
    for i in range(3):
        await db.execute(
            "INSERT INTO news.worker_reports (shard, trigger, started_at, report)"
            " VALUES ('world', 'scheduled', %(at)s, %(report)s)",
            {
                "at": now - timedelta(minutes=30 * (3 - i)),
                "report": json.dumps(
                    {
                        "queuedCount": 4 + i,
                        "processedCount": 4,
                        "acceptedCount": 3,
                        "rejectedCount": 1,
                        "deferredCount": i,
                        "deferredReasons": [HOSTILE] if i else [],
                    }
                ),
            },
        )
    # a hostile shard name reaches the chart's SVG, the one markup a template inserts raw
    await db.execute(
        "INSERT INTO news.worker_reports (shard, trigger, started_at, report)"
        " VALUES (%(shard)s, 'manual', %(at)s, '{\"queuedCount\": 2}')",
        {"shard": HOSTILE, "at": now - timedelta(minutes=10)},
    )
    return Night(
        minute_run=minute, daily_run=daily, failed_run=failed, skipped_run=skipped, account=account
    )
