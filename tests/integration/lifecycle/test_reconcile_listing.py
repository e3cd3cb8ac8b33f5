"""The reconciler's partitioned listing: it finds exactly what one sequential listing
of ``podcasts/`` finds, keeps its concurrency bound, and one failing partition fails the run
before anything changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightcrew.adapters.storage import ObjectStore, StoredObject, open_store
from nightcrew.db.database import Database
from nightcrew.errors import StoreError
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.lifecycle.reconcile.listing import load_listing
from nightcrew.lifecycle.reconcile.queries import SQL
from tests.conftest import make_runtime
from tests.integration.lifecycle.test_lanes import _snapshot
from tests.integration.lifecycle.test_reconcile import APPLY, BASE, World, later


async def _partitioned(db: Database, store: ObjectStore, concurrency: int) -> list[tuple[Any, ...]]:
    async with db.session() as conn:
        await conn.execute(SQL["drop_listing"])
        await conn.execute(SQL["create_listing"])
        try:
            await load_listing(conn, store, lambda phase, n: None, concurrency)
            rows = await conn.fetch("SELECT key, size, kind FROM reconcile_objects ORDER BY key")
        finally:
            await conn.execute(SQL["drop_listing"])
    return [(r["key"], r["size"], r["kind"]) for r in rows]


async def _sequential(store: ObjectStore) -> list[tuple[str, int]]:
    return sorted([(o.key, o.size) async for page in store.list_prefix("podcasts/") for o in page])


# Keys under podcasts/ at every depth, with names chosen to sort between and around prefixes
# ("a" < "a-b" < "a.b" < "a/" ...), objects right under podcasts/, and keys outside it.
SEGMENT = st.sampled_from(["a", "a-b", "a.b", "a0", "b", "e", "images", "transcribe-prep", "x"])
KEY = st.one_of(
    st.builds(lambda p, e, n: f"podcasts/{p}/e/{e}/{n}.mp3", SEGMENT, SEGMENT, SEGMENT),
    st.builds(lambda p, n: f"podcasts/{p}/images/{n}.jpg", SEGMENT, SEGMENT),
    st.builds(lambda p, n: f"podcasts/{p}/{n}", SEGMENT, SEGMENT),
    st.builds(lambda n: f"podcasts/{n}", SEGMENT),
    st.builds(lambda n: f"other/{n}", SEGMENT),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(keys=st.lists(KEY, max_size=60, unique=True), concurrency=st.integers(1, 5))
async def test_the_partitioned_listing_finds_exactly_what_one_listing_finds(
    db: Database, keys: list[str], concurrency: int
) -> None:
    store = open_store("memory://")
    for n, key in enumerate(keys):
        await store.put(key, b"x" * (n % 7))
    found = await _partitioned(db, store, concurrency)
    assert [(k, s) for k, s, _ in found] == await _sequential(store)


async def test_on_local_disk_too_including_a_deleted_podcasts_objects(
    db: Database, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}")
    w = await World(db, store).setup()
    await w.obj(w.key("kept.mp3"))
    for n in range(3):  # a podcast the database no longer has: its objects must be seen
        await store.put(f"podcasts/gone-{n}/e/e1/x.mp3", b"y" * 10)
    await store.put("podcasts/loose.txt", b"z")
    found = await _partitioned(db, store, 2)
    assert [(k, s) for k, s, _ in found] == await _sequential(store)
    assert len(found) == 5 and ("podcasts/loose.txt", 1, "other") in found


class CountingStore:
    """The real store; each listing page takes a moment, and listings in flight are counted."""

    def __init__(self, inner: ObjectStore, *, fail_on: str | None = None) -> None:
        self._inner = inner
        self.description, self.stats, self.remote = inner.description, inner.stats, inner.remote
        self.in_flight = 0
        self.most_in_flight = 0
        self.listed: list[str] = []
        self.fail_on = fail_on

    async def list_children(self, prefix: str) -> tuple[list[str], list[StoredObject]]:
        return await self._inner.list_children(prefix)

    async def list_prefix(self, prefix: str) -> AsyncIterator[list[StoredObject]]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.listed.append(prefix)
        try:
            await asyncio.sleep(0.01)
            if prefix == self.fail_on:
                raise StoreError(f"listing {prefix!r} failed: connection reset")
            async for page in self._inner.list_prefix(prefix):
                yield page
        finally:
            self.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_no_more_partitions_are_listed_at_once_than_the_bound(db: Database) -> None:
    inner = open_store("memory://")
    for p in range(20):
        await inner.put(f"podcasts/p{p:02d}/e/e1/a.mp3", b"x")
    for bound in (1, 3, 8):
        store = CountingStore(inner)
        found = await _partitioned(db, store, bound)  # type: ignore[arg-type]
        assert len(found) == 20
        assert store.most_in_flight == bound
        assert sorted(store.listed) == [f"podcasts/p{p:02d}/" for p in range(20)]


async def test_one_failing_partition_fails_the_run_and_changes_nothing(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}")
    w = await World(db, store).setup()
    for n in range(30):
        await w.obj(w.key(f"orphan-{n}.mp3", episode=f"e{n}"))  # orphans an apply would delete
    for n in range(10):
        await store.put(f"podcasts/other-{n:02d}/e/e1/x.mp3", b"y")
    failing = CountingStore(store, fail_on="podcasts/other-05/")
    before = await _snapshot(db)
    clock = later(days=3)
    with pytest.raises(StoreError, match="other-05"):
        await run_reconcile(await _runtime(db, clock, fresh_db_url, failing), clock, APPLY)
    assert await _snapshot(db) == before
    assert len(await _sequential(store)) == 40  # not one orphan deleted


async def _runtime(db: Database, clock: Any, url: str, store: Any) -> Any:
    return await make_runtime(
        db, clock, url, env={"R2_PUBLIC_URL": BASE, "RECONCILE_LIST_CONCURRENCY": "3"}, store=store
    )


def test_the_default_concurrency_follows_the_store() -> None:
    from nightcrew.lifecycle.reconcile.listing import list_concurrency

    local, remote = open_store("memory://"), open_store("memory://")
    remote.remote = True
    assert list_concurrency(None, remote) == 16
    assert list_concurrency(None, local) >= 1
    assert list_concurrency(5, remote) == 5
