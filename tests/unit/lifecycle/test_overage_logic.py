from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nightcrew.lifecycle.overage import sanction_set, stage_due
from nightcrew.lifecycle.overage_mail import Overage, render
from nightcrew.lifecycle.overage_owed import idempotency_key

D = timedelta(days=1)


@pytest.mark.parametrize(
    ("elapsed", "stage"),
    [
        (timedelta(0), 0),
        (7 * D - timedelta(seconds=1), 0),
        (7 * D, 1),
        (20 * D, 1),
        (21 * D, 2),
        (26 * D, 2),
        (27 * D, 3),
        (30 * D, 3),
        (400 * D, 3),
    ],
)
def test_stage_due(elapsed: timedelta, stage: int) -> None:
    assert stage_due(elapsed) == stage


def test_idempotency_key_is_scoped_by_since_in_epoch_milliseconds() -> None:
    since = datetime(2026, 11, 29, 4, 0, 0, 123000, tzinfo=UTC)
    assert idempotency_key("a1", since, 2) == "overage:a1:1795924800123:2"
    assert idempotency_key("a1", since, "restored").endswith(":restored")
    assert idempotency_key("a1", since + timedelta(hours=1), 0) != idempotency_key("a1", since, 0)


PODS = [{"id": f"p{n}"} for n in range(5)]  # oldest first


@pytest.mark.parametrize(
    ("storage", "count", "cap", "expected"),
    [
        (True, False, 10, ["p0", "p1", "p2", "p3", "p4"]),  # bytes: every occupying feed
        (True, True, 2, ["p0", "p1", "p2", "p3", "p4"]),
        (False, True, 2, ["p2", "p3", "p4"]),  # count only: the newest excess
        (False, True, 0, ["p0", "p1", "p2", "p3", "p4"]),
        (False, False, 2, []),
    ],
)
def test_sanction_set(storage: bool, count: bool, cap: int, expected: list[str]) -> None:
    chosen = sanction_set(PODS, over_storage=storage, over_count=count, podcast_cap=cap)
    assert [p["id"] for p in chosen] == expected


def test_emails_say_what_is_over_by_how_much_and_what_to_do() -> None:
    overage = Overage(
        podcasts=3,
        podcast_cap=1,
        bytes=int(2.5e9),
        storage_cap_gb=2,
        deadline=datetime(2026, 12, 29, tzinfo=UTC),
        app_url="https://app.x/",
    )
    subject, text, html = render(0, overage, [])
    assert "30 days" in subject
    assert "3 podcasts on a plan that includes 1 (2 over)" in text
    assert "2.50 GB of audio stored on a plan that includes 2 GB (0.50 GB over)" in text
    assert "29 December 2026" in text and "https://app.x/settings/billing" in text
    assert "<ul><li>3 podcasts" in html and html.count("<ul>") == html.count("</ul>")
    subject, text, _ = render(4, overage, ["Night Owls"])
    assert "paused" in subject and "• Night Owls" in text and "Nothing has been deleted" in text
    assert "back within" in render("restored", overage, [])[0]
