from __future__ import annotations

import re
from pathlib import Path

import pytest

from nightcrew.config import Settings, load_settings
from nightcrew.errors import ConfigError

SETTINGS_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for field in Settings.model_fields.values():
        monkeypatch.delenv(str(field.alias), raising=False)
    s = load_settings()
    assert s.database_url is None and s.queue_url == "postgres"
    assert s.data_dir == Path(".nightcrew") and s.embedded_pgdata == Path(".nightcrew/pg")
    assert s.ingestion_backpressure_queue_limit == 250
    assert s.ingestion_backpressure_db_article_limit == 30000
    assert s.worker_lock_ttl_seconds == 600 and s.ai_review_lock_ttl_seconds == 1800


def test_the_environment_names_are_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("RECONCILER_SECRET", "s3cret-value")
    monkeypatch.setenv("UPSTASH_REDIS_WORKER_LOCK_TTL_SECONDS", "42")
    s = load_settings()
    assert s.database_url == "postgresql://u@h/db"
    assert s.worker_lock_ttl_seconds == 42
    assert s.secret_values() == ["s3cret-value"]
    assert "s3cret-value" not in repr(s)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("INGESTION_BACKPRESSURE_QUEUE_LIMIT", "lots", "INGESTION_BACKPRESSURE_QUEUE_LIMIT"),
        ("QUEUE_URL", "kafka://x", "unknown queue backend"),
        ("DATABASE_URL", "mysql://x", "DATABASE_URL"),
        ("REDIS_URL", "not-a-url", "REDIS_URL: must be a redis://"),
        ("REDIS_URL", "redis://host:port", "REDIS_URL: must be a redis://host:port URL"),
        ("NEWS_AI_BASE_URL", "localhost:8080/v1", "NEWS_AI_BASE_URL: must be an http"),
        ("NEWS_AI_BASE_URL", "http://user:key@127.0.0.1/v1", "put the key in NEWS_AI_API_KEY"),
        ("PUBLIC_FEED_URL", "feeds.example", "PUBLIC_FEED_URL: must be an http"),
        ("PUBLIC_FEED_URL", "https://feeds example", "PUBLIC_FEED_URL: must be an http"),
        ("PUBLIC_APP_URL", "ftp://app.example", "PUBLIC_APP_URL: must be an http"),
        ("R2_PUBLIC_URL", "https://:80", "R2_PUBLIC_URL: must be an http"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"QUEUE_URL": "kafka://x"},
            "invalid configuration: QUEUE_URL: unknown queue backend 'kafka://x'; expected "
            "'postgres' or amqp://…",
        ),
        (
            {"DATABASE_URL": "mysql://x"},
            "invalid configuration: DATABASE_URL: must be a postgresql://… URL",
        ),
        (
            {"NEWS_PIPELINE": "rabbitmq", "QUEUE_URL": "postgres"},
            "invalid configuration: NEWS_PIPELINE=rabbitmq needs QUEUE_URL=amqp://… (the stage "
            "queues)",
        ),
        (
            {"NIGHTCREW_LOG_LEVEL": "loud"},
            "invalid configuration: NIGHTCREW_LOG_LEVEL: Input should be 'debug', 'info', "
            "'warning' or 'error'",
        ),
    ],
)
def test_a_bad_value_says_the_variable_and_the_problem_without_pydantic_noise(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], line: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == line


def _documented_defaults() -> dict[str, str]:
    """docs/reference/settings.md's table: variable → its Default cell."""
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| ([^|]*) \|", SETTINGS_REFERENCE.read_text(), re.M)
    return {name: default.strip() for name, default in rows}


def _agrees(cell: str, default: object) -> bool:
    """Whether a Default cell says the field's default: "unset …" for None, "empty …" for "",
    else its first `code` (a number however written: `10` for 10.0, `30000` for 30_000)."""
    if default is None:
        return cell.startswith("unset")
    if default == "":
        return cell.startswith("empty")
    shown = re.match(r"`([^`]+)`", cell)
    if shown is None:
        return False
    if isinstance(default, bool):
        return shown[1] == str(default).lower()
    if isinstance(default, int | float):
        try:
            return float(shown[1].replace(",", "")) == float(default)
        except ValueError:
            return False
    if isinstance(default, Path):
        return Path(shown[1]) == default
    return shown[1] == str(default)


def test_the_settings_reference_lists_every_variable_with_its_default() -> None:
    documented = _documented_defaults()
    expected = {str(f.alias) for f in Settings.model_fields.values()}
    assert expected == set(documented)
    wrong = [
        f"{field.alias}: {documented[str(field.alias)]!r} (Settings: {field.default!r})"
        for field in Settings.model_fields.values()
        if not _agrees(documented[str(field.alias)], field.default)
    ]
    assert wrong == [], "docs/reference/settings.md's defaults disagree with Settings"


def test_amqp_selects_rabbitmq(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_URL", "amqp://guest:guest@127.0.0.1:5672/")
    assert load_settings().queue_url.startswith("amqp://")


def test_database_keepalives_and_the_minute_deadline_have_defaults_and_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for field in Settings.model_fields.values():
        monkeypatch.delenv(str(field.alias), raising=False)
    s = load_settings()
    assert (s.db_keepalives_idle_seconds, s.db_keepalives_interval_seconds) == (10, 5)
    assert s.db_keepalives_count == 3
    assert s.db_minute_statement_timeout_seconds == 10.0
    monkeypatch.setenv("NIGHTCREW_DB_KEEPALIVES_INTERVAL_SECONDS", "2")
    monkeypatch.setenv("NIGHTCREW_DB_KEEPALIVES_COUNT", "4")
    monkeypatch.setenv("NIGHTCREW_DB_MINUTE_STATEMENT_TIMEOUT_SECONDS", "0")  # the pool's bound
    s = load_settings()
    assert (s.db_keepalives_interval_seconds, s.db_keepalives_count) == (2, 4)
    assert s.db_minute_statement_timeout_seconds == 0


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("NIGHTCREW_DB_KEEPALIVES_INTERVAL_SECONDS", "0", "greater than or equal to 1"),
        ("NIGHTCREW_DB_KEEPALIVES_INTERVAL_SECONDS", "40000", "less than or equal to 32767"),
        ("NIGHTCREW_DB_KEEPALIVES_INTERVAL_SECONDS", "2.5", "valid integer"),
        ("NIGHTCREW_DB_KEEPALIVES_COUNT", "0", "greater than or equal to 1"),
        ("NIGHTCREW_DB_KEEPALIVES_COUNT", "128", "less than or equal to 127"),
        ("NIGHTCREW_DB_MINUTE_STATEMENT_TIMEOUT_SECONDS", "-1", "greater than or equal to 0"),
    ],
)
def test_a_bad_database_keepalive_or_deadline_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, problem: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith(f"invalid configuration: {name}: "), str(caught.value)
    assert problem in str(caught.value)
