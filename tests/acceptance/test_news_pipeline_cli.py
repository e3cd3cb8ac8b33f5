"""`nightcrew news run|worker|dlq` in pipeline mode, as an operator types them: clear refusals
for what cannot work, and a pass, a worker and the dead-letter commands against a real
RabbitMQ."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_cli import _env, _nightcrew, run
from tests.integration.news.pipeline_support import delete_namespace
from tests.support.servers import answers
from tests.support.services import AMQP_URL, needs_rabbitmq
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = pytest.mark.acceptance


def test_the_pipeline_needs_rabbitmq_and_says_so(fresh_db_url: str) -> None:
    env = _env(DATABASE_URL=fresh_db_url, NEWS_PIPELINE="rabbitmq")
    refused = run("news", "run", "--shard", "s", env=env)
    assert refused.returncode == 2
    assert "NEWS_PIPELINE=rabbitmq needs QUEUE_URL=amqp://" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    inline = _env(DATABASE_URL=fresh_db_url)
    worker = run("news", "worker", env=inline)
    assert worker.returncode == 2 and "news worker needs NEWS_PIPELINE=rabbitmq" in worker.stderr
    bad_stage = run("news", "worker", "--stage", "translate", env=inline)
    assert bad_stage.returncode == 2 and "translate" in bad_stage.stderr


def test_dlq_commands_refuse_ambiguous_or_unconfirmed_requests(fresh_db_url: str) -> None:
    env = _env(DATABASE_URL=fresh_db_url)
    both = run("news", "dlq", "replay", "--id", "x", "--all", env=env)
    assert both.returncode == 2 and "exactly one of --id ID or --all" in both.stderr
    neither = run("news", "dlq", "replay", env=env)
    assert neither.returncode == 2
    unconfirmed = run("news", "dlq", "purge", "--stage", "write", env=env)
    assert unconfirmed.returncode == 2 and "add --yes" in unconfirmed.stderr


def test_a_broker_that_does_not_answer_is_one_line_and_exit_2(fresh_db_url: str) -> None:
    from tests.support.servers import free_port

    port = free_port()
    assert not answers(port)
    env = _env(
        DATABASE_URL=fresh_db_url,
        NEWS_PIPELINE="rabbitmq",
        QUEUE_URL=f"amqp://guest:guest@127.0.0.1:{port}/",
    )
    result = run("news", "dlq", "list", env=env, timeout=60)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()  # aio-pika's own log lines are not shown
    assert f"cannot reach RabbitMQ at 127.0.0.1:{port}" in line
    assert "guest:guest" not in result.stderr


@pytest.fixture
def model() -> Iterator[ModelStandIn]:
    with ModelStandIn(delay=0.0) as server:
        yield server


@needs_rabbitmq
@pytest.mark.slow
def test_a_pass_a_worker_and_sigterm_from_the_command_line(
    fresh_db_url: str, model: ModelStandIn, tmp_path: Path
) -> None:
    import asyncio

    prefix = f"nccli-{int(time.time() * 1000) % 10**9}"
    env = _env(
        DATABASE_URL=fresh_db_url,
        NEWS_PIPELINE="rabbitmq",
        QUEUE_URL=AMQP_URL,
        NEWS_QUEUE_PREFIX=prefix,
        NEWS_ALLOWED_PRIVATE_HOSTS="127.0.0.1",
        NEWS_AI_BASE_URL=model.base_url,
        NEWS_AI_MODEL="stand-in",
        STORAGE_URL=f"file://{tmp_path}/store",
    )
    try:
        with FeedFarm(feeds=2, items=3) as farm:
            for n, url in enumerate(farm.feed_urls()):
                added = run(
                    "news", "sources", "add", url, "--name", f"F{n}", "--shard", "s", env=env
                )
                assert added.returncode == 0, added.stderr
            worker = subprocess.Popen(
                [_nightcrew(), "news", "worker", "--concurrency", "2"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                # the pass waits for the worker's fetches, then admits what they found
                passed = run("news", "run", "--shard", "s", env=env)
                assert passed.returncode == 0, passed.stderr
                assert "pass done" in passed.stdout and "sources enqueued" in passed.stdout
                assert "  admitted into the stages         6\n" in passed.stdout, passed.stdout
                deadline = time.monotonic() + 60
                while sum(model.reviews.values()) < 6 and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(1.0)  # the last writes
            finally:
                worker.send_signal(signal.SIGTERM)
                _, stderr = worker.communicate(timeout=60)
            assert worker.returncode == 0, stderr
            events = [json.loads(line) for line in stderr.splitlines()]
            written = [e for e in events if e.get("outcome") == "written"]
            assert len(written) == 6
            assert events[-1]["event"] == "news.worker_stopped"
            listed = run("news", "dlq", "list", "--json", env=env)
            assert listed.returncode == 0 and json.loads(listed.stdout) == []
            assert run("news", "dlq", "list", env=env).stdout.strip() == "no dead letters"
    finally:
        asyncio.run(delete_namespace(prefix))
