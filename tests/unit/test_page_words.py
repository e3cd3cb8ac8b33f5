"""What the pages and the demo say of a report: counts in words, a repeated failure once with
how many times, a lane's jobs in the lane's order."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from nightcrew.lifecycle.lanes import DAILY, MINUTE, Lane
from nightcrew.narrate import grouped, lane_sentences
from nightcrew.web.pages.base import count_label
from nightcrew.web.pages.runs import RunDetail


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("items_requeued", "items requeued"),
        ("acceptedCount", "accepted"),
        ("rejectedCount", "rejected"),
        ("backpressureDbArticleCount", "articles in the database"),
        ("podcasts_deleted", "podcasts deleted"),
        ("count", "count"),
    ],
)
def test_a_count_is_labelled_in_words(key: str, words: str) -> None:
    assert count_label(key) == words


def test_a_repeated_failure_is_said_once_with_how_many_times() -> None:
    assert grouped(["a: x", "b: y", "a: x", "a: x"]) == ["a: x (3 times)", "b: y"]
    report = {"errors": [{"event": "effect_failed", "error": "HTTP 500"}] * 5}
    assert lane_sentences("minute", report)[-1] == "failed — effect_failed: HTTP 500 (5 times)"


@pytest.mark.parametrize("lane", [MINUTE, DAILY])
def test_a_runs_jobs_are_listed_in_the_lanes_order(lane: Lane) -> None:
    names = [job.name for job in lane.jobs]
    stored = {name: {"status": "ok", "durationMs": 1.0} for name in sorted(names)}
    now = datetime(2026, 12, 4, tzinfo=UTC)
    run = RunDetail(
        id=1,
        lane=lane.name,
        trigger="manual",
        slot=None,
        started_at=now,
        finished_at=now,
        heartbeat_at=now,
        status="completed",
        attempts=1,
        raw={"jobs": stored},
    )
    assert [job.name for job in run.jobs] == names
