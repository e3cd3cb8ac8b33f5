"""Object storage on obstore: ``file://…``, ``s3://bucket?endpoint=…&region=…`` or ``memory://``.

Listing streams pages of up to 1000 objects (one S3 ListObjectsV2 request each), so memory stays
flat however large a prefix is. Deletes go out in batches of at most 1000 keys (one S3
DeleteObjects request each). obstore reports a failed batch as one exception, so a failed batch
is retried key by key: every key's own outcome is read and reported, none is ignored, and a key
that is already gone counts as deleted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import parse_qs, urlsplit

import obstore
from obstore.exceptions import NotFoundError
from obstore.store import LocalStore, MemoryStore, S3Store

from nightcrew.errors import ConfigError, StoreError
from nightcrew.log import describe_error

if TYPE_CHECKING:
    from obstore.store import ClientConfig

# A missing object: obstore raises the builtin FileNotFoundError or its own NotFoundError.
NOT_FOUND: tuple[type[BaseException], ...] = (FileNotFoundError, NotFoundError)

MAX_KEYS_PER_DELETE = 1000
LIST_PAGE_SIZE = 1000
# Concurrency of the key-by-key retry of a failed batch.
SINGLE_DELETE_CONCURRENCY = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredObject:
    key: str
    size: int
    last_modified: datetime


@dataclass(kw_only=True, slots=True)
class StoreStats:
    """Operations issued, by kind: each maps to one request on S3-compatible stores."""

    list_pages: int = 0
    heads: int = 0
    puts: int = 0
    delete_requests: int = 0

    @property
    def requests(self) -> int:
        return self.list_pages + self.heads + self.puts + self.delete_requests


@dataclass(kw_only=True, slots=True)
class DeleteOutcome:
    deleted: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # key → error


class ObjectStore(Protocol):
    description: str
    stats: StoreStats
    remote: bool  # each request a network round trip (S3), not a local call

    def list_prefix(self, prefix: str) -> AsyncIterator[list[StoredObject]]:
        """Every object under ``prefix``, in pages of at most 1000."""
        ...

    async def list_children(self, prefix: str) -> tuple[list[str], list[StoredObject]]:
        """One level under ``prefix`` (a delimiter listing): the child prefixes (each ending
        in "/") and the objects directly there."""
        ...

    async def head(self, key: str) -> StoredObject | None: ...

    async def put(self, key: str, data: bytes) -> None: ...

    async def get(self, key: str) -> bytes | None: ...

    async def delete(self, keys: Sequence[str]) -> DeleteOutcome: ...


class ObstoreStore:
    def __init__(self, store: Any, description: str, *, remote: bool = False) -> None:
        self._store = store
        self.description = description
        self.remote = remote
        self.stats = StoreStats()

    async def list_children(self, prefix: str) -> tuple[list[str], list[StoredObject]]:
        try:
            found = await obstore.list_with_delimiter_async(self._store, prefix)
        except NOT_FOUND:
            self.stats.list_pages += 1
            return [], []
        except Exception as exc:
            raise StoreError(f"listing {prefix!r} failed: {describe_error(exc)}") from exc
        children = [p.rstrip("/") + "/" for p in found["common_prefixes"]]
        objects = [
            StoredObject(key=m["path"], size=int(m["size"]), last_modified=m["last_modified"])
            for m in found["objects"]
        ]
        # S3 answers a delimiter listing 1000 entries (prefixes and keys) per request
        self.stats.list_pages += max(1, -(-(len(children) + len(objects)) // LIST_PAGE_SIZE))
        return children, objects

    async def list_prefix(self, prefix: str) -> AsyncIterator[list[StoredObject]]:
        stream = obstore.list(self._store, prefix=prefix, chunk_size=LIST_PAGE_SIZE)
        pages = 0
        try:
            async for page in stream:
                pages += 1
                self.stats.list_pages += 1
                yield [
                    StoredObject(
                        key=m["path"], size=int(m["size"]), last_modified=m["last_modified"]
                    )
                    for m in page
                ]
        except NOT_FOUND:
            return  # a local prefix that was never created: nothing under it
        except Exception as exc:
            raise StoreError(f"listing {prefix!r} failed: {describe_error(exc)}") from exc
        finally:
            if pages == 0:
                self.stats.list_pages += 1  # an empty listing is still one request

    async def head(self, key: str) -> StoredObject | None:
        self.stats.heads += 1
        try:
            meta = await obstore.head_async(self._store, key)
        except NOT_FOUND:
            return None
        except Exception as exc:
            raise StoreError(f"head {key!r} failed: {describe_error(exc)}") from exc
        return StoredObject(
            key=meta["path"], size=int(meta["size"]), last_modified=meta["last_modified"]
        )

    async def put(self, key: str, data: bytes) -> None:
        self.stats.puts += 1
        try:
            await obstore.put_async(self._store, key, data)
        except Exception as exc:
            raise StoreError(f"put {key!r} failed: {describe_error(exc)}") from exc

    async def get(self, key: str) -> bytes | None:
        try:
            result = await obstore.get_async(self._store, key)
            return bytes(await result.bytes_async())
        except NOT_FOUND:
            return None
        except Exception as exc:
            raise StoreError(f"get {key!r} failed: {describe_error(exc)}") from exc

    async def delete(self, keys: Sequence[str]) -> DeleteOutcome:
        outcome = DeleteOutcome()
        for start in range(0, len(keys), MAX_KEYS_PER_DELETE):
            batch = list(keys[start : start + MAX_KEYS_PER_DELETE])
            self.stats.delete_requests += 1
            try:
                await obstore.delete_async(self._store, batch)
                outcome.deleted += len(batch)
            except Exception:
                # Which keys failed is not in the exception: ask each key on its own.
                await self._delete_one_by_one(batch, outcome)
        return outcome

    async def _delete_one_by_one(self, keys: list[str], outcome: DeleteOutcome) -> None:
        gate = asyncio.Semaphore(SINGLE_DELETE_CONCURRENCY)

        async def one(key: str) -> None:
            async with gate:
                self.stats.delete_requests += 1
                try:
                    await obstore.delete_async(self._store, key)
                except Exception as exc:
                    # Backends word "already gone" differently (the local store reports a
                    # generic error); the object's absence is what counts, so ask.
                    try:
                        gone = await self.head(key) is None
                    except StoreError:
                        gone = False
                    if not gone:
                        outcome.failed[key] = describe_error(exc)
                        return
                outcome.deleted += 1

        await asyncio.gather(*(one(k) for k in keys))


class ReadOnlyStore:
    """A dry run's view of a store: reads go through; writes and deletes are only recorded."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self.description = inner.description
        self.stats = inner.stats
        self.remote = inner.remote
        self.would_delete: list[str] = []
        self.would_put: list[str] = []

    def list_prefix(self, prefix: str) -> AsyncIterator[list[StoredObject]]:
        return self._inner.list_prefix(prefix)

    async def list_children(self, prefix: str) -> tuple[list[str], list[StoredObject]]:
        return await self._inner.list_children(prefix)

    async def head(self, key: str) -> StoredObject | None:
        return await self._inner.head(key)

    async def put(self, key: str, data: bytes) -> None:
        self.would_put.append(key)

    async def get(self, key: str) -> bytes | None:
        return await self._inner.get(key)

    async def delete(self, keys: Sequence[str]) -> DeleteOutcome:
        self.would_delete.extend(keys)
        return DeleteOutcome(deleted=len(keys))


@dataclass(kw_only=True, slots=True)
class PrefixDeletion:
    listed: int = 0
    deleted: int = 0
    bytes_deleted: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    left: int = 0  # objects still under the prefix when the run re-listed it


async def delete_prefix(
    store: ObjectStore,
    prefix: str,
    *,
    verify: bool = True,
    on_batch: Callable[[int, int], Awaitable[None]] | None = None,
    before_batch: Callable[[list[StoredObject]], Awaitable[None]] | None = None,
) -> PrefixDeletion:
    """Delete every object under ``prefix``, page by page, then re-list to count what is left.

    Deletes go out as each listing page arrives, so memory is bounded by one page. The final
    listing is what makes "left" honest: it counts whatever a failed key, a concurrent upload
    or a listing quirk left behind. ``on_batch(objects, bytes)`` hears each page's deletions as
    the store confirms them, so a caller can persist the count before the next page: a crash
    then loses at most the one page between the store's answer and the caller's write —
    unless ``before_batch(page)``, told each page before its delete goes out, persisted the
    page's keys: then a crash in between loses nothing (the caller asks the store which of them
    are gone).
    """
    if not prefix or not prefix.endswith("/"):
        raise ValueError(f"refusing to delete a prefix that is not a folder: {prefix!r}")
    result = PrefixDeletion()
    async for page in store.list_prefix(prefix):
        result.listed += len(page)
        sizes = {o.key: o.size for o in page}
        if before_batch is not None:
            await before_batch(page)
        outcome = await store.delete([o.key for o in page])
        deleted_bytes = sum(s for k, s in sizes.items() if k not in outcome.failed)
        result.deleted += outcome.deleted
        result.failed.update(outcome.failed)
        result.bytes_deleted += deleted_bytes
        if on_batch is not None and outcome.deleted:
            await on_batch(outcome.deleted, deleted_bytes)
    if verify and not isinstance(store, ReadOnlyStore):
        async for page in store.list_prefix(prefix):
            result.left += len(page)
    return result


def open_store(url: str, *, credentials: dict[str, str] | None = None) -> ObstoreStore:
    """Build the store named by STORAGE_URL."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return ObstoreStore(MemoryStore(), "memory://")
    if scheme == "file":
        path = Path(url.removeprefix("file://")).expanduser().resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"STORAGE_URL: cannot create {path}: {exc.strerror}") from exc
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            # found at start, not as an unexpected error at the first object written
            raise ConfigError(f"STORAGE_URL: {path} is not a directory this process can write")
        return ObstoreStore(LocalStore(path, automatic_cleanup=True, mkdir=True), f"file://{path}")
    if scheme == "s3":
        parts = urlsplit(url)
        bucket = parts.netloc
        if not bucket:
            raise ConfigError("STORAGE_URL: s3:// needs a bucket, e.g. s3://media?region=auto")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise ConfigError(
                f"STORAGE_URL: unknown s3 option(s) {sorted(unknown)}; expected endpoint and region"
            )
        config: dict[str, Any] = {k: v for k, v in (credentials or {}).items() if v}
        if "region" in query:
            config["region"] = query["region"]
        endpoint = query.get("endpoint")
        client_options: dict[str, Any] = {"timeout": "60s", "connect_timeout": "10s"}
        if endpoint:
            config["endpoint"] = endpoint
            config["virtual_hosted_style_request"] = False
            if endpoint.startswith("http://"):
                client_options["allow_http"] = True
        try:
            store = S3Store(bucket, client_options=cast("ClientConfig", client_options), **config)
        except Exception as exc:
            raise ConfigError(f"STORAGE_URL: {describe_error(exc)}") from exc
        where = f"s3://{bucket}" + (f" at {endpoint}" if endpoint else "")
        return ObstoreStore(store, where, remote=True)
    raise ConfigError(
        f"STORAGE_URL: unsupported scheme {scheme!r}; use file://, s3:// or memory://"
    )
