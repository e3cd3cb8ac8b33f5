"""Records as JSON, derived from their fields: one ``to_json`` and one ``from_json`` for all.

A record is a dataclass. Its JSON object has one member per field, named in camelCase
(``duration_ms`` → ``durationMs``), the spelling the specs' reports and events use; a field
that must be spelled otherwise says so with ``named("…")``, and one that is not part of the
document with ``omitted()``. Values convert on the way out as JSON needs: a record becomes its
object, a tuple or list a list, a mapping an object of converted values; anything else (str,
int, float, bool, None, datetime) passes through, so ``json.dumps``' ``default`` decides how a
datetime is written, as it did before.

``from_json`` reads such an object back into its record: by the same names, nested records
and tuples of records by the field's annotation, a member it does not know ignored (a report
stored by a newer build still reads) and a missing one left to the field's default — or a
``TypeError`` naming the record and the member when the field has none.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Self, TypeVar

R = TypeVar("R")

# A JSON object as Python holds it: what ``to_json`` returns and ``from_json`` reads. Only for
# documents (reports, message bodies, stored payloads), never for a database row — a row is a
# record (``db/records.py``).
JsonObject = dict[str, Any]

_NAME = "json_name"
_OMIT = "json_omit"


def named(name: str, **kwargs: Any) -> Any:
    """A field spelled ``name`` in JSON (kwargs as ``dataclasses.field``'s)."""
    return dataclasses.field(metadata={_NAME: name}, **kwargs)


def omitted(**kwargs: Any) -> Any:
    """A field that is not part of the record's JSON (kwargs as ``dataclasses.field``'s)."""
    return dataclasses.field(metadata={_OMIT: True}, **kwargs)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


_FIELDS: dict[type[Any], tuple[tuple[str, str, bool], ...]] = {}


def _fields(record: type[Any]) -> tuple[tuple[str, str, bool], ...]:
    """(field name, JSON name, required) of each field in the document, read once a record
    type (required: it has no default)."""
    known = _FIELDS.get(record)
    if known is None:
        known = _FIELDS[record] = tuple(
            (
                f.name,
                f.metadata.get(_NAME) or camel(f.name),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(record)
            if not f.metadata.get(_OMIT)
        )
    return known


def to_json(value: Any) -> Any:
    """``value`` as JSON-ready data: records as objects (camelCase), sequences as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {key: to_json(getattr(value, name)) for name, key, _ in _fields(type(value))}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(record: type[Any]) -> dict[str, Any]:
    known = _HINTS.get(record)
    if known is None:
        known = _HINTS[record] = typing.get_type_hints(record)
    return known


def _record_type(hint: Any) -> type[Any] | None:
    """The record class ``hint`` names, itself or as ``X | None``."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for arm in typing.get_args(hint):
            if arm is not type(None):
                return _record_type(arm)
    return None


def _read(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    record = _record_type(hint)
    if record is not None:
        return from_json(record, value)
    origin = typing.get_origin(hint)
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return tuple(_read(item, v) for v in value)
    if origin is list and isinstance(value, list):
        args = typing.get_args(hint)
        return [_read(args[0] if args else Any, v) for v in value]
    return value


class Jsonable:
    """A record's ``to_json``/``from_json`` methods, derived (a mixin for frozen dataclasses,
    slotted or not)."""

    __slots__ = ()

    def to_json(self) -> JsonObject:
        document: JsonObject = to_json(self)
        return document

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return from_json(cls, data)


def from_json(record: type[R], data: Mapping[str, Any]) -> R:
    """The record ``data`` (an object ``to_json`` wrote) describes."""
    hints = _hints(record)
    values: dict[str, Any] = {}
    for name, key, required in _fields(record):
        if key in data:
            values[name] = _read(hints[name], data[key])
        elif required:
            raise TypeError(f"{record.__name__}: the document has no member {key!r}")
    return record(**values)
