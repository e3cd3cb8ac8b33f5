"""`nightcrew news run`'s report for a person: words, not Python's values or unlabelled rules —
one printer for either engine's report — and one frozen report whose JSON has spec 001's
field names whichever engine built it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from nightcrew.cli.news import _print_report
from nightcrew.narrate import news_sentences
from nightcrew.news.report import (
    SPEC_FIELDS,
    WORK_FIELDS,
    DroppedItems,
    FetchFailure,
    NewsReport,
    PassFigures,
    ReportDraft,
    WorkerResults,
    WriteFailure,
)

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
        unfetched_sources=0,
        admitted_count=2,
        resent_count=1,
        relayed_count=0,
        stages={"enrich": {}, "review": {"held": 2}, "write": {"queued": 1}},
        workers=WorkerResults(
            since=datetime(2026, 12, 1, tzinfo=UTC),
            processed_count=4,
            review_retry_count=1,
            write_errors=[WriteFailure(url="https://x.example/a", error="value too long")],
        ),
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
        dropped_items=[DroppedItems(source="longlinks", reason="link too long", count=2)],
    )
    _print_report(report.to_json())
    assert "  - longlinks: 2 dropped (link too long)\n" in capsys.readouterr().out


def test_one_frozen_report_with_the_spec_fields_whichever_engine_built_it() -> None:
    inline = NewsReport(shard="s", trigger="manual")
    piped = NewsReport(shard="s", trigger="manual", pipeline=_pass_figures())
    with pytest.raises(dataclasses.FrozenInstanceError):
        inline.processed_count = 1  # type: ignore[misc]
    assert SPEC_001 <= set(SPEC_FIELDS)
    assert set(SPEC_FIELDS) <= set(inline.to_json()) and set(SPEC_FIELDS) <= set(piped.to_json())
    assert inline.to_json()["pipeline"] == "inline" and "enqueuedSources" not in inline.to_json()
    body = piped.to_json()
    assert body["pipeline"] == "rabbitmq" and body["processedCount"] == 0
    assert body["admittedCount"] == 2 and body["unfetchedSources"] == 0
    # the workers' results are theirs, under their own key
    assert body["workers"]["since"] == "2026-12-01T00:00:00+00:00"
    assert body["workers"]["processedCount"] == 4 and body["workers"]["reviewRetryCount"] == 1


class _Settings:
    ingestion_backpressure_queue_limit = 7
    ingestion_backpressure_db_article_limit = 8


class _Adapters:
    redis_configured = True
    reviewer = None


def test_the_one_builder_sets_adds_and_defers_and_freezes_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both engines fill a report through ``ReportDraft``: what it is told reaches the frozen
    report, counts add up, a reason is said once, and Redis is on only if configured and never
    failed."""
    monkeypatch.setattr("nightcrew.news.report.reviewer_label", lambda adapters: "offline rules")
    draft = ReportDraft(_Settings(), _Adapters(), shard="s", trigger="scheduled")  # type: ignore[arg-type]
    draft.set(queued_count=3, queued_by_source={"a (s)": 3})
    draft.add(processed_count=2)
    draft.add(processed_count=1, ai_reviewed_count=3)
    draft.defer("a reason")
    draft.defer("a reason")
    draft.extend(fetch_errors=[FetchFailure(source="x", error="e")])
    report = draft.build(status="superseded", duration_ms=1.5, redis_enabled=True)
    body = report.to_json()
    assert body["status"] == "superseded" and body["redisEnabled"] is True
    assert body["queuedCount"] == 3 and body["processedCount"] == 3
    assert body["aiReviewedCount"] == 3 and body["deferredReasons"] == ["a reason"]
    assert body["fetchErrors"] == [{"source": "x", "error": "e"}]
    assert body["backpressureQueueLimit"] == 7 and body["backpressureDbArticleLimit"] == 8
    assert body["reviewer"] == "offline rules" and body["durationMs"] == 1.5
    assert (
        draft.build(status="completed", duration_ms=0, redis_enabled=False).redis_enabled is False
    )


def test_either_engines_report_prints_with_one_printer(capsys: pytest.CaptureFixture[str]) -> None:
    piped = NewsReport(
        shard="s",
        trigger="manual",
        fetch_errors=[FetchFailure(source="dead", error="the feed answered 404")],
        pipeline=_pass_figures(),
    )
    _print_report(piped.to_json())
    out = capsys.readouterr().out
    assert out.startswith("news shard s: pass done, 0 ms\n")
    assert "  processed (written)              0\n" in out
    assert "  sources enqueued                 3\n" in out
    assert "  admitted into the stages         2\n" in out
    assert "  stage review                     2 held\n" in out
    assert "  ! dead: the feed answered 404\n" in out
    assert "  the workers, since 2026-12-01T00:00:00+00:00:\n" in out
    assert "    written                        4\n" in out
    assert "    ! https://x.example/a: value too long\n" in out


def test_a_superseded_run_says_so_and_is_not_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    report = NewsReport(shard="s", trigger="manual", status="superseded")
    _print_report(report.to_json())
    assert "news shard s: superseded (a newer holder of the shard's lease wrote first)" in (
        capsys.readouterr().out
    )
    assert news_sentences(report.to_json())[0].startswith("superseded: a newer holder")
    assert not report.skipped and report.to_json()["skipped"] is False


def test_a_pass_is_told_with_its_workers_results_as_theirs() -> None:
    """The run history's sentences for a pipeline pass: what its workers wrote since the last
    report, named as theirs, and what the pass admitted."""
    body = NewsReport(shard="s", trigger="scheduled", pipeline=_pass_figures()).to_json()
    lines = news_sentences(body)
    assert lines[0] == (
        "0 story(ies) waiting, 4 written by the workers since the last report, 0 accepted,"
        " 0 rejected."
    )
    assert "2 admitted into the stages by this pass." in lines


def test_the_workers_results_carry_every_field_a_pass_leaves_to_them() -> None:
    """What an inline run counts of its expensive steps, a pass's workers count by the same
    names: each of WORK_FIELDS is a spec field, and one of the workers' results."""
    workers = WorkerResults(since=None).to_json()
    assert set(WORK_FIELDS) <= set(SPEC_FIELDS) and set(WORK_FIELDS) <= set(workers)


def test_a_model_report_shows_its_tokens_and_the_offline_rules_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = NewsReport(shard="s1", trigger="manual", ai_prompt_tokens=1200, ai_completion_tokens=90)
    _print_report(model.to_json())
    assert "  model tokens (prompt/completion) 1200 / 90\n" in capsys.readouterr().out
    offline = NewsReport(shard="s1", trigger="manual", reviewer="offline rules")
    _print_report(offline.to_json())
    assert "model tokens" not in capsys.readouterr().out
    piped = NewsReport(shard="s", trigger="manual", pipeline=_pass_figures())
    body = piped.to_json()
    body["workers"] |= {"aiPromptTokens": 700, "aiCompletionTokens": 40}
    _print_report(body)
    assert "    model tokens (prompt/completion) 700 / 40\n" in capsys.readouterr().out
