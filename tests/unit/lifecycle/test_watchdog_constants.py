"""The spec's tunables, by name and value: a change here is a change to spec 000."""

from __future__ import annotations

from nightcrew.lifecycle import watchdogs as wd


def test_stalled_import_constants() -> None:
    assert wd.ATTEMPTS_THRESHOLDS_SECONDS == {1: 67, 2: 85, 3: 160, 4: 410}
    assert wd.STALLED_IMPORT_THRESHOLD_MINUTES == 10
    assert wd.STALLED_IMPORT_LEGACY_FALLBACK_MINUTES == 25
    assert wd.STALLED_IMPORT_RESEND_COOLDOWN_SECONDS == 60
    assert wd.STALLED_PROCESSING_THRESHOLD_MINUTES == 10
    assert wd.STALLED_IMPORT_MAX_RESEND == 500


def test_link_preview_and_media_constants() -> None:
    assert wd.STALLED_LINK_GRACE_SECONDS == 90
    assert wd.STALLED_LINK_RESEND_COOLDOWN_SECONDS == 90
    assert wd.STALLED_LINK_MAX_RESEND == 500
    assert wd.STUCK_HOSTING_MIGRATION_PREVIEW_MINUTES == 15
    assert wd.STUCK_HOSTING_MIGRATION_PREVIEW_MAX == 50
    assert wd.WEDGED_MEDIA_JOB_HOURS == 3
