"""`nightcrew news run`'s report for a person: words, not Python's values or unlabelled rules —
one printer for either engine's report — and one frozen report whose JSON has spec 001's
field names whichever engine built it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from nightcrew.cli.news import _print_report
from nightcrew.narrate import news_sentences
from nightcrew.news.report import SPEC_FIELDS, NewsReport, PassFigures, RunTally

SPEC_001 = {
    "queuedCount",
    "queuedBySource",
    "deferredCount",
    "deferredReasons",
    "retriedCount",
    "processedCount",
    "aiReviewedCount",
    "acceptedCount",
    "rejectedCount",
    "backpressureQueueLimit",
    "backpressureDbArticleLimit",
    "backpressureDbArticleCount",
    "backpressureDbArticleCountError",
    "lockedCount",
    "redisAiReviewLockSkippedCount",
    "redisEnabled",
    "translatedCount",
    "reviewer",
    "fetchErrors",
    "writeErrors",
    "droppedItems",
}


def _pass_figures() -> PassFigures:
    return PassFigures(
        enqueued_sources=3,
        released_count=2,
        resent_count=1,
        relayed_count=0,
        stages={"enrich": {}, "review": {"held": 2}, "write": {"queued": 1}},
        results_since=datetime(2026, 12, 1, tzinfo=UTC),
        review_retry_count=1,
    )


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
    _print_report(report.to_json())
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
    _print_report(report.to_json())
    assert "  - longlinks: 2 dropped (link too long)\n" in capsys.readouterr().out


def test_one_frozen_report_with_the_spec_fields_whichever_engine_built_it() -> None:
    inline = NewsReport(shard="s", trigger="manual")
    piped = NewsReport(shard="s", trigger="manual", processed_count=4, pipeline=_pass_figures())
    with pytest.raises(dataclasses.FrozenInstanceError):
        inline.processed_count = 1  # type: ignore[misc]
    assert SPEC_001 <= set(SPEC_FIELDS)
    assert set(SPEC_FIELDS) <= set(inline.to_json()) and set(SPEC_FIELDS) <= set(piped.to_json())
    assert inline.to_json()["pipeline"] == "inline" and "enqueuedSources" not in inline.to_json()
    body = piped.to_json()
    assert body["pipeline"] == "rabbitmq" and body["writtenCount"] == body["processedCount"] == 4
    assert body["resultsSince"] == "2026-12-01T00:00:00+00:00" and body["reviewRetryCount"] == 1


def test_the_inline_tally_fills_every_field_of_the_report() -> None:
    """Every field the run gathers reaches the frozen report (a new field the tally forgot to
    hand on would stay at its default here)."""
    tally = RunTally(
        shard="s",
        trigger="scheduled",
        reviewer="offline rules",
        redis_enabled=True,
        backpressure_queue_limit=7,
        backpressure_db_article_limit=8,
    )
    for f in dataclasses.fields(tally):
        value = getattr(tally, f.name)
        if isinstance(value, bool) or f.name in {"shard", "trigger", "reviewer"}:
            continue
        if isinstance(value, int) or value is None:
            setattr(tally, f.name, 3)
        elif isinstance(value, list):
            value.append({"x": 1})
        elif isinstance(value, dict):
            value["a (s)"] = 3
    report = tally.report(status="superseded", duration_ms=1.5, redis_enabled=True)
    body = report.to_json()
    assert body["status"] == "superseded" and body["redisEnabled"] is True
    for name in SPEC_001 - {"reviewer", "redisEnabled", "backpressureDbArticleCountError"}:
        assert body[name] not in (0, [], {}, None), name
    assert (
        tally.report(status="completed", duration_ms=0, redis_enabled=False).redis_enabled is False
    )


def test_either_engines_report_prints_with_one_printer(capsys: pytest.CaptureFixture[str]) -> None:
    piped = NewsReport(
        shard="s",
        trigger="manual",
        processed_count=4,
        fetch_errors=[{"source": "dead", "error": "the feed answered 404"}],
        write_errors=[{"url": "https://x.example/a", "error": "value too long"}],
        pipeline=_pass_figures(),
    )
    _print_report(piped.to_json())
    out = capsys.readouterr().out
    assert out.startswith("news shard s: pass done, 0 ms\n")
    assert "  processed (written)              4\n" in out
    assert "  sources enqueued                 3\n" in out
    assert "  stage review                     2 held\n" in out
    assert "  ! dead: the feed answered 404\n" in out
    assert "  ! https://x.example/a: value too long\n" in out


def test_a_superseded_run_says_so_and_is_not_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    report = NewsReport(shard="s", trigger="manual", status="superseded")
    _print_report(report.to_json())
    assert "news shard s: superseded (a newer holder of the shard's lease wrote first)" in (
        capsys.readouterr().out
    )
    assert news_sentences(report.to_json())[0].startswith("superseded: a newer holder")
    assert not report.skipped and report.to_json()["skipped"] is False
