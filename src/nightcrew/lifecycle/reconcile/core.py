"""Pure helpers of the reconciler: options, key derivation, size comparison. No I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nightcrew.errors import NightcrewError
from nightcrew.jsonable import Jsonable

Mode = Literal["dryrun", "apply"]
ObjectKind = Literal["audio", "episode_image", "podcast_image", "prep", "other"]

# minOrphanAgeHours is clamped to this range; the 24 h floor is a hard guard so that an
# in-flight upload's object is never swept before its finalize lands.
MIN_ORPHAN_AGE_HOURS = 24
MAX_ORPHAN_AGE_HOURS = 720
# Transcription-prep objects are re-derivable; older than this they go, no reference check.
PREP_TTL_DAYS = 7
# Keys quoted per category in a report, so an operator can judge before applying.
SAMPLE_KEYS = 20

# Query parameters of POST /reconcile, and their option names.
FLAG_NAMES = {
    "mode": "mode",
    "quarantineMissing": "quarantine_missing",
    "skipOrphanDelete": "skip_orphan_delete",
    "bypassCapForBackfill": "bypass_cap_for_backfill",
    "minOrphanAgeHours": "min_orphan_age_hours",
}


def clamp_orphan_age_hours(hours: int) -> int:
    return max(MIN_ORPHAN_AGE_HOURS, min(MAX_ORPHAN_AGE_HOURS, int(hours)))


class OptionError(NightcrewError, ValueError):
    """A reconcile flag is unknown or its value malformed; the message names the flag."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileOptions(Jsonable):
    mode: Mode = "dryrun"
    quarantine_missing: bool = False
    skip_orphan_delete: bool = False
    bypass_cap_for_backfill: bool = False
    min_orphan_age_hours: int = MIN_ORPHAN_AGE_HOURS

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "min_orphan_age_hours", clamp_orphan_age_hours(self.min_orphan_age_hours)
        )

    @property
    def apply(self) -> bool:
        return self.mode == "apply"


# The daily cron's safe subset: measured sizes, aged reference-checked orphans, outbox drain;
# never quarantine, never the cap bypass.
SCHEDULED_OPTIONS = ReconcileOptions(
    mode="apply",
    quarantine_missing=False,
    skip_orphan_delete=False,
    bypass_cap_for_backfill=False,
    min_orphan_age_hours=MIN_ORPHAN_AGE_HOURS,
)


def _flag_bool(name: str, raw: str) -> bool:
    # Exactly the values /openapi.json documents: an empty or fuzzy value on a flag that can
    # delete things is refused rather than guessed.
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0"):
        return False
    raise OptionError(f"{name}: expected true, false, 1 or 0, got {raw!r}")


def parse_flags(params: Mapping[str, str]) -> ReconcileOptions:
    """POST /reconcile's query parameters → options; anything unknown or malformed is refused.
    A flag that is absent keeps the option's default."""
    unknown = sorted(set(params) - set(FLAG_NAMES))
    if unknown:
        raise OptionError(f"unknown flag {unknown[0]!r}; known flags: {', '.join(FLAG_NAMES)}")
    values: dict[str, Any] = {}  # ReconcileOptions' keyword arguments, by field name
    if "mode" in params:
        if params["mode"] not in ("dryrun", "apply"):
            raise OptionError(f"mode: expected dryrun or apply, got {params['mode']!r}")
        values["mode"] = params["mode"]
    for flag in ("quarantineMissing", "skipOrphanDelete", "bypassCapForBackfill"):
        if flag in params:
            values[FLAG_NAMES[flag]] = _flag_bool(flag, params[flag])
    if "minOrphanAgeHours" in params:
        raw = params["minOrphanAgeHours"].strip()
        # an integer in ASCII digits, and few of them: int() also reads "٣٠" and "3_0", and
        # a 5,000-digit value is no age (any integer is clamped to 24-720, as documented)
        digits = raw[1:] if raw[:1] in ("-", "+") else raw
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 9):
            shown = raw if len(raw) <= 20 else raw[:20] + "…"
            raise OptionError(f"minOrphanAgeHours: expected whole hours, got {shown!r}")
        values["min_orphan_age_hours"] = int(raw)
    return ReconcileOptions(**values)


def size_needs_write(recorded: str | int | None, actual: int) -> bool:
    """Whether the recorded audio size must be rewritten with the measured one.

    BIGINT arrives as int from psycopg but as a string from other drivers (and from JSON);
    compare numbers, never a string with an int — that bug rewrote every audio-bearing episode
    every night (spec 000). NULL and 0 always need the measured size, unless it is 0 too.
    """
    if recorded is None:
        return True
    if isinstance(recorded, str):
        recorded = recorded.strip()
        if not recorded:
            return True
        recorded = int(recorded)
    return int(recorded) != int(actual)


def public_prefix(public_base: str) -> str:
    """``R2_PUBLIC_URL`` as the prefix an object's URL starts with."""
    return public_base.rstrip("/") + "/"


def classify_key(key: str) -> ObjectKind:
    """podcasts/{p}/images/… · podcasts/{p}/e/{e}/images/… · …/transcribe-prep/… · audio."""
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != "podcasts":
        return "other"
    if parts[2] == "images":
        return "podcast_image"
    if parts[2] != "e" or len(parts) < 5:
        return "other"
    if parts[4] == "images":
        return "episode_image"
    if parts[4] == "transcribe-prep":
        return "prep"
    return "audio"
