"""The pipeline's messages: what a stage is told to work on, one record per kind.

A message only says "work on this now": PostgreSQL holds the candidate's stage and state, and
the source's fetch state (``outbox``). The fetch stage is told a source (``FetchSource``);
enrich, review and write are told a candidate (``WorkOn``). Their JSON is the outbox's
``body`` and what goes on the wire; a statement that owes many at once builds the same members
in SQL (``jsonb_build_object``), and jsonb orders them, whoever built them.

A stage reads its message with ``read``; a dead letter, which may hold anything, with ``named_by``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from nightcrew.jsonable import Jsonable, named


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchSource(Jsonable):
    """To the fetch stage: fetch this source (a pass sends it; a replayed letter, again)."""

    KEY: ClassVar[str] = "source_id"  # the member a stage cannot do without

    # whose source: for whoever reads the queue (the stage goes by the source's row)
    shard: str | None = None
    source_id: int = named("source_id")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkOn(Jsonable):
    """To enrich, review or write: work on this candidate (at the stage its row says)."""

    KEY: ClassVar[str] = "url"

    url: str
    shard: str | None = None  # as FetchSource's


M = TypeVar("M", FetchSource, WorkOn)


def read(kind: type[M], body: Mapping[str, Any]) -> M:
    """The message ``body`` carries, as ``kind``. A body without ``kind``'s key member is a
    KeyError naming the member: the message's failure for good, dead-lettered at once with
    that error."""
    if kind.KEY not in body:
        raise KeyError(kind.KEY)
    return kind.from_json(body)


def named_by(kind: type[M], body: Mapping[str, Any]) -> M | None:
    """``body`` as ``kind`` when it names one (a dead letter's body may name nothing)."""
    return kind.from_json(body) if kind.KEY in body else None
