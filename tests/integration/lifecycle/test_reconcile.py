"""The storage reconciler against real PostgreSQL and real stores (local files, moto S3)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.feedcache import HttpFeedCache
from nightcrew.adapters.storage import ObjectStore, open_store
from nightcrew.clock import FrozenClock, SystemClock
from nightcrew.db.database import Database, V
from nightcrew.db.records import R
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.lifecycle.reconcile.missing import MissingCandidate, quarantine_episode
from nightcrew.lifecycle.reconcile.queries import SQL
from nightcrew.lifecycle.reconcile.records import OutboxDrain
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.conftest import make_runtime
from tests.integration.lifecycle.test_lanes import _snapshot
from tests.support.servers import RecordingServer

BASE = "https://media.example"
APPLY = ReconcileOptions(mode="apply")
DRY = ReconcileOptions(mode="dryrun")


def later(**delta: float) -> FrozenClock:
    """Objects get the store's real mtime; the clock is moved ahead of it to age them."""
    return FrozenClock(SystemClock().now() + timedelta(**delta))


async def rt(
    db: Database,
    clock: FrozenClock,
    url: str,
    store: ObjectStore,
    *,
    window: RecheckWindow | None = None,
    **kw: Any,
) -> Runtime:
    """A runtime with R2_PUBLIC_URL set; with ``window``, its database is that wrapper."""
    env = {"R2_PUBLIC_URL": BASE}
    return await make_runtime(window or db, clock, url, env=env, store=store, **kw)  # type: ignore[arg-type]


class RecheckWindow:
    """The real database, except that ``land`` runs right before each orphan sweep's final
    re-check: what lands between a sweep's scan and its delete. (A store whose delete ran it
    would come after the re-check, too late to test it.)"""

    RECHECKS = (SQL["recheck_audio_references"], SQL["recheck_image_references"])

    def __init__(self, inner: Database, land: Callable[[], Awaitable[None]]) -> None:
        self._inner, self._land = inner, land
        self.rechecks = 0

    async def _before(self, query: str) -> None:
        if query in self.RECHECKS:
            self.rechecks += 1
            await self._land()

    async def fetch(self, query: str, params: Any = None) -> list[dict[str, Any]]:
        await self._before(query)
        return await self._inner.fetch(query, params)

    async def fetch_as(self, record: type[R], query: str, params: Any = None) -> list[R]:
        await self._before(query)
        return await self._inner.fetch_as(record, query, params)

    async def fetch_values(self, kind: type[V], query: str, params: Any = None) -> list[V]:
        await self._before(query)
        return await self._inner.fetch_values(kind, query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class World:
    """A podcast whose episodes and objects each test arranges by name."""

    def __init__(self, db: Database, store: ObjectStore) -> None:
        self.db, self.store = db, store
        self.podcast = ""

    async def setup(self) -> World:
        self.podcast = await f.podcast(self.db)
        return self

    def key(self, name: str, *, episode: str = "e1", kind: str = "") -> str:
        middle = f"{kind}/" if kind else ""
        return f"podcasts/{self.podcast}/e/{episode}/{middle}{name}"

    async def obj(self, key: str, size: int = 100) -> str:
        await self.store.put(key, b"\x00" * size)
        return key

    async def episode(self, key: str | None, **cols: Any) -> str:
        return await f.episode(
            self.db, self.podcast, audio_url=f"{BASE}/{key}" if key else None, **cols
        )

    async def exists(self, key: str) -> bool:
        return await self.store.head(key) is not None

    async def row(self, episode: str) -> dict[str, Any]:
        row = await self.db.fetch_one(
            "SELECT * FROM public.episodes WHERE id = %(e)s", {"e": episode}
        )
        assert row is not None
        return row


async def _store_keys(store: ObjectStore) -> list[tuple[str, int]]:
    return sorted([(o.key, o.size) async for page in store.list_prefix("") for o in page])


async def _seed_everything(w: World) -> dict[str, str]:
    ok = await w.obj(w.key("ok.mp3"), 100)
    wrong = await w.obj(w.key("wrong.mp3", episode="e2"), 200)
    null = await w.obj(w.key("null.mp3", episode="e3"), 300)
    orphan = await w.obj(w.key("old-upload.mp3", episode="e9"), 400)
    master = await w.obj(w.key("master.flac", episode="e4"), 500)
    image = await w.obj(w.key("cover.jpg", episode="e1", kind="images"), 10)
    stale_image = await w.obj(w.key("old.jpg", episode="e2", kind="images"), 11)
    podcast_image = await w.obj(f"podcasts/{w.podcast}/images/cover.jpg", 12)
    prep = await w.obj(w.key("chunk.wav", episode="e1", kind="transcribe-prep"), 13)
    await w.episode(
        ok, audio_file_size_bytes=100, status="published", cover_image_url=f"{BASE}/{image}"
    )
    wrong_ep = await w.episode(wrong, audio_file_size_bytes=999, status="published")
    await w.episode(null, audio_file_size_bytes=None, status="draft")
    await w.episode(
        w.key("transcoded.mp3", episode="e4"), status="draft", original_audio_url=f"{BASE}/{master}"
    )
    gone = await w.episode(
        w.key("gone.mp3", episode="e5"),
        audio_file_size_bytes=5,
        status="published",
        published_at=datetime(2026, 1, 1).astimezone(),
    )
    return {
        "ok": ok,
        "wrong": wrong,
        "null": null,
        "orphan": orphan,
        "master": master,
        "image": image,
        "stale_image": stale_image,
        "podcast_image": podcast_image,
        "prep": prep,
        "wrong_ep": wrong_ep,
        "gone": gone,
    }


async def test_a_dry_run_changes_nothing_and_reports_everything(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    keys = await _seed_everything(w)
    clock = later(days=8)
    db_before, store_before = await _snapshot(db), await _store_keys(store)

    report = await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, DRY)

    assert await _snapshot(db) == db_before
    assert await _store_keys(store) == store_before
    r = report.to_json()
    assert r["mode"] == "dryrun" and r["listing"]["objects"] == 9
    assert r["sizeBackfill"]["mismatched"] == 2 and r["sizeBackfill"]["written"] == 0
    assert {s["key"] for s in r["sizeBackfill"]["sample"]} == {keys["wrong"], keys["null"]}
    # gone.mp3 and the transcoded enclosure of e4 (only its master exists) are missing
    assert r["missing"]["count"] == 2 and r["missing"]["quarantined"] == 0
    assert [s["key"] for s in r["orphans"]["sample"]] == [keys["orphan"]]
    assert r["orphans"]["eligible"] == 1 and r["orphans"]["deleted"] == 0
    assert r["orphans"]["bytes"] == 400
    assert [s["key"] for s in r["episodeImages"]["sample"]] == [keys["stale_image"]]
    assert [s["key"] for s in r["transcribePrep"]["sample"]] == [keys["prep"]]
    assert r["outbox"] == {}  # drained on apply runs only


async def test_apply_writes_sizes_sweeps_orphans_and_keeps_every_referenced_object(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    keys = await _seed_everything(w)
    clock = later(days=8)
    report = (await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, APPLY)).to_json()

    assert report["sizeBackfill"]["written"] == 2
    assert (await w.row(keys["wrong_ep"]))["audio_file_size_bytes"] == 200
    outbox = await db.fetch(
        "SELECT podcast_id::text, reason, delivered_at FROM public.feed_invalidation_outbox"
    )
    # the published size write recorded an intent, which this same run then tried to drain
    assert [(o["podcast_id"], o["reason"]) for o in outbox] == [(w.podcast, "size_backfill")]
    # delivered by the same run: none still owed
    assert report["outbox"]["delivered"] == 1 and report["outbox"]["pending"] == 0

    assert not await w.exists(keys["orphan"])
    assert not await w.exists(keys["stale_image"])
    assert not await w.exists(keys["prep"])
    for kept in ("ok", "wrong", "null", "master", "image", "podcast_image"):
        assert await w.exists(keys[kept]), kept  # one per reference kind: never deleted
    assert report["summary"]["orphansDeleted"] == 3


async def test_an_orphan_younger_than_the_guard_is_not_deleted(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    orphan = await w.obj(w.key("fresh-upload.mp3"))
    clock = later(hours=23)  # clamped guard is 24 h; asking for less changes nothing
    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store),
        clock,
        ReconcileOptions(mode="apply", min_orphan_age_hours=1),
    )
    assert report.orphans.too_young == 1 and report.orphans.deleted == 0
    assert await w.exists(orphan)
    clock = later(hours=25)
    report = await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, APPLY)
    assert report.orphans.deleted == 1 and not await w.exists(orphan)


async def test_an_orphan_referenced_inside_the_recheck_window_is_not_deleted(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    audio = await w.obj(w.key("late.mp3"))
    image = await w.obj(w.key("late.jpg", kind="images"))
    clock = later(days=2)

    calls: list[str] = []

    async def finalize_lands() -> None:  # between each sweep's scan and its delete
        if not calls:
            calls.append(await w.episode(audio))  # the audio sweep's window
        else:
            await db.execute(
                "UPDATE public.episodes SET cover_image_url = %(u)s WHERE id = %(e)s",
                {"u": f"{BASE}/{image}", "e": calls[0]},
            )

    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store, window=RecheckWindow(db, finalize_lands)),
        clock,
        APPLY,
    )
    assert report.orphans.eligible == 1 and report.orphans.referenced_at_recheck == 1
    assert report.episode_images.referenced_at_recheck == 1
    assert report.orphans.deleted == 0 and report.episode_images.deleted == 0
    assert await w.exists(audio) and await w.exists(image)


async def test_skip_orphan_delete_and_pending_invalidation_protect_audio(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    audio = await w.obj(w.key("superseded.mp3"))
    clock = later(days=2)
    runtime = await rt(db, clock, fresh_db_url, store)
    report = await run_reconcile(
        runtime, clock, ReconcileOptions(mode="apply", skip_orphan_delete=True)
    )
    assert report.orphans.eligible == 1 and report.orphans.deleted == 0

    await db.execute(
        "INSERT INTO public.feed_invalidation_outbox (podcast_id, reason) VALUES (%(p)s, 'test')",
        {"p": w.podcast},
    )
    # a dry run must not drain (and so unprotect) the outbox: nothing is delivered
    report = await run_reconcile(runtime, clock, DRY)
    assert report.orphans.protected == 1 and report.orphans.eligible == 0
    assert await w.exists(audio)


async def test_bigint_equal_sizes_are_never_rewritten(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    key = await w.obj(w.key("same.mp3"), 4242)
    episode = await w.episode(
        key,
        audio_file_size_bytes=4242,
        status="published",
        updated_at=datetime(2026, 1, 1).astimezone(),
    )
    before = await w.row(episode)
    clock = later(days=2)
    report = await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, APPLY)
    assert report.size_backfill.mismatched == 0 and report.size_backfill.written == 0
    after = await w.row(episode)
    assert after["updated_at"] == before["updated_at"]  # no bump, no feed churn
    assert await db.fetch("SELECT 1 FROM public.feed_invalidation_outbox") == []


# --- quarantine -----------------------------------------------------------------------------
async def test_quarantine_is_the_complete_transition(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    published = await w.episode(
        w.key("lost.mp3"),
        status="published",
        audio_file_size_bytes=9,
        published_at=datetime(2026, 1, 1).astimezone(),
    )
    draft = await w.episode(w.key("lost-draft.mp3", episode="e2"), status="draft")
    await db.execute(
        "INSERT INTO public.automation_jobs (episode_id, trigger_type, status)"
        " VALUES (%(e)s, 'time', 'pending'), (%(e)s, 'event', 'pending'),"
        " (%(e)s, 'time', 'done')",
        {"e": published},
    )
    clock = later(days=1)
    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store),
        clock,
        ReconcileOptions(mode="apply", quarantine_missing=True),
    )
    assert report.missing.count == 2 and report.missing.quarantined == 2
    row = await w.row(published)
    assert row["audio_url"] is None and row["audio_file_size_bytes"] is None
    assert row["status"] == "draft" and row["published_at"] is None
    jobs = await db.fetch(
        "SELECT trigger_type, status FROM public.automation_jobs ORDER BY trigger_type, status"
    )
    assert [(j["trigger_type"], j["status"]) for j in jobs] == [
        ("event", "pending"),
        ("time", "canceled"),
        ("time", "done"),
    ]
    assert (await w.row(draft))["status"] == "draft"
    reasons = await db.fetch("SELECT reason FROM public.feed_invalidation_outbox")
    assert [r["reason"] for r in reasons] == ["quarantine_missing"]  # the published one only


async def test_quarantine_uses_the_current_status_not_the_scanned_one(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    key = w.key("went-live.mp3")
    episode = await w.episode(key, status="draft")
    scanned = MissingCandidate(
        id=uuid.UUID(episode), status="draft", audio_url=f"{BASE}/{key}", key=key
    )
    # between the scan and the quarantine, the draft goes live
    await db.execute(
        "UPDATE public.episodes SET status = 'published', published_at = now() WHERE id = %(e)s",
        {"e": episode},
    )
    clock = later(days=1)
    assert await quarantine_episode(await rt(db, clock, fresh_db_url, store), scanned, clock.now())
    row = await w.row(episode)
    assert row["status"] == "draft" and row["published_at"] is None and row["audio_url"] is None
    outbox = await db.fetch("SELECT reason FROM public.feed_invalidation_outbox")
    assert [o["reason"] for o in outbox] == ["quarantine_missing"]


async def test_an_error_mid_quarantine_rolls_everything_back(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    episode = await w.episode(
        w.key("lost.mp3"), status="published", published_at=datetime(2026, 1, 1).astimezone()
    )
    await db.execute(
        "INSERT INTO public.automation_jobs (episode_id, trigger_type) VALUES (%(e)s, 'time')",
        {"e": episode},
    )
    await db.execute(
        "CREATE FUNCTION public.explode() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'automation store on fire'; END $$"
    )
    await db.execute(
        "CREATE TRIGGER explode BEFORE UPDATE ON public.automation_jobs"
        " FOR EACH ROW EXECUTE FUNCTION public.explode()"
    )
    before = await w.row(episode)
    clock = later(days=1)
    with capture_logs() as logs:
        report = await run_reconcile(
            await rt(db, clock, fresh_db_url, store),
            clock,
            ReconcileOptions(mode="apply", quarantine_missing=True),
        )
    assert report.missing.quarantined == 0 and len(report.missing.failures) == 1
    assert await w.row(episode) == before  # the episode update was rolled back with the rest
    assert await db.fetch("SELECT 1 FROM public.feed_invalidation_outbox") == []
    assert any(e["event"] == "reconcile_quarantine_failed" for e in logs)


# --- outbox -------------------------------------------------------------------------------
async def _outbox_rows(db: Database) -> list[dict[str, Any]]:
    return await db.fetch(
        "SELECT podcast_id::text, delivered_at, attempts, last_error"
        " FROM public.feed_invalidation_outbox ORDER BY created_at"
    )


@pytest.mark.parametrize("failure", ["500", "timeout"])
async def test_outbox_failures_leave_the_row_pending_with_the_error(
    db: Database, fresh_db_url: str, feed_server: RecordingServer, failure: str
) -> None:
    import time as _time

    podcast = await f.podcast(db)
    await db.execute(
        "INSERT INTO public.feed_invalidation_outbox (podcast_id, reason)"
        " VALUES (%(p)s, 'size_backfill')",
        {"p": podcast},
    )
    if failure == "500":
        feed_server.status = 500
    else:

        def slow(request: Any) -> tuple[int, dict[str, Any]]:
            _time.sleep(2.0)  # far past the client's 0.3 s
            return 200, {}

        feed_server.responder = slow
    clock = later(days=1)
    async with httpx.AsyncClient() as http:
        # the read times out, not the connect: a loaded machine may take longer than 0.3 s to
        # accept, and then the server never sees the request this test looks at
        feed = HttpFeedCache(
            http, feed_server.url, "s", wait_timeout=httpx.Timeout(0.3, connect=10.0)
        )
        runtime = await rt(db, clock, fresh_db_url, open_store("memory://"), feedcache=feed)
        report = await run_reconcile(runtime, clock, APPLY)
        assert report.outbox == OutboxDrain(pending=1, delivered=0, failed=1, dead=0)
        [row] = await _outbox_rows(db)
        assert row["delivered_at"] is None and row["attempts"] == 1
        assert ("500" if failure == "500" else "Timeout") in row["last_error"]
        [call] = feed_server.requests
        assert call.query == {"wait": "1"} and call.json() == {"id": podcast}

        feed_server.reset()  # the feed worker recovers: the next apply run delivers it
        await asyncio.sleep(2.1)  # the loopback server answers one request at a time
        clock.advance(timedelta(hours=1))  # past its backoff (the minute lane would be first)
        report = await run_reconcile(runtime, clock, APPLY)
    assert report.outbox is not None and report.outbox.delivered == 1
    [row] = await _outbox_rows(db)
    assert row["delivered_at"] == clock.now() and row["attempts"] == 2
    assert row["last_error"] is None


# --- the storage cap -----------------------------------------------------------------------
async def _capped_world(db: Database, store: ObjectStore) -> tuple[World, str]:
    await db.execute(
        "INSERT INTO public.plan_limits VALUES ('tiny', 'storage_gb_per_account', 0.000001)"
    )  # 1,000 bytes
    account = await f.account(db, plan="tiny")
    w = World(db, store)
    w.podcast = await f.podcast(db, billing_account_id=account)
    key = await w.obj(w.key("big.mp3"), 5000)
    episode = await w.episode(key, audio_file_size_bytes=None, status="draft")
    return w, episode


async def test_a_cap_violation_is_listed_not_fatal(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    _, episode = await _capped_world(db, store)
    clock = later(days=1)
    report = await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, APPLY)
    assert report.size_backfill.written == 0
    [blocked] = report.size_backfill.blocked_over_cap
    assert blocked.episode_id == episode and blocked.measured == 5000
    assert report.over_cap == ()  # nothing recorded over cap yet: the write was refused
    assert "capBypassFallback" not in report.to_json()["sizeBackfill"]


async def test_the_cap_bypass_writes_and_re_enables_the_trigger(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w, episode = await _capped_world(db, store)
    clock = later(days=1)
    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store),
        clock,
        ReconcileOptions(mode="apply", bypass_cap_for_backfill=True),
    )
    assert report.size_backfill.written == 1
    assert report.size_backfill.cap_bypass_fallback is False
    assert (await w.row(episode))["audio_file_size_bytes"] == 5000
    trigger = await db.fetch_one(
        "SELECT tgenabled FROM pg_trigger WHERE tgname = 'trigger_enforce_storage_account_cap'"
    )
    assert trigger == {"tgenabled": "O"}  # enabled again
    assert [a.over_bytes for a in report.over_cap] == [4000]  # now reported, never deleted


async def test_without_alter_privilege_the_bypass_falls_back_to_the_active_path(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w, episode = await _capped_world(db, store)
    role = f"app_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    await db.execute(f"GRANT USAGE ON SCHEMA public, nightcrew, auth TO {role}")
    await db.execute(
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public,"
        f" nightcrew, auth TO {role}"
    )
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(fresh_db_url)
    netloc = parts.netloc.split("@", 1)[-1]
    app_url = urlunsplit(parts._replace(netloc=f"{role}@{netloc}"))
    app_db = await Database.open(app_url)
    try:
        clock = later(days=1)
        report = await run_reconcile(
            await rt(app_db, clock, app_url, store),
            clock,
            ReconcileOptions(mode="apply", bypass_cap_for_backfill=True),
        )
    finally:
        await app_db.close()
    assert report.size_backfill.cap_bypass_fallback is True
    assert len(report.size_backfill.blocked_over_cap) == 1
    assert (await w.row(episode))["audio_file_size_bytes"] is None


async def test_a_url_with_a_query_string_still_references_its_object(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    audio = await w.obj(w.key("versioned.mp3"), 100)
    master = await w.obj(w.key("versioned.flac"), 200)
    image = await w.obj(w.key("cover.jpg", kind="images"), 10)
    await f.episode(
        db,
        w.podcast,
        audio_url=f"{BASE}/{audio}?v=2",
        audio_file_size_bytes=100,
        original_audio_url=f"{BASE}/{master}?download=1",
        cover_image_url=f"{BASE}/{image}?w=300",
    )
    clock = later(days=3)
    report = await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, APPLY)
    assert report.orphans.found == 0 and report.episode_images.found == 0
    assert await w.exists(audio) and await w.exists(master) and await w.exists(image)


async def test_the_recheck_matches_a_query_string_reference_and_a_late_invalidation(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    first = await w.obj(w.key("first.mp3"))
    other = await World(db, store).setup()
    second = await other.obj(other.key("second.mp3"))
    clock = later(days=3)

    async def window() -> None:
        await w.episode(first + "?v=3")  # a finalize that lands with a query string
        await db.execute(
            "INSERT INTO public.feed_invalidation_outbox (podcast_id, reason)"
            " VALUES (%(p)s, 'late')",
            {"p": other.podcast},
        )

    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store, window=RecheckWindow(db, window)), clock, APPLY
    )
    assert report.orphans.eligible == 2 and report.orphans.referenced_at_recheck == 2
    assert await w.exists(first) and await other.exists(second)


async def test_the_recheck_decodes_a_percent_encoded_reference_and_keeps_an_unknown_podcast(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    """Only URLs with '%', '?' or '#' (or nothing after the prefix) are decoded at the
    re-check; these two land in the window and must still save their objects."""
    w = await World(db, store).setup()
    spaced = await w.obj(w.key("my a.mp3"))
    other = await World(db, store).setup()
    kept = await other.obj(other.key("kept.mp3"))
    clock = later(days=3)

    async def window() -> None:
        await w.episode(w.key("my%20a.mp3"))  # references "my a.mp3"
        # a URL whose key cannot be derived: its podcast keeps all its audio
        await f.episode(db, other.podcast, audio_url=f"{BASE}/")

    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store, window=RecheckWindow(db, window)), clock, APPLY
    )
    assert report.orphans.eligible == 2 and report.orphans.referenced_at_recheck == 2
    assert await w.exists(spaced) and await other.exists(kept)


async def test_skip_orphan_delete_keeps_expired_prep_too(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    prep = await w.obj(w.key("chunk.wav", kind="transcribe-prep"))
    clock = later(days=8)
    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store),
        clock,
        ReconcileOptions(mode="apply", skip_orphan_delete=True),
    )
    assert report.transcribe_prep.eligible == 1 and report.transcribe_prep.deleted == 0
    assert await w.exists(prep)


async def test_a_listing_that_fails_midway_fails_the_run_and_changes_nothing(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    from nightcrew.errors import StoreError

    store = open_store(f"file://{tmp_path}")
    w = await World(db, store).setup()
    for n in range(1500):
        await w.obj(w.key(f"{n}.mp3", episode=f"e{n}"))

    class BreaksAfterOnePage:
        def __init__(self, inner: ObjectStore) -> None:
            self._inner, self.description, self.stats = inner, inner.description, inner.stats

        async def list_prefix(self, prefix: str) -> Any:
            async for page in self._inner.list_prefix(prefix):
                yield page
                raise StoreError("listing 'podcasts/' failed: connection reset")

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    before = await _snapshot(db)
    clock = later(days=3)
    with pytest.raises(StoreError, match="connection reset"):
        await run_reconcile(
            await rt(db, clock, fresh_db_url, BreaksAfterOnePage(store)), clock, APPLY
        )
    assert await _snapshot(db) == before
    assert len(await _store_keys(store)) == 1500


async def test_an_episode_that_lands_while_the_store_is_listed_keeps_its_object(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    """The episodes' keys are derived while the listing runs, so they may predate an episode
    that lands during it: whichever way that race goes, its old object is not deleted (the
    re-check before each delete reads the database as it is then)."""
    w = await World(db, store).setup()
    audio = await w.obj(w.key("restored.mp3"))
    landed: list[str] = []

    class LandsDuringListing:
        def __init__(self, inner: ObjectStore) -> None:
            self._inner, self.description, self.stats = inner, inner.description, inner.stats

        async def list_prefix(self, prefix: str) -> Any:
            async for page in self._inner.list_prefix(prefix):
                if not landed:
                    landed.append(await w.episode(audio, audio_file_size_bytes=100))
                yield page

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    clock = later(days=3)
    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, LandsDuringListing(store)),  # type: ignore[arg-type]
        clock,
        APPLY,
    )
    assert landed and await w.exists(audio)
    assert report.orphans.deleted == 0
    assert report.orphans.found == report.orphans.referenced_at_recheck  # 0 or 1: the race


async def test_an_orphan_the_store_refuses_to_delete_is_reported_and_logged(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    from structlog.testing import capture_logs

    from nightcrew.adapters.storage import DeleteOutcome

    w = await World(db, store).setup()
    kept, gone = await w.obj(w.key("refused.mp3")), await w.obj(w.key("deleted.mp3"))

    class RefusesOne:
        def __init__(self, inner: ObjectStore) -> None:
            self._inner, self.description, self.stats = inner, inner.description, inner.stats

        async def delete(self, keys: Sequence[str]) -> DeleteOutcome:
            outcome = await self._inner.delete([k for k in keys if k != kept])
            if kept in keys:
                outcome.failed[kept] = "AccessDenied: object locked"
            return outcome

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    clock = later(days=3)
    with capture_logs() as logs:
        report = await run_reconcile(
            await rt(db, clock, fresh_db_url, RefusesOne(store)), clock, APPLY
        )
    assert report.orphans.deleted == 1 and dict(report.orphans.failed) == {
        kept: "AccessDenied: object locked"
    }
    assert await w.exists(kept) and not await w.exists(gone)
    [entry] = [e for e in report.errors if e["event"] == "reconcile_delete_failed"]
    assert entry["failed"] == 1 and entry["error"] == "AccessDenied: object locked"
    [line] = [e for e in logs if e["event"] == "reconcile_delete_failed"]
    assert line["log_level"] == "warning" and line["kind"] == entry["kind"]
