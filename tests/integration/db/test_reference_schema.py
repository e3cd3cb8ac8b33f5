"""The reference schema's functions and triggers behave as spec 000 says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nightcrew.db.database import Database, QueryError
from tests import factories as f

GB = 10**9


async def _cap(db: Database, account: str, resource: str = "storage_gb_per_account") -> object:
    row = await db.fetch_one(
        "SELECT public.effective_cap(%(a)s, %(r)s) AS cap", {"a": account, "r": resource}
    )
    assert row is not None
    return row["cap"]


async def test_effective_cap_plan_credits_overrides_and_unlimited(db: Database) -> None:
    """Spec 000: effective_cap(account, 'storage_gb_per_account') "(NULL = unlimited)", and it
    "resolves live — overrides and credit pools included" (at the database's now())."""
    await db.execute(
        "INSERT INTO public.plan_limits (plan, resource, limit_value) VALUES"
        " ('starter', 'storage_gb_per_account', 5), ('starter', 'podcasts_per_account', 1),"
        " ('pro', 'storage_gb_per_account', NULL)"
    )
    starter = await f.account(db, plan="starter")
    assert await _cap(db, starter) == 5
    assert await _cap(db, starter, "podcasts_per_account") == 1
    assert await _cap(db, await f.account(db, plan="pro")) is None  # NULL limit: unlimited
    assert await _cap(db, await f.account(db, plan="unknown")) is None  # no row: unlimited

    await db.execute(
        "INSERT INTO public.credit_pools (billing_account_id, resource, amount, expires_at)"
        " VALUES (%(a)s, 'storage_gb_per_account', 2, NULL),"
        "        (%(a)s, 'storage_gb_per_account', 10, %(expired)s)",
        {"a": starter, "expired": datetime.now(UTC) - timedelta(seconds=1)},
    )
    assert await _cap(db, starter) == 7  # expired credits do not count

    await db.execute(
        "INSERT INTO public.cap_overrides (billing_account_id, resource, limit_value)"
        " VALUES (%(a)s, 'storage_gb_per_account', 50)",
        {"a": starter},
    )
    assert await _cap(db, starter) == 50  # an override wins outright


async def test_storage_cap_trigger_blocks_growth_but_never_a_shrink(db: Database) -> None:
    await db.execute("INSERT INTO public.plan_limits VALUES ('tiny', 'storage_gb_per_account', 1)")
    account = await f.account(db, plan="tiny")
    podcast = await f.podcast(db, billing_account_id=account)
    episode = await f.episode(
        db, podcast, audio_file_size_bytes=600_000_000, original_audio_file_size_bytes=300_000_000
    )
    with pytest.raises(QueryError) as caught:
        await f.episode(db, podcast, audio_file_size_bytes=200_000_000)  # 1.1 GB > 1 GB
    assert caught.value.sqlstate == "23514"
    # exactly at the cap is allowed
    await f.episode(db, podcast, audio_file_size_bytes=100_000_000)
    # shrinking while at (or over) the cap always goes through
    await db.execute(
        "UPDATE public.episodes SET audio_file_size_bytes = NULL WHERE id = %(id)s",
        {"id": episode},
    )
    total = await db.fetch_one(
        "SELECT sum(coalesce(audio_file_size_bytes,0) + coalesce(original_audio_file_size_bytes,0))"
        " AS b FROM public.episodes"
    )
    assert total == {"b": 400_000_000}


async def test_guard_refuses_user_jwt_writes_to_platform_owned_columns(db: Database) -> None:
    podcast = await f.podcast(db)
    episode = await f.episode(db, podcast, audio_url="https://media.example/a.mp3")
    uid = await f.user(db)
    async with db.transaction() as tx:
        await tx.execute("SELECT set_config('request.jwt.claim.sub', %(u)s, true)", {"u": uid})
        await tx.execute(
            "UPDATE public.podcasts SET title = 'renamed' WHERE id = %(p)s", {"p": podcast}
        )  # ordinary columns are fine
    for statement in (
        "UPDATE public.podcasts SET overage_suspended_at = now() WHERE id = %(p)s",
        "UPDATE public.episodes SET audio_file_size_bytes = 1 WHERE podcast_id = %(p)s",
        "UPDATE public.episodes SET original_audio_url = 'x' WHERE podcast_id = %(p)s",
    ):
        with pytest.raises(QueryError) as caught:
            async with db.transaction() as tx:
                await tx.execute(
                    "SELECT set_config('request.jwt.claim.sub', %(u)s, true)", {"u": uid}
                )
                await tx.execute(statement, {"p": podcast})
        assert caught.value.sqlstate == "42501", statement
    # the service role (no JWT) may write them
    await db.execute(
        "UPDATE public.episodes SET audio_file_size_bytes = 5 WHERE id = %(e)s", {"e": episode}
    )


async def test_reap_unconfirmed_users_skips_what_a_foreign_key_still_holds(db: Database) -> None:
    """Spec 000: public.reap_unconfirmed_users(interval) deletes every unconfirmed, non-invited
    user older than the retention; "a row still held by a NO ACTION foreign key is skipped with
    a Postgres WARNING and counted in skipped". The cut-off is the database's now()."""
    now = datetime.now(UTC)
    old = now - timedelta(days=7, minutes=5)
    reaped = await f.user(db, created_at=old)
    held = await f.user(db, created_at=old)
    await f.account(db, owner_user_id=held)  # NO ACTION: blocks the delete
    young = await f.user(db, created_at=now - timedelta(days=6, hours=23))
    confirmed = await f.user(db, created_at=old, email_confirmed_at=old)
    invited = await f.user(db, created_at=old, invited_at=old)

    row = await db.fetch_one("SELECT * FROM public.reap_unconfirmed_users(interval '7 days')")
    assert row == {"deleted": 1, "skipped": 1}
    left = {r["id"] for r in await db.fetch("SELECT id::text FROM auth.users")}
    assert reaped not in left
    assert {held, young, confirmed, invited} <= left


async def test_platform_functions_have_exactly_the_spec_signatures(db: Database) -> None:
    """The reference schema creates the platform's functions as spec 000 names them, and
    nothing else of nightcrew's in the platform's schemas."""
    rows = await db.fetch(
        "SELECT n.nspname || '.' || p.proname || '(' ||"
        " pg_get_function_identity_arguments(p.oid) || ') -> ' || pg_get_function_result(p.oid)"
        " AS sig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname IN ('public', 'auth') AND p.prorettype <> 'trigger'::regtype"
        " ORDER BY 1"
    )
    assert [r["sig"] for r in rows] == [
        "auth.uid() -> uuid",
        "public.effective_cap(account uuid, resource text) -> numeric",
        "public.notify_media_job_result(job_id uuid) -> void",
        "public.reap_unconfirmed_users(retention interval) -> "
        "TABLE(deleted integer, skipped integer)",
    ]
    cap_trigger = await db.fetch_one(
        "SELECT p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        " WHERE t.tgname = 'trigger_enforce_storage_account_cap'"
        " AND t.tgrelid = 'public.episodes'::regclass"
    )
    assert cap_trigger is not None
    assert "nightcrew." not in cap_trigger["prosrc"]  # the platform's trigger counts for itself


async def test_one_active_hosting_migration_per_podcast(db: Database) -> None:
    podcast = await f.podcast(db)
    await f.podcast_import(db, podcast, status="preview", is_hosting_migration=True)
    with pytest.raises(QueryError) as caught:
        await f.podcast_import(db, podcast, status="running", is_hosting_migration=True)
    assert caught.value.sqlstate == "23505"
    await f.podcast_import(db, podcast, status="running")  # ordinary imports are not limited
