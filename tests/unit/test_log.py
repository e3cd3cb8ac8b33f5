from __future__ import annotations

import json

import pytest
import structlog

from nightcrew.config import load_settings
from nightcrew.log import (
    REDACTED,
    SecretScrubber,
    configure_logging,
    describe_error,
    event,
    redact_url_passwords,
)


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
            "aiPromptTokens": 1200,  # a count of tokens, not a token
            "token": "abc",
        },
    )
    assert out["authorization"] == REDACTED and out["api_key"] == REDACTED
    assert "sk_live" not in out["error"] and REDACTED in out["error"]
    assert out["nested"] == {"detail": [REDACTED]}
    assert out["url"] == f"postgresql://app:{REDACTED}@db.internal:5432/prod"
    assert out["count"] == 3 and out["event"] == "x"
    assert out["aiPromptTokens"] == 1200 and out["token"] == REDACTED


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


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://:hunter22@redis.internal:6379/0", f"redis://:{REDACTED}@redis.internal:6379/0"),
        ("rediss://default:hunter22@r.example", f"rediss://default:{REDACTED}@r.example"),
        (
            "amqp://app:hunter22@mq.internal:5672/vh refused",
            f"amqp://app:{REDACTED}@mq.internal:5672/vh refused",
        ),
        # an unencoded "@" in the password: everything up to the host goes
        ("https://u:p@ss@feed.example/rss", f"https://u:{REDACTED}@feed.example/rss"),
        ("https://user@feed.example/rss, mail a@b.example", None),  # no password: unchanged
        ("http://127.0.0.1:8787/login", None),
    ],
)
def test_passwords_in_urls_are_redacted_even_without_a_user(text: str, shown: str | None) -> None:
    assert redact_url_passwords(text) == (text if shown is None else shown)
    assert SecretScrubber()(None, "info", {"event": "x", "error": text})["error"] == (
        text if shown is None else shown
    )


def test_redis_and_queue_passwords_are_scrubbed_wherever_they_appear(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:redis-pw-1234@127.0.0.1:6379/0")
    monkeypatch.setenv("QUEUE_URL", "amqp://app:amqp%40pw-5678@127.0.0.1:5672/")
    settings = load_settings()
    configure_logging("info", settings.secret_values())
    try:
        # a driver's message that quotes a password without its URL
        event("redis_failed", error="AUTH redis-pw-1234 rejected", url=settings.redis_url)
        event("broker_failed", error="login amqp@pw-5678 / amqp%40pw-5678 refused")
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    assert "redis-pw-1234" not in err and "pw-5678" not in err
    assert err.count(REDACTED) >= 4
