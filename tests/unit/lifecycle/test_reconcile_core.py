from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nightcrew.lifecycle.reconcile.core import (
    SCHEDULED_OPTIONS,
    OptionError,
    ReconcileOptions,
    clamp_orphan_age_hours,
    classify_key,
    parse_flags,
    public_prefix,
    size_needs_write,
)


@pytest.mark.parametrize(
    ("recorded", "actual", "expected"),
    [
        (None, 100, True),
        (0, 100, True),
        ("0", 100, True),
        ("", 100, True),
        (100, 100, False),
        ("100", 100, False),  # BIGINT as a string: equal, so no write (the spec's bug)
        (" 100 ", 100, False),
        ("99", 100, True),
        (101, 100, True),
        (0, 0, False),
        ("9007199254740993", 9007199254740993, False),  # beyond float precision
    ],
)
def test_size_needs_write_coerces(recorded: str | int | None, actual: int, expected: bool) -> None:
    assert size_needs_write(recorded, actual) is expected


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_equal_sizes_never_need_a_write_however_they_arrive(n: int) -> None:
    assert not size_needs_write(n, n) and not size_needs_write(str(n), n)


# Keys themselves are derived by SQL's nightcrew.object_key (tests/integration/lifecycle/
# test_object_keys.py); the prefix it is given must end in exactly one '/', or
# https://media.example.evil/… would count as ours.
@pytest.mark.parametrize(
    "base", ["https://media.example", "https://media.example/", "https://media.example//"]
)
def test_public_prefix_ends_in_exactly_one_slash(base: str) -> None:
    assert public_prefix(base) == "https://media.example/"


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("podcasts/p/e/e1/audio.mp3", "audio"),
        ("podcasts/p/e/e1/sub/master.flac", "audio"),
        ("podcasts/p/e/e1/images/cover.jpg", "episode_image"),
        ("podcasts/p/e/e1/transcribe-prep/chunk-1.wav", "prep"),
        ("podcasts/p/images/cover.jpg", "podcast_image"),
        ("podcasts/p/feed.xml", "other"),
        ("exports/x.csv", "other"),
    ],
)
def test_classify_key(key: str, kind: str) -> None:
    assert classify_key(key) == kind


@pytest.mark.parametrize(
    ("hours", "clamped"), [(1, 24), (24, 24), (100, 100), (720, 720), (10_000, 720), (-5, 24)]
)
def test_orphan_age_is_clamped(hours: int, clamped: int) -> None:
    assert clamp_orphan_age_hours(hours) == clamped
    assert ReconcileOptions(min_orphan_age_hours=hours).min_orphan_age_hours == clamped


def test_parse_flags() -> None:
    options = parse_flags(
        {
            "mode": "apply",
            "quarantineMissing": "true",
            "skipOrphanDelete": "0",
            "minOrphanAgeHours": "1",
        }
    )
    assert options == ReconcileOptions(
        mode="apply", quarantine_missing=True, min_orphan_age_hours=24
    )
    assert parse_flags({}) == ReconcileOptions()  # dry run by default
    assert not parse_flags({}).apply


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"dryRun": "1"}, "unknown flag 'dryRun'"),
        ({"minOrphanAgeHours": "abc"}, "minOrphanAgeHours"),
        ({"mode": "yolo"}, "mode"),
        ({"quarantineMissing": "maybe"}, "quarantineMissing"),
        ({"skipOrphanDelete": ""}, "skipOrphanDelete"),
        ({"bypassCapForBackfill": "yes"}, "bypassCapForBackfill"),
    ],
)
def test_bad_flags_name_themselves(params: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_flags(params)


@pytest.mark.parametrize("raw", ["٣٠", "3_0", "--30", "30.0", "1e3", "", "9" * 5000])
def test_the_orphan_age_is_ascii_digits_and_a_bad_one_is_echoed_short(raw: str) -> None:
    with pytest.raises(OptionError, match="minOrphanAgeHours: expected whole hours") as refused:
        parse_flags({"minOrphanAgeHours": raw})
    assert len(str(refused.value)) < 80


def test_the_scheduled_subset_never_quarantines_or_bypasses() -> None:
    assert SCHEDULED_OPTIONS.apply and SCHEDULED_OPTIONS.min_orphan_age_hours == 24
    assert not SCHEDULED_OPTIONS.quarantine_missing
    assert not SCHEDULED_OPTIONS.bypass_cap_for_backfill
    assert not SCHEDULED_OPTIONS.skip_orphan_delete
