"""The installed `nightcrew` command, as a user runs it, against a fresh database."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from nightcrew.config import Settings
from nightcrew.db.migrate import discover_migrations

pytestmark = pytest.mark.acceptance

# A command run by a test inherits none of the developer's nightcrew settings (their
# DATABASE_URL, REDIS_URL or QUEUE_URL must not be used) but the session's NIGHTCREW_DATA_DIR
# (tests/conftest.py), which keeps its files out of the checkout.
_INHERITED_SETTINGS = {"NIGHTCREW_DATA_DIR"}
_SETTINGS = {str(field.alias) for field in Settings.model_fields.values()} - _INHERITED_SETTINGS


def _nightcrew() -> str:
    beside = Path(sys.executable).parent / "nightcrew"
    found = str(beside) if beside.exists() else shutil.which("nightcrew")
    assert found, "the nightcrew console script is not installed"
    return found


def _env(**overrides: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SETTINGS}
    for key, value in overrides.items():
        if value is not None:
            env[key] = value
    return env


def run(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_nightcrew(), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_migrate_twice_then_run_the_minute_lane(empty_db_url: str) -> None:
    env = _env(DATABASE_URL=empty_db_url)
    first = run("db", "migrate", "--json", env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["applied"] == [m.label for m in discover_migrations()]
    second = run("db", "migrate", "--json", env=env)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["applied"] == []

    check = run("db", "check", env=env)
    assert check.returncode == 0 and "schema ok" in check.stdout

    tick = run("lifecycle", "run", "minute", "--json", "--now", "2026-11-29T04:00:00Z", env=env)
    assert tick.returncode == 0, tick.stderr
    report = json.loads(tick.stdout)
    assert report["lane"] == "minute" and report["now"] == "2026-11-29T04:00:00+00:00"
    assert report["errors"] == [] and set(report["jobs"]) == {
        "sweepStalledImports",
        "sweepStalledExternalLinks",
        "sweepStuckHostingMigrationPreviews",
        "sweepWedgedMediaJobs",
        "deliverEffects",
    }
    # the duration as every report spells it, the lane's and each job's
    for measured in (report, *report["jobs"].values()):
        assert measured["durationMs"] >= 0 and "duration_ms" not in measured
    events = [json.loads(line)["event"] for line in tick.stderr.splitlines()]
    assert events == ["lifecycle_cron_started", "import_watchdog_completed"]

    summary = run("lifecycle", "run", "minute", env=env)
    assert summary.returncode == 0 and "sweepStalledImports" in summary.stdout

    dry = run("lifecycle", "run", "minute", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True and json.loads(dry.stdout)["run_id"] is None
    assert all(json.loads(line).get("dry_run") is True for line in dry.stderr.splitlines())


def test_db_check_on_an_unmigrated_database_exits_1_and_names_tables(empty_db_url: str) -> None:
    result = run("db", "check", env=_env(DATABASE_URL=empty_db_url))
    assert result.returncode == 1
    assert "MISSING public.podcasts" in result.stdout
    assert "schema incomplete" in result.stdout


def test_unreachable_database_is_one_line_and_exit_2() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://postgres:hunter2@127.0.0.1:{port}/prod"
    for args in (("db", "migrate"), ("lifecycle", "run", "minute"), ("lifecycle", "run", "daily")):
        result = run(*args, env=_env(DATABASE_URL=url))
        assert result.returncode == 2
        *events, last = result.stderr.strip().splitlines()
        assert last.startswith(f"nightcrew: cannot reach PostgreSQL at 127.0.0.1:{port}/prod")
        assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
        if args[0] == "db":
            assert events == [], result.stderr
            continue
        # a lane run that cannot start still says so in spec 000's events, for monitoring
        logged = [json.loads(line) for line in events]
        assert [e["event"] for e in logged] == ["lifecycle_cron_started", "lifecycle_cron_failed"]
        cron = {"minute": "* * * * *", "daily": "0 4 * * *"}[args[2]]
        assert logged[0]["cron"] == logged[1]["cron"] == cron
        assert "cannot reach PostgreSQL" in logged[1]["error"]


def test_a_server_that_refuses_us_is_not_called_unreachable(pg_admin_url: str) -> None:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(pg_admin_url)
    netloc = "nightcrew_no_such_role@" + parts.netloc.rpartition("@")[2]
    url = urlunsplit(parts._replace(netloc=netloc))
    result = run("db", "check", env=_env(DATABASE_URL=url))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert ' refused the connection: role "nightcrew_no_such_role" does not exist' in line, line
    assert line.startswith("nightcrew: PostgreSQL at ") and "cannot reach" not in line


def test_an_unreachable_rabbitmq_is_one_line_and_exit_2(fresh_db_url: str) -> None:
    """aio-pika and aiormq log the failed connect themselves: never beside our line."""
    from tests.support.servers import free_port

    port = free_port()
    url = f"amqp://guest:hunter2@127.0.0.1:{port}/"
    result = run("lifecycle", "run", "minute", env=_env(DATABASE_URL=fresh_db_url, QUEUE_URL=url))
    assert result.returncode == 2
    *events, line = result.stderr.strip().splitlines()
    assert line.startswith(f"nightcrew: cannot reach RabbitMQ at 127.0.0.1:{port}/"), line
    assert "hunter2" not in result.stderr
    # nothing of aio-pika's own: only the lane's run that could not start, in spec 000's events
    names = [json.loads(e)["event"] for e in events]
    assert names == ["lifecycle_cron_started", "lifecycle_cron_failed"], result.stderr


def test_a_malformed_database_url_never_echoes_the_password() -> None:
    url = "postgresql://bob:s3cr%zzet@127.0.0.1:5432/prod"
    result = run("db", "migrate", env=_env(DATABASE_URL=url))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "nightcrew: DATABASE_URL is not a valid PostgreSQL URL (is a special character in the "
        "password percent-encoded?)"
    ]
    assert "s3cr" not in result.stderr


def test_serve_on_a_busy_port_is_one_line_and_exit_2(fresh_db_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("serve", "--port", str(port), env=_env(DATABASE_URL=fresh_db_url), timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], result.stderr


@pytest.mark.parametrize(
    ("args", "env_extra", "message"),
    [
        (("lifecycle", "run", "minute", "--now", "2026-11-29T04:00"), {}, "--now:"),
        (("lifecycle", "run", "minute", "--now", "soon"), {}, "--now:"),
        (("db", "migrate"), {"NIGHTCREW_DB_POOL_MAX_SIZE": "many"}, "NIGHTCREW_DB_POOL_MAX_SIZE"),
        (("db", "migrate"), {"QUEUE_URL": "kafka://x"}, "QUEUE_URL"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    fresh_db_url: str, args: tuple[str, ...], env_extra: dict[str, str], message: str
) -> None:
    result = run(*args, env=_env(DATABASE_URL=fresh_db_url, **env_extra))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_the_embedded_default_needs_no_configuration(tmp_path: Path) -> None:
    env = _env(NIGHTCREW_DATA_DIR=str(tmp_path / "data"))
    migrate = run("db", "migrate", env=env, cwd=tmp_path)
    assert migrate.returncode == 0, migrate.stderr
    tick = run("lifecycle", "run", "minute", "--json", env=env, cwd=tmp_path)
    assert tick.returncode == 0, tick.stderr
    assert json.loads(tick.stdout)["run_id"] == 1
    again = run("lifecycle", "run", "minute", "--json", env=env, cwd=tmp_path)
    assert json.loads(again.stdout)["run_id"] == 2  # the same cluster, reused
    assert (tmp_path / "data" / "pg" / "PG_VERSION").exists()


def test_a_command_run_by_the_tests_writes_nothing_into_its_working_directory(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """The minute lane opens the local store (./.nightcrew/media by default): run from a
    checkout, the tests would leave that directory in it."""
    result = run("lifecycle", "run", "minute", env=_env(DATABASE_URL=fresh_db_url), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_serve_answers_health_and_stops_cleanly(fresh_db_url: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [_nightcrew(), "serve", "--port", str(port)],
        env=_env(DATABASE_URL=fresh_db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        body = None
        while time.monotonic() < deadline:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/_health", timeout=1).json()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert body == {"status": "ok", "service": "lifecycle-manager"}
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert "serve_started" in events and events[-1] == "serve_stopped"


def test_the_daily_lane_from_the_command_line(fresh_db_url: str, tmp_path: Path) -> None:
    import asyncio

    from nightcrew.db.database import Database
    from tests import factories as f

    async def seed() -> str:
        db = await Database.open(fresh_db_url)
        try:
            return await f.podcast(
                db, status="pending_deletion", deletion_scheduled_at="2026-11-28T00:00:00Z"
            )
        finally:
            await db.close()

    podcast = asyncio.run(seed())
    media = tmp_path / "media" / "podcasts" / podcast / "e" / "x"
    media.mkdir(parents=True)
    (media / "a.mp3").write_bytes(b"audio")
    env = _env(DATABASE_URL=fresh_db_url, STORAGE_URL=f"file://{tmp_path / 'media'}")
    now = "2026-11-29T04:00:00Z"

    dry = run("lifecycle", "run", "daily", "--dry-run", "--json", "--now", now, env=env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["podcasts_deleted"] == 1
    assert (media / "a.mp3").exists()

    real = run("lifecycle", "run", "daily", "--json", "--now", now, env=env)
    assert real.returncode == 0, real.stderr
    report = json.loads(real.stdout)
    assert report["lane"] == "daily" and report["podcasts_deleted"] == 1
    assert report["objects_deleted"] == 1 and not (media / "a.mp3").exists()
    events = [json.loads(line)["event"] for line in real.stderr.splitlines()]
    assert events[0] == "lifecycle_cron_started" and events[-1] == "lifecycle_cron_completed"

    human = run("lifecycle", "run", "daily", "--now", now, env=env)
    assert human.returncode == 0 and "hardDeleteExpiredPodcasts" in human.stdout


def test_demo_tells_the_story_and_never_touches_database_url(
    tmp_path: Path, fresh_db_url: str
) -> None:
    env = _env(NIGHTCREW_DATA_DIR=str(tmp_path / "data"), DATABASE_URL=fresh_db_url)
    result = run("demo", env=env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Night Owls         paused            → active" in out
    assert "Old Times          pending_deletion  deleted" in out
    assert "Garden Hour        paused            unchanged" in out
    assert "4 file(s)" in out and "2 lost podcast-imports message(s) re-sent" in out
    assert "1 unconfirmed signup(s) older than 7 days deleted" in out
    assert "1 orphaned upload(s)" in out and "5 episode size(s)" in out
    assert "Subject: Your account is over its plan limits" in out
    assert "first run: 5 new stories queued, 5 written, 3 accepted, 2 rejected" in out
    assert "second run: 0 new stories" in out
    assert "3 podcasts on a plan that includes 2 (1 over)" in out
    # quiet: the note is stderr's one line; the run's events are in the file the story names
    [note] = result.stderr.strip().splitlines()
    assert "ignores DATABASE_URL" in note
    events = (tmp_path / "data" / "demo" / "events.jsonl").resolve()
    assert f"logged as a JSON event, in {events} (--verbose shows them on stderr)." in out
    logged = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert logged[0] == "lifecycle_cron_started" and "effects_dead" in logged
    import psycopg

    with psycopg.connect(fresh_db_url) as conn:  # the real database saw nothing
        assert conn.execute("SELECT count(*) FROM nightcrew.runs").fetchone() == (0,)
    # idempotent: starts afresh; --verbose shows the events on stderr instead
    again = run("demo", "--verbose", env=env, cwd=tmp_path, timeout=180)
    assert again.returncode == 0 and again.stdout.count("→ active") == 1
    assert "logged as a JSON event, on stderr." in again.stdout
    shown = [json.loads(line)["event"] for line in again.stderr.splitlines()[1:]]
    assert shown[0] == "lifecycle_cron_started" and "effects_dead" in shown


def test_the_overage_machine_for_one_account_from_the_command_line(fresh_db_url: str) -> None:
    import asyncio

    from nightcrew.db.database import Database
    from tests import factories as f

    async def seed() -> str:
        db = await Database.open(fresh_db_url)
        try:
            await db.execute(
                "INSERT INTO public.plan_limits VALUES ('solo', 'podcasts_per_account', 1)"
            )
            account = await f.account(db, plan="solo")
            for _ in range(2):
                await f.podcast(db, billing_account_id=account)
            return account
        finally:
            await db.close()

    account = asyncio.run(seed())
    env = _env(DATABASE_URL=fresh_db_url)
    now = "2026-11-29T04:00:00Z"
    dry = run(
        "lifecycle", "overage", "--account", account, "--dry-run", "--json", "--now", now, env=env
    )
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["armed"] == 1
    real = run("lifecycle", "overage", "--account", account, "--json", "--now", now, env=env)
    report = json.loads(real.stdout)
    assert report["armed"] == 1  # the dry run armed nothing
    assert report["claims"] == [{"account_id": account, "stage": 0}]
    bad = run("lifecycle", "overage", "--account", "nope", env=env)
    assert bad.returncode == 2 and "not a billing account id" in bad.stderr
    missing = run(
        "lifecycle", "overage", "--account", "00000000-0000-0000-0000-000000000000", env=env
    )
    assert missing.returncode == 1 and "no billing account" in missing.stderr


@pytest.mark.slow
def test_news_sources_from_the_command_line(fresh_db_url: str) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    added = run(
        "news",
        "sources",
        "add",
        "https://feeds.example/rss",
        "--name",
        "Example",
        "--shard",
        "s1",
        "--json",
        env=env,
    )
    assert added.returncode == 0, added.stderr
    source_id = json.loads(added.stdout)["id"]
    again = run("news", "sources", "add", "https://feeds.example/rss", "--name", "X", env=env)
    assert again.returncode == 1 and "already exists" in again.stderr
    bad = run("news", "sources", "add", "ftp://feeds.example", "--name", "X", env=env)
    assert bad.returncode == 2 and "not an http(s) feed URL" in bad.stderr  # a bad argument
    local = run("news", "sources", "add", "http://127.0.0.1:8080/rss", "--name", "Lo", env=env)
    assert local.returncode == 0, local.stderr  # added, but told what the runs will do with it
    assert "note: 127.0.0.1 is not a public address" in local.stderr
    assert "NEWS_ALLOWED_PRIVATE_HOSTS=127.0.0.1" in local.stderr
    allowed = {**env, "NEWS_ALLOWED_PRIVATE_HOSTS": "127.0.0.1"}
    quiet = run("news", "sources", "add", "http://127.0.0.1:8081/rss", "--name", "L2", env=allowed)
    assert quiet.returncode == 0 and quiet.stderr == ""
    listed = run("news", "sources", "list", "--shard", "s1", env=env).stdout.splitlines()
    assert listed[0].split() == ["ID", "SHARD", "STATE", "FAILURES", "NAME", "FEED", "URL"]
    assert listed[1].split()[1:] == ["s1", "enabled", "0", "Example", "https://feeds.example/rss"]
    # columns aligned: each row's URL starts under the header's
    assert listed[1].index("https://") == listed[0].index("FEED URL")
    import psycopg

    with psycopg.connect(fresh_db_url, autocommit=True) as conn:  # as a fetch leaves it
        conn.execute("UPDATE news.sources SET next_check_at = '2026-11-29T04:15:00Z'")
    listing = run("news", "sources", "list", "--json", "--shard", "s1", env=env).stdout
    [source] = json.loads(listing)
    due = source["next_check_at"]  # ISO 8601: a T, not a space, and the offset
    assert due[10] == "T" and datetime.fromisoformat(due) == datetime(
        2026, 11, 29, 4, 15, tzinfo=UTC
    )
    disabled = run("news", "sources", "disable", str(source_id), env=env)
    assert disabled.returncode == 0 and "disabled source" in disabled.stdout
    row = run("news", "sources", "list", "--shard", "s1", env=env).stdout.splitlines()[1]
    assert row.split()[2] == "disabled"


def test_news_run_without_a_shard_says_which_it_runs_or_asks(fresh_db_url: str) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    plain = run("news", "run", "--json", env=env)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["shard"] == "default"
    assert "no --shard given: running shard 'default' (NEWS_SHARDS is not set)" in plain.stderr
    one = run("news", "run", "--json", env={**env, "NEWS_SHARDS": "eu"})
    assert one.returncode == 0 and json.loads(one.stdout)["shard"] == "eu"
    several = run("news", "run", env={**env, "NEWS_SHARDS": "eu,us"})
    assert several.returncode == 2
    assert "give --shard (NEWS_SHARDS names eu, us)" in several.stderr


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("REDIS_URL", "not-a-url", "REDIS_URL: must be a redis://"),
        ("NEWS_AI_BASE_URL", "localhost:8080/v1", "NEWS_AI_BASE_URL: must be an http"),
        ("PUBLIC_FEED_URL", "feeds.example", "PUBLIC_FEED_URL: must be an http"),
        ("STORAGE_URL", "file://{tmp}/a-file/media", "STORAGE_URL: cannot create"),
    ],
)
def test_a_bad_setting_is_exit_2_naming_it(
    fresh_db_url: str, tmp_path: Path, setting: str, value: str, named: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    env = _env(DATABASE_URL=fresh_db_url, **{setting: value.format(tmp=tmp_path)})
    result = run("lifecycle", "run", "minute", env=env)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert named in last, result.stderr
    assert "Traceback" not in result.stderr


def test_now_outside_the_years_it_can_mean_and_an_empty_shard_are_exit_2(
    fresh_db_url: str,
) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    far = run("lifecycle", "run", "minute", "--now", "9999-12-31T23:59:59Z", env=env)
    assert far.returncode == 2 and "outside the years 1970-9000" in far.stderr, far.stderr
    naive = run("lifecycle", "run", "minute", "--now", "2026-11-29", "--dry-run", env=env)
    assert naive.returncode == 2, naive.stderr
    hint = naive.stderr.split("write it as e.g. ")[1].split(" or ")[0]
    assert hint == "2026-11-29T00:00:00Z"
    hinted = run("lifecycle", "run", "minute", "--now", hint, "--dry-run", env=env)
    assert hinted.returncode == 0, hinted.stderr
    empty = run("news", "run", "--shard", "", env=env)
    assert empty.returncode == 2 and "--shard is empty" in empty.stderr, empty.stderr


def test_a_hand_typed_news_run_is_manual_and_a_cron_says_scheduled(
    fresh_db_url: str, tmp_path: Path
) -> None:
    env = _env(DATABASE_URL=fresh_db_url, NIGHTCREW_DATA_DIR=str(tmp_path))
    typed = run("news", "run", "--shard", "s", "--json", env=env)
    assert typed.returncode == 0, typed.stderr
    assert json.loads(typed.stdout)["trigger"] == "manual"
    cron = run("news", "run", "--shard", "s", "--json", "--scheduled", env=env)
    assert cron.returncode == 0, cron.stderr
    assert json.loads(cron.stdout)["trigger"] == "scheduled"


def _demo_interrupted(
    tmp_path: Path, when: Callable[[Path], bool]
) -> subprocess.CompletedProcess[str]:
    """`nightcrew demo` in a session of its own, Ctrl-C'd (SIGINT to its whole process group,
    as a terminal sends it) once ``when(events file)`` holds."""
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [_nightcrew(), "demo"],
        env=_env(NIGHTCREW_DATA_DIR=str(data)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    events = data / "demo" / "events.jsonl"
    deadline = time.monotonic() + 120
    while proc.poll() is None and not when(events) and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _logged(events: Path, name: str) -> bool:
    return events.exists() and name in events.read_text()


@pytest.mark.parametrize(
    "moment",
    ["starting", "lanes running", "news parsing"],
)
def test_ctrl_c_during_the_demo_is_one_line_and_no_traceback(tmp_path: Path, moment: str) -> None:
    started = time.monotonic()
    when = {
        "starting": lambda events: time.monotonic() - started > 1.0,
        "lanes running": lambda events: _logged(events, "lifecycle_cron_started"),
        # the news runs come after the daily lane: the parser workers start with their feeds
        "news parsing": lambda events: _logged(events, "lifecycle_cron_completed"),
    }[moment]
    result = _demo_interrupted(tmp_path, when)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert "KeyboardInterrupt" not in output, output[-3000:]
    # 130 when the demo sees the interrupt itself; 2 when it lands in the embedded
    # PostgreSQL's initdb first, which then fails and says so (one line either way)
    assert result.returncode in (130, 2, 0), (result.returncode, output[-2000:])
    if result.returncode and result.stderr.strip():  # silent when it fell before the start
        assert result.stderr.strip().splitlines()[-1].startswith("nightcrew: "), result.stderr
