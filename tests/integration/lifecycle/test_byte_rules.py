"""Spec 000's two byte rules, each written once in schema nightcrew (migration 0021), and an
account that the two judge differently: over its cap only when masters count."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from nightcrew.adapters.mail import RecordingMailer
from nightcrew.adapters.storage import open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.overage import reconcile_account_overage, run_overage_escalation
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from tests import factories as f
from tests.conftest import make_runtime

GB = 1_000_000_000


async def _bytes(db: Database, rule: str) -> dict[str, int]:
    rows = await db.fetch(f"SELECT account_id::text, bytes FROM nightcrew.{rule}()")
    return {r["account_id"]: int(r["bytes"]) for r in rows}


async def _masters_account(db: Database) -> str:
    """A 1 GB plan holding 0.6 GB of enclosures and 0.6 GB of FLAC masters, plus 0.3 GB of
    enclosure in a podcast scheduled for deletion. Stored while the plan allowed it."""
    await db.execute(
        "INSERT INTO public.plan_limits VALUES ('one_gb', 'storage_gb_per_account', 1),"
        " ('one_gb', 'podcasts_per_account', 5), ('unlimited', 'storage_gb_per_account', NULL)"
    )
    account = await f.account(db, plan="unlimited")
    live = await f.podcast(db, billing_account_id=account)
    leaving = await f.podcast(db, billing_account_id=account, status="pending_deletion")
    await f.episode(
        db, live, audio_file_size_bytes=int(0.6 * GB), original_audio_file_size_bytes=int(0.6 * GB)
    )
    await f.episode(db, leaving, audio_file_size_bytes=int(0.3 * GB))
    await db.execute(
        "UPDATE public.billing_accounts SET plan = 'one_gb' WHERE id = %(a)s", {"a": account}
    )
    return account


async def test_the_over_cap_report_rule_counts_enclosure_and_master(db: Database) -> None:
    """Spec 000, job 4: "Plus an over-cap report — per billing account,
    SUM(audio_file_size_bytes + original_audio_file_size_bytes) (count-both: enclosure +
    master, mirroring the storage cap trigger — media plane §6.4)". Every podcast of the
    account counts, as the cap trigger counts it."""
    account = await _masters_account(db)
    assert (await _bytes(db, "overcap_report_bytes"))[account] == int(1.5 * GB)


async def test_the_escalation_rule_counts_enclosures_over_non_pending_deletion_podcasts(
    db: Database,
) -> None:
    """Spec 000, the escalation's scan: "storage = SUM(episodes.audio_file_size_bytes) over
    non-pending_deletion podcasts"."""
    account = await _masters_account(db)
    assert (await _bytes(db, "escalation_storage_bytes"))[account] == int(0.6 * GB)


async def test_an_account_over_only_when_masters_count_is_reported_but_never_armed(
    db: Database, fresh_db_url: str
) -> None:
    account = await _masters_account(db)
    clock = FrozenClock(datetime.now(UTC))
    mailer = RecordingMailer()
    runtime = await make_runtime(
        db,
        clock,
        fresh_db_url,
        env={"R2_PUBLIC_URL": "https://media.example"},
        mail=mailer,
        store=open_store("memory://"),
    )

    sweep = await run_overage_escalation(runtime, clock)
    webhook = await reconcile_account_overage(runtime, clock, account)
    assert (sweep.armed, webhook.armed) == (0, 0)
    clock_row = await db.fetch_one(
        "SELECT content_overage_since FROM public.billing_accounts WHERE id = %(a)s",
        {"a": account},
    )
    assert clock_row == {"content_overage_since": None}
    assert mailer.sent == []

    report = await run_reconcile(runtime, clock, ReconcileOptions(mode="dryrun"))
    [over] = report.over_cap
    assert (over.account_id, over.bytes, over.cap_bytes) == (account, int(1.5 * GB), GB)
    assert report.to_json()["summary"]["overCapAccounts"] == 1


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("overcap_report_bytes", 1_500), ("escalation_storage_bytes", 600)],
)
async def test_one_accounts_figure_reads_only_that_accounts_episodes(
    db: Database, rule: str, expected: int
) -> None:
    """The per-account lookup (`… WHERE account_id = $1`) is the same rule, and the planner
    pushes the filter below the rule's GROUP BY: no scan of every account's episodes."""
    account = await _masters_account(db)
    other = await f.account(db)
    await f.episode(db, await f.podcast(db, billing_account_id=other), audio_file_size_bytes=7)
    row = await db.fetch_one(
        f"SELECT bytes FROM nightcrew.{rule}() WHERE account_id = %(a)s", {"a": account}
    )
    assert row is not None and int(row["bytes"]) // 1_000_000 == expected
    plan = await db.fetch(
        f"EXPLAIN (COSTS OFF) SELECT bytes FROM nightcrew.{rule}() WHERE account_id = %(a)s",
        {"a": account},
    )
    text = "\n".join(r["QUERY PLAN"] for r in plan)
    assert "billing_account_id = " in text, text  # the account filter reached the podcasts scan
