"""The derived JSON of records: camelCase names, overrides, nesting, and the way back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from nightcrew.jsonable import Jsonable, camel, from_json, named, omitted, to_json


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    episode_id: str
    measured: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    duration_ms: float
    sample: tuple[Sample, ...] = ()
    first: Sample | None = None
    orphans_deleted: int = named("orphansDeletedCount", default=0)
    scratch: str = omitted(default="")
    at: datetime | None = None
    counts: dict[str, int] = field(default_factory=dict)


def test_fields_are_camel_case_nested_records_convert_and_values_pass_through() -> None:
    at = datetime(2026, 12, 4, tzinfo=UTC)
    report = Report(
        duration_ms=1.5,
        sample=(Sample(episode_id="e1", measured=3),),
        first=Sample(episode_id="e0"),
        orphans_deleted=2,
        scratch="not in the document",
        at=at,
        counts={"a_b": 1},
    )
    assert to_json(report) == {
        "durationMs": 1.5,
        "sample": [{"episodeId": "e1", "measured": 3}],
        "first": {"episodeId": "e0", "measured": None},
        "orphansDeletedCount": 2,
        "at": at,
        "counts": {"a_b": 1},  # a mapping's own keys are data, not field names
    }


def test_from_json_reads_back_what_to_json_wrote_ignoring_unknown_members() -> None:
    report = Report(duration_ms=2.0, sample=(Sample(episode_id="e1"),), orphans_deleted=4)
    document = {**to_json(report), "addedByANewerBuild": True}
    assert from_json(Report, document) == report


def test_a_missing_member_without_a_default_names_the_record_and_the_member() -> None:
    with pytest.raises(TypeError, match=r"Report: the document has no member 'durationMs'"):
        from_json(Report, {"sample": []})


@pytest.mark.parametrize(
    ("snake_name", "camel_name"),
    [("duration_ms", "durationMs"), ("objects_per_second", "objectsPerSecond"), ("n", "n")],
)
def test_a_field_name_is_written_in_camel_case(snake_name: str, camel_name: str) -> None:
    assert camel(snake_name) == camel_name


@dataclass(frozen=True, kw_only=True, slots=True)
class Counted(Jsonable):
    objects_per_second: int
    kinds: tuple[Sample, ...] = ()


def test_the_mixin_derives_both_methods_on_a_slotted_record() -> None:
    counted = Counted(objects_per_second=7, kinds=(Sample(episode_id="e"),))
    assert counted.to_json() == {
        "objectsPerSecond": 7,
        "kinds": [{"episodeId": "e", "measured": None}],
    }
    assert Counted.from_json(counted.to_json()) == counted
