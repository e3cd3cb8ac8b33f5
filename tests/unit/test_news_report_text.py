"""`nightcrew news run`'s report for a person: words, not Python's values or unlabelled rules."""

from __future__ import annotations

import pytest

from nightcrew.cli.news import _print_run
from nightcrew.news.report import NewsReport


def test_the_report_says_no_instead_of_false_and_whose_reviews_it_counts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = NewsReport(
        shard="s1",
        trigger="manual",
        processed_count=5,
        ai_reviewed_count=5,
        redis_enabled=False,
        reviewer="offline rules",
    )
    _print_run(report.to_json())
    out = capsys.readouterr().out
    assert "False" not in out and "True" not in out
    assert "  Redis                            no (PostgreSQL leases)\n" in out
    assert "  reviewed (offline rules)         5\n" in out


def test_the_json_keeps_the_spec_field_and_says_who_reviewed() -> None:
    body = NewsReport(shard="s1", trigger="manual", reviewer="offline rules").to_json()
    assert body["aiReviewedCount"] == 0 and body["reviewer"] == "offline rules"
    assert NewsReport(shard="s1", trigger="manual").to_json()["reviewer"] == "model"


def test_dropped_items_are_listed_by_source_and_reason(capsys: pytest.CaptureFixture[str]) -> None:
    report = NewsReport(
        shard="s1",
        trigger="manual",
        dropped_items=[{"source": "longlinks", "reason": "link too long", "count": 2}],
    )
    _print_run(report.to_json())
    assert "  - longlinks: 2 dropped (link too long)\n" in capsys.readouterr().out
