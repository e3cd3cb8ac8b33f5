"""The dashboard in real Chromium, on the demo's night (`nightcrew demo`, then
`nightcrew serve --demo`): every page renders (a screenshot of each, saved under the test's
output directory and checked not blank), the runs filters work, a run's report opens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import (
    Served,
    assert_not_blank,
    demo_served,
)

PAGES = {
    "overview": "/",
    "runs": "/runs",
    "run": "/runs/2",
    "deletions": "/deletions",
    "overage": "/overage",
    "watchdogs": "/watchdogs",
    "effects": "/effects",
    "news": "/news",
}
TOKEN = "browser-test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with demo_served(tmp_path_factory.mktemp("demo")) as s:
        yield s


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield await context.new_page()
    finally:
        await context.close()


async def test_every_page_renders_the_demos_night(
    served: Served, page: Any, tmp_path: Path
) -> None:
    for name, path in PAGES.items():
        response = await page.goto(served.url + path)
        assert response is not None and response.status == 200, name
        assert await page.locator("h1").count() == 1, name
        shot = tmp_path / f"{name}.png"
        await page.screenshot(path=str(shot), full_page=True)
        assert_not_blank(shot.read_bytes())
    # what the demo did is on the pages
    await page.goto(served.url + "/")
    lanes = await page.locator("main").inner_text()
    assert "daily" in lanes and "minute" in lanes
    await page.goto(served.url + "/deletions")
    assert "old-times" in await page.locator("main").inner_text()
    await page.goto(served.url + "/overage")
    assert "ada@example.test" in await page.locator("main").inner_text()
    await page.goto(served.url + "/news")
    assert "Shard demo" in await page.locator("main").inner_text()


async def test_runs_filters_narrow_the_list(served: Served, page: Any) -> None:
    await page.goto(served.url + "/runs")
    # minute, daily, two of news:demo — and serve --demo's own minute runs since it started
    assert await page.locator("tr.run").count() >= 4
    await page.select_option("form.filters select[name=lane]", "news:demo")
    await page.click("form.filters button")
    await page.wait_for_url("**/runs?lane=news%3Ademo*")
    assert await page.locator("tr.run").count() == 2
    await page.select_option("form.filters select[name=lane]", "daily")
    await page.click("form.filters button")
    await page.wait_for_url("**/runs?lane=daily*")
    rows = page.locator("tr.run")
    assert await rows.count() == 1
    assert "daily" in await rows.first.inner_text()
    await page.select_option("form.filters select[name=status]", "failed")
    await page.click("form.filters button")
    await page.wait_for_url("**status=failed*")
    assert await page.locator("tr.run").count() == 0
    assert "No run matches these filters." in await page.locator("main").inner_text()


async def test_a_runs_report_opens_in_words_then_as_json(served: Served, page: Any) -> None:
    await page.goto(served.url + "/runs?lane=daily")
    await page.locator("tr.run a").first.click()
    await page.wait_for_url("**/runs/2")
    story = await page.locator("ul.story").inner_text()
    assert "its deletion date passed" in story
    assert "its pause ended, so it is active again" in story
    # named by its title, as the CLI and the demo name it (not its slug or an id prefix)
    assert "“Night Owls”: its pause ended" in story
    await page.click("text=The full report as JSON")
    await page.wait_for_url("**/runs/2/report.json")
    assert '"hardDeleteExpiredPodcasts"' in await page.locator("body").inner_text()


async def test_with_a_token_the_browser_signs_in_once_and_keeps_an_http_only_cookie(
    tmp_path_factory: pytest.TempPathFactory, browser: Any
) -> None:
    with demo_served(
        tmp_path_factory.mktemp("demo-token"), NIGHTCREW_DASHBOARD_TOKEN=TOKEN
    ) as served:
        context = await browser.new_context()
        try:
            page = await context.new_page()
            await page.goto(served.url + "/effects")
            assert "/login" in page.url
            await page.fill("input[name=token]", "wrong")
            async with page.expect_navigation():
                await page.click("form.login button")
            assert "not the dashboard token" in await page.locator("main").inner_text()
            await page.fill("input[name=token]", TOKEN)
            async with page.expect_navigation(url="**/effects"):
                await page.click("form.login button")
            assert await page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
            cookies = await context.cookies()
            # the session, the CSRF value its forms' tokens are made of, and the known-device
            # cookie that puts this browser's next sign-in first (sent to /login only)
            assert sorted(c["name"] for c in cookies) == [
                "nightcrew_csrf",
                "nightcrew_dashboard",
                "nightcrew_device",
            ]
            assert [c["sameSite"] for c in cookies] == ["Strict"] * 3
            assert {c["name"]: c["path"] for c in cookies}["nightcrew_device"] == "/login"
            assert all(c["httpOnly"] and TOKEN not in c["value"] for c in cookies)
            await page.goto(served.url + "/runs")
            assert "/login" not in page.url
            # another page (here: about:blank) posting to /logout is refused, and the session
            # survives; the dashboard's own sign-out button works
            await page.goto("about:blank")
            await page.set_content(
                f'<form method="post" action="{served.url}/logout"><button>go</button></form>'
            )
            async with page.expect_navigation():
                await page.click("button")
            assert "cross-site request refused" in await page.content()
            await page.goto(served.url + "/runs")
            assert "/login" not in page.url
            async with page.expect_navigation(url="**/login"):
                await page.click("form[action='/logout'] button")
            await page.goto(served.url + "/runs")
            assert "/login" in page.url
        finally:
            await context.close()
