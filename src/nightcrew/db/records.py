"""Rows as records: the one seam where a query's answer stops being a dict.

A record is a frozen, keyword-only dataclass of the columns a query returns, defined in the
module that owns the query (so the SQL and its shape sit together). ``as_record`` builds one
from a row by the record's field names: a column the record does not name is left out (a
``SELECT *`` of a table that grew a column still reads), and a field without a default that the
row lacks is a ``TypeError`` naming both — a query and its record that disagree fail at once,
not with a ``KeyError`` somewhere downstream.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import pq
from psycopg.rows import BaseRowFactory, RowMaker, no_result

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from psycopg._cursor_base import BaseCursor  # what psycopg.rows types a factory with

# a record is a dataclass: mypy refuses ``fetch_as(UUID, …)``, which wants ``fetch_values``
R = TypeVar("R", bound="DataclassInstance")


# the statuses of a result that has rows to read (what ``cursor.description`` answers a
# column list for, but for a result of no columns and no such status, which no query of ours is)
_ANSWERED_ROWS = frozenset(
    {pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE, pq.ExecStatus.TUPLES_CHUNK}
)

_COLUMNS: dict[type[Any], tuple[tuple[str, bool], ...]] = {}


def _columns(record: type[Any]) -> tuple[tuple[str, bool], ...]:
    """(name, required) of each field a row fills (dataclasses.fields, read once a record)."""
    known = _COLUMNS.get(record)
    if known is not None:
        return known
    known = _COLUMNS[record] = tuple(
        (
            f.name,
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(record)
        if f.init
    )
    return known


def _missing(record: type[Any], name: str, columns: Iterable[str]) -> TypeError:
    return TypeError(
        f"{record.__name__}.{name}: the query returns no column {name!r} "
        f"(it returns {', '.join(columns)})"
    )


def as_record(record: type[R], row: Mapping[str, Any]) -> R:
    """A dict row (a streamed one, or one read for two records) as ``record``: the same plan,
    by the row's keys, as ``record_row`` makes by a result's columns."""
    return record(**{name: row[name] for name, _ in _plan(record, tuple(row))})


def as_records(record: type[R], rows: Iterable[Mapping[str, Any]]) -> list[R]:
    """Dict rows of one result (the same keys, so one plan for all) as ``record``s."""
    made: list[R] = []
    plan: tuple[tuple[str, int], ...] | None = None
    for row in rows:
        if plan is None:
            plan = _plan(record, tuple(row))
        made.append(record(**{name: row[name] for name, _ in plan}))
    return made


@functools.lru_cache(maxsize=4096)
def _plan(record: type[Any], columns: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """(field, column index) of each field a result with ``columns`` fills: worked out once a
    record and a query's columns, not per row. Of two columns of one name the last counts, as
    in a dict row."""
    index = {name: i for i, name in enumerate(columns)}
    plan = []
    for name, required in _columns(record):
        if name in index:
            plan.append((name, index[name]))
        elif required:
            raise _missing(record, name, columns)
    return tuple(plan)


def record_row(record: type[R]) -> BaseRowFactory[R]:
    """A psycopg row factory: each row straight into ``record``, by the result's column names
    (``as_record``'s rules: a column the record does not name is left out, a missing required
    field a ``TypeError``), without a dict row in between."""

    def factory(cursor: BaseCursor[Any, Any]) -> RowMaker[R]:
        columns = column_names(cursor)
        if columns is None:
            return no_result
        plan = _plan(record, columns)

        def make(values: Sequence[Any]) -> R:
            return record(**{name: values[i] for name, i in plan})

        return make

    return factory


def column_names(cursor: BaseCursor[Any, Any]) -> tuple[str, ...] | None:
    """The names of the columns of the cursor's answer; None for a statement that answers no
    rows. Read off the result itself: ``cursor.description`` builds a ``Column`` a column each
    time it is read (a few microseconds each, on every query)."""
    result = cursor.pgresult
    if result is None or not answers_rows(cursor):
        return None
    encoding = cursor.connection.info.encoding
    return tuple((result.fname(i) or b"").decode(encoding) for i in range(result.nfields))


def answers_rows(cursor: BaseCursor[Any, Any]) -> bool:
    """Whether the cursor's statement answered rows to fetch (``cursor.description`` is not
    None), without building its columns."""
    result = cursor.pgresult
    return result is not None and result.status in _ANSWERED_ROWS
