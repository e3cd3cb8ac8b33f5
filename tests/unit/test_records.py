"""Rows become records at one seam (``db/records.py``): by the record's field names, extra
columns left out, a missing one a TypeError that names the record, the field and the row."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from nightcrew.db.records import as_record, as_records


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    id: int
    at: datetime
    note: str | None = None


AT = datetime(2026, 12, 4, tzinfo=UTC)


def test_a_row_becomes_its_record_and_columns_it_does_not_name_are_left_out() -> None:
    row = {"id": 7, "at": AT, "note": "x", "added_by_a_later_migration": True}
    assert as_record(Sample, row) == Sample(id=7, at=AT, note="x")
    assert as_records(Sample, [{"id": 1, "at": AT}]) == [Sample(id=1, at=AT)]  # default kept


def test_a_query_and_a_record_that_disagree_fail_at_once_naming_both() -> None:
    with pytest.raises(TypeError) as raised:
        as_record(Sample, {"id": 7, "when": AT})
    assert str(raised.value) == "Sample.at: the query returns no column 'at' (it returns id, when)"
