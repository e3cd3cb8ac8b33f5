"""What `--now` can and cannot move (README, "Time travel"): nightcrew's clock moves; the
platform's effective_cap() resolves at the database's own time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.overage import run_overage_escalation
from tests import factories as f
from tests.conftest import make_runtime


async def test_a_walk_past_an_overrides_expiry_still_sees_the_override(
    db: Database, fresh_db_url: str
) -> None:
    await db.execute("INSERT INTO public.plan_limits VALUES ('solo', 'podcasts_per_account', 1)")
    account = await f.account(db, plan="solo")
    for _ in range(2):
        await f.podcast(db, billing_account_id=account)
    real_now = datetime.now(UTC)
    await db.execute(
        "INSERT INTO public.cap_overrides (billing_account_id, resource, limit_value, expires_at)"
        " VALUES (%(a)s, 'podcasts_per_account', 5, %(until)s)",
        {"a": account, "until": real_now + timedelta(hours=1)},
    )

    # two days "later" by nightcrew's clock: the override has not expired in the database
    clock = FrozenClock(real_now + timedelta(days=2))
    report = await run_overage_escalation(await make_runtime(db, clock, fresh_db_url), clock)
    assert (report.scanned, report.armed) == (0, 0)

    # once it really has expired, the same clock arms the account
    await db.execute(
        "UPDATE public.cap_overrides SET expires_at = %(past)s WHERE billing_account_id = %(a)s",
        {"a": account, "past": real_now - timedelta(seconds=1)},
    )
    report = await run_overage_escalation(await make_runtime(db, clock, fresh_db_url), clock)
    assert report.armed == 1
    armed = await db.fetch_one(
        "SELECT content_overage_since FROM public.billing_accounts WHERE id = %(a)s",
        {"a": account},
    )
    assert armed == {"content_overage_since": clock.now()}  # armed as of nightcrew's clock
