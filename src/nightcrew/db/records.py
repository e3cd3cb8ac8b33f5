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
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# a record is a dataclass: mypy refuses ``fetch_as(UUID, …)``, which wants ``fetch_values``
R = TypeVar("R", bound="DataclassInstance")


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


def as_record(record: type[R], row: Mapping[str, Any]) -> R:
    values: dict[str, Any] = {}
    for name, required in _columns(record):
        if name in row:
            values[name] = row[name]
        elif required:
            raise TypeError(
                f"{record.__name__}.{name}: the query returns no column {name!r} "
                f"(it returns {', '.join(row)})"
            )
    return record(**values)


def as_records(record: type[R], rows: Iterable[Mapping[str, Any]]) -> list[R]:
    return [as_record(record, row) for row in rows]
