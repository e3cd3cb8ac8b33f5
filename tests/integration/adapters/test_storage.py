"""The storage adapter on real stores: local files, memory, S3 through moto on loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nightcrew.adapters.storage import (
    ObjectStore,
    ReadOnlyStore,
    delete_prefix,
    open_store,
)
from nightcrew.errors import ConfigError
from tests.conftest import real_store


@pytest.fixture(params=["file", "memory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    return real_store(request.param, request, tmp_path)


async def test_put_head_list_delete(store: ObjectStore) -> None:
    await store.put("podcasts/p/e/1/a.mp3", b"12345")
    await store.put("podcasts/p/images/cover.jpg", b"1")
    await store.put("podcasts/q/e/1/b.mp3", b"1")
    head = await store.head("podcasts/p/e/1/a.mp3")
    assert head is not None and head.size == 5 and head.last_modified.tzinfo is not None
    assert await store.head("podcasts/p/nope.mp3") is None
    assert await store.get("podcasts/p/e/1/a.mp3") == b"12345"
    assert await store.get("podcasts/p/nope.mp3") is None
    listed = sorted([o.key async for page in store.list_prefix("podcasts/p/") for o in page])
    assert listed == ["podcasts/p/e/1/a.mp3", "podcasts/p/images/cover.jpg"]
    # a prefix is a folder: podcasts/p/ never matches podcasts/pq/…
    assert [o async for page in store.list_prefix("podcasts/nothing/") for o in page] == []

    result = await delete_prefix(store, "podcasts/p/")
    assert (result.listed, result.deleted, result.left, result.failed) == (2, 2, 0, {})
    assert result.bytes_deleted == 6
    assert await store.head("podcasts/q/e/1/b.mp3") is not None


async def test_deleting_a_missing_key_counts_as_deleted(store: ObjectStore) -> None:
    await store.put("k/a", b"1")
    outcome = await store.delete(["k/a", "k/never-existed"])
    assert outcome.deleted == 2 and outcome.failed == {}


@contextmanager
def undeletable(path: Path) -> Iterator[None]:
    """Make one real file impossible to delete: immutable as root, a read-only folder if not."""
    if os.geteuid() == 0:
        if (
            shutil.which("chattr") is None
            or subprocess.run(
                ["chattr", "+i", str(path)], capture_output=True, check=False
            ).returncode
            != 0
        ):
            pytest.skip("needs chattr +i (CAP_LINUX_IMMUTABLE) to make a file undeletable")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=False)
    else:
        path.parent.chmod(0o500)
        try:
            yield
        finally:
            path.parent.chmod(0o700)


async def test_a_failed_batch_is_retried_key_by_key_and_each_error_is_reported(
    tmp_path: Path,
) -> None:
    store = open_store(f"file://{tmp_path}")
    await store.put("p/a.mp3", b"1")
    await store.put("p/locked/b.mp3", b"1")
    await store.put("p/c.mp3", b"1")
    with undeletable(tmp_path / "p" / "locked" / "b.mp3"):
        outcome = await store.delete(["p/a.mp3", "p/locked/b.mp3", "p/c.mp3"])
        result = await delete_prefix(store, "p/")
    assert outcome.deleted == 2
    assert list(outcome.failed) == ["p/locked/b.mp3"]
    assert (
        "ermission" in outcome.failed["p/locked/b.mp3"]
        or "ermitted" in outcome.failed["p/locked/b.mp3"]
    )
    assert store.stats.delete_requests >= 1 + 3  # the batch, then each key on its own
    assert await store.head("p/a.mp3") is None and await store.head("p/c.mp3") is None
    assert result.left == 1 and list(result.failed) == ["p/locked/b.mp3"]


async def test_a_dry_run_store_reads_but_never_deletes(tmp_path: Path) -> None:
    real = open_store(f"file://{tmp_path}")
    await real.put("p/a.mp3", b"1")
    dry = ReadOnlyStore(real)
    result = await delete_prefix(dry, "p/")
    assert result.deleted == 1 and dry.would_delete == ["p/a.mp3"]
    assert await real.head("p/a.mp3") is not None


async def test_delete_prefix_refuses_a_non_folder_prefix() -> None:
    with pytest.raises(ValueError, match="not a folder"):
        await delete_prefix(open_store("memory://"), "podcasts/abc")
    with pytest.raises(ValueError, match="not a folder"):
        await delete_prefix(open_store("memory://"), "")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://x", "unsupported scheme"),
        ("s3://?region=x", "needs a bucket"),
        ("s3://b?endpoint=http://x&colour=blue", "unknown s3 option"),
    ],
)
def test_bad_storage_urls_are_one_line_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_store(url)
