"""The dashboard's actions in real Chromium, on the demo's night served with the RabbitMQ
pipeline's dead letters (`nightcrew serve --demo` with NEWS_PIPELINE=rabbitmq): retry a dead
effect and see it pending, retry every dead effect of a kind through the confirmation, enable
the parked source, replay a dead letter — each page's screenshot checked not blank."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nightcrew.adapters.broker import Outgoing, PipelineBroker
from tests.support.browser import (
    Served,
    assert_not_blank,
    demo_served,
)
from tests.support.services import AMQP_VARIABLE, configured, skip_reason

MAX_DELIVERIES = 5  # the default NEWS_MAX_DELIVERIES: the queues' arguments must agree


@pytest.fixture(scope="module")
def amqp() -> str:
    url = configured(AMQP_VARIABLE)
    if (reason := skip_reason(AMQP_VARIABLE, url)) is not None:
        pytest.skip(reason)
    assert url is not None
    return url


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"nc-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, amqp: str, prefix: str) -> Iterator[Served]:
    with demo_served(
        tmp_path_factory.mktemp("demo-actions"),
        NEWS_PIPELINE="rabbitmq",
        QUEUE_URL=amqp,
        NEWS_QUEUE_PREFIX=prefix,
    ) as s:
        yield s


@pytest.fixture
async def broker(amqp: str, prefix: str) -> AsyncIterator[PipelineBroker]:
    pipeline = PipelineBroker(amqp, prefix=prefix, max_deliveries=MAX_DELIVERIES)
    try:
        yield pipeline
    finally:
        await pipeline.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if m.type == "error" else None)
    try:
        yield page
        # the strict CSP stays strict and nothing on the pages breaks it
        assert not [v for v in violations if "Content Security Policy" in v], violations
    finally:
        await context.close()


async def shot(page: Any, out: Path) -> None:
    assert_not_blank(await page.screenshot(path=str(out), full_page=True))


async def test_retry_one_dead_effect_and_see_it_pending(
    served: Served, page: Any, tmp_path: Path
) -> None:
    await page.goto(served.url + "/effects")
    dead = page.locator("tr.effect.dead")
    assert await dead.count() >= 2  # the demo's: Stripe and the feed worker are not configured
    row_id = await dead.first.get_attribute("id")
    assert row_id is not None
    async with page.expect_navigation():
        await dead.first.locator("button", has_text="Retry").click()
    assert page.url.endswith(f"/effects#{row_id}")
    again = page.locator(f"#{row_id}")
    assert await again.get_attribute("class") == "effect pending"
    assert "effects.retry" in await page.locator("table.actions").inner_text()
    assert "dashboard 127.0.0.1" in await page.locator("table.actions").inner_text()
    await shot(page, tmp_path / "effects-retried.png")


async def test_retry_every_dead_effect_of_a_kind_through_the_confirmation(
    served: Served, page: Any, tmp_path: Path
) -> None:
    await page.goto(served.url + "/effects")
    row = page.locator("tr.kind", has=page.locator("a.retry-all")).first
    kind = await row.get_attribute("data-kind")
    dead = int(await row.locator(f'[data-live="effects.{kind}.dead"]').inner_text())
    assert dead >= 1
    async with page.expect_navigation():
        await row.locator("a.retry-all").click()
    assert f"/effects/retry-dead?kind={kind}" in page.url
    assert f"{dead} dead {kind} effect(s)" in await page.locator("main").inner_text()
    await shot(page, tmp_path / "confirm.png")
    async with page.expect_navigation():
        await page.locator("form.act button").click()
    assert page.url.endswith("/effects#actions")
    cell = page.locator(f'[data-live="effects.{kind}.dead"]')
    assert await cell.inner_text() == "0"
    assert "effects.retry_dead" in await page.locator("table.actions").inner_text()
    await shot(page, tmp_path / "effects-all-retried.png")


async def test_enable_the_parked_source(served: Served, page: Any, tmp_path: Path) -> None:
    await page.goto(served.url + "/news")
    parked = page.locator("tr.source.parked", has_text="Wire (office)")
    assert "NEWS_ALLOWED_PRIVATE_HOSTS=10.20.0.7" in await parked.inner_text()
    async with page.expect_navigation():
        await parked.locator("button", has_text="Enable").click()
    assert await page.locator("tr.source.parked", has_text="Wire (office)").count() == 0
    assert "news.source_enable" in await page.locator("table.actions").inner_text()
    await shot(page, tmp_path / "news-enabled.png")


async def test_replay_a_dead_letter(
    served: Served, page: Any, broker: PipelineBroker, tmp_path: Path
) -> None:
    letter = {"x-last-error": "feed timed out", "x-deliveries": 5, "x-dead-reason": "failed"}
    await broker.publish(
        [
            Outgoing(
                message_id="letter-1",
                stage="fetch",
                body={"source_id": 1, "shard": "demo"},
                headers=letter,
            )
        ],
        dead=True,
    )
    fetch_before = await broker.ready("fetch")
    await page.goto(served.url + "/news#letters")
    letters = page.locator("tr.letter")
    assert await letters.count() == 1
    assert "feed timed out" in await letters.first.inner_text()
    await shot(page, tmp_path / "letters.png")
    async with page.expect_navigation():
        await letters.first.locator("button", has_text="Replay").click()
    assert await page.locator("tr.letter").count() == 0
    assert await broker.ready("fetch", dlq=True) == 0
    assert await broker.ready("fetch") == fetch_before + 1  # its source went back to work
    assert "news.dlq_replay" in await page.locator("table.actions").inner_text()
    await shot(page, tmp_path / "letters-replayed.png")
