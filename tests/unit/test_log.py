from __future__ import annotations

import json

import pytest
import structlog

from nightcrew.log import REDACTED, SecretScrubber, configure_logging, describe_error, event


def test_secret_named_fields_are_masked_and_secret_values_scrubbed() -> None:
    scrub = SecretScrubber(["sk_live_abcdef"])
    out = scrub(
        None,
        "info",
        {
            "event": "x",
            "authorization": "Bearer whatever",
            "api_key": "k",
            "error": "POST failed with key sk_live_abcdef in it",
            "nested": {"detail": ["sk_live_abcdef"]},
            "url": "postgresql://app:hunter2@db.internal:5432/prod",
            "count": 3,
        },
    )
    assert out["authorization"] == REDACTED and out["api_key"] == REDACTED
    assert "sk_live" not in out["error"] and REDACTED in out["error"]
    assert out["nested"] == {"detail": [REDACTED]}
    assert out["url"] == f"postgresql://app:{REDACTED}@db.internal:5432/prod"
    assert out["count"] == 3 and out["event"] == "x"


def test_events_are_one_json_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", ["topsecret-value"])
    try:
        event("podcast_hard_deleted", podcast_id="p1", note="topsecret-value leaked?")
    finally:
        # structlog's configuration is process-wide, and it captured this test's stderr
        structlog.reset_defaults()
    captured = capsys.readouterr()
    assert captured.out == ""
    line = json.loads(captured.err.strip())
    assert line["event"] == "podcast_hard_deleted" and line["podcast_id"] == "p1"
    assert line["level"] == "info" and "ts" in line
    assert "topsecret" not in captured.err


def test_describe_error_is_one_line() -> None:
    assert describe_error(ValueError("first\nsecond")) == "ValueError: first"
    assert describe_error(RuntimeError()) == "RuntimeError"
