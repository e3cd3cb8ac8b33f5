"""`nightcrew serve`'s dashboard rules at the command line: nothing starts that would expose
the page to the network without a token, nor a demo dashboard without a demo."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.acceptance.test_cli import _env, _nightcrew, run

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_serve_beyond_loopback_refuses_to_start_without_a_token(
    fresh_db_url: str, host: str
) -> None:
    # refused before anything binds or connects: the address is never listened on
    result = run("serve", "--host", host, "--port", "9", env=_env(DATABASE_URL=fresh_db_url))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "NIGHTCREW_DASHBOARD_TOKEN" in lines[0] and host in lines[0]


def test_serve_demo_without_a_demo_says_to_run_it(tmp_path: Path) -> None:
    env = _env(NIGHTCREW_DATA_DIR=str(tmp_path / "data"))
    result = run("serve", "--demo", "--port", "9", env=env, timeout=180)
    assert result.returncode == 2, result.stderr
    assert "run `nightcrew demo` first" in result.stderr.strip().splitlines()[-1]


def test_a_database_never_migrated_says_to_migrate(empty_db_url: str) -> None:
    result = run("lifecycle", "run", "minute", env=_env(DATABASE_URL=empty_db_url))
    assert result.returncode == 2, result.stderr
    *events, last = result.stderr.strip().splitlines()
    assert "run `nightcrew db migrate` first" in last, result.stderr
    # the run could not start: spec 000's two events say so, as JSON, before the one line
    assert [json.loads(e)["event"] for e in events] == [
        "lifecycle_cron_started",
        "lifecycle_cron_failed",
    ]


TOKEN = "0123456789abcdef0123456789abcdef-sign-in"


@dataclass
class Served:
    """A running `nightcrew serve`: where it answers, and (once it has stopped) what it logged."""

    base: str
    events: list[dict[str, object]] = field(default_factory=list)

    def refused_clients(self) -> list[object]:
        return [e.get("client") for e in self.events if e.get("event") == "dashboard_login_refused"]


@contextlib.contextmanager
def serving(db_url: str, **env: str) -> Iterator[Served]:
    """`nightcrew serve` on a free loopback port until the block ends; it must stop with 0."""
    from tests.support.browser import serve_on_a_free_port

    proc, port = serve_on_a_free_port(
        [_nightcrew(), "serve"], _env(DATABASE_URL=db_url, **env), within=30
    )
    served = Served(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{served.base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("serve did not answer /health within 30 s")
        yield served
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        served.events.extend(json.loads(x) for x in stderr.splitlines() if x.startswith("{"))


async def _wrong_sign_in(c: httpx.AsyncClient) -> httpx.Response:
    return await c.post("/login", data={"token": "not it", "next": "/"})


async def _wrong_bearer(c: httpx.AsyncClient) -> httpx.Response:
    return await c.post("/reconcile", headers={"Authorization": "Bearer not-the-secret"})


async def _guesses(
    base: str,
    sources: list[str],
    *,
    per_source: int = 10**6,
    seconds: float = 600,
    guess: Callable[[httpx.AsyncClient], Awaitable[httpx.Response]] = _wrong_sign_in,
    on_answer: Callable[[int], None] | None = None,
    until: asyncio.Event | None = None,
) -> tuple[list[tuple[int, float]], float]:
    """Wrong guesses (sign-ins, unless ``guess`` says) from each loopback source address, all
    sources at once, ``per_source`` each or for ``seconds`` (or ``until`` it is set); each
    answer's status and when it came (seconds from the start; ``on_answer`` is told each status
    as it comes), and the whole attack's duration."""
    started = time.monotonic()
    answers: list[tuple[int, float]] = []

    async def one_source(source: str) -> None:
        transport = httpx.AsyncHTTPTransport(local_address=source)
        async with httpx.AsyncClient(transport=transport, base_url=base, timeout=120) as c:
            for _ in range(per_source):
                if time.monotonic() - started > seconds or (until and until.is_set()):
                    break
                response = await guess(c)
                answers.append((response.status_code, time.monotonic() - started))
                if on_answer is not None:
                    on_answer(response.status_code)
                if response.status_code == 429:
                    await asyncio.sleep(0.2)  # told to wait: a patient guesser, not a busy loop

    await asyncio.gather(*(one_source(s) for s in sources))
    return answers, time.monotonic() - started


async def _sign_in_took(base: str, source: str) -> tuple[int, float]:
    started = time.monotonic()
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(transport=transport, base_url=base, timeout=120) as c:
        response = await c.post("/login", data={"token": TOKEN, "next": "/"})
    return response.status_code, time.monotonic() - started


@pytest.mark.slow
async def test_sign_in_guesses_are_answered_at_most_twice_a_second(fresh_db_url: str) -> None:
    """40 wrong sign-ins from 20 addresses, 20 at a time; then 20 at a time from one address.
    No more than ~2 answered a second either way, and the right token still gets in: during
    the attack from another address, and afterwards from the guessing address itself."""
    with serving(fresh_db_url, NIGHTCREW_DASHBOARD_TOKEN=TOKEN) as served:
        base = served.base
        # 20 addresses on 20 networks (/24s): one network holds at most 8 places at a time
        sources = [f"127.0.{i}.2" for i in range(2, 22)]
        attack = asyncio.create_task(_guesses(base, sources, per_source=2))
        await asyncio.sleep(2)
        during = await _sign_in_took(base, "127.0.0.99")
        answers, took = await attack
        wrong = [at for status, at in answers if status == 401]
        assert len(wrong) == 40 and {s for s, _ in answers} == {401}
        rate = len(wrong) / took
        print(f"\n20 addresses, 20 at a time: {len(wrong)} answered in {took:.1f} s = {rate:.2f}/s")
        assert rate <= 2.5
        # the operator waited at most one turn per address guessing at that moment
        print(f"the right token during it, another address: {during[0]} after {during[1]:.1f} s")
        assert during[0] == 303 and during[1] < len(sources) * 0.5 + 2, during

        one = ["127.0.0.1"] * 20
        answers, took = await _guesses(base, one, seconds=10)
        checked = [at for status, at in answers if status == 401]
        busy = [at for status, at in answers if status == 429]
        rate = len(checked) / took
        print(f"one address, 20 at a time: {len(checked)} answered, {len(busy)} busy (429, not")
        print(f"checked) in {took:.1f} s = {rate:.2f} answered/s")
        assert rate <= 2.5 and len(checked) + len(busy) == len(answers)
        status, waited = await _sign_in_took(base, "127.0.0.1")
        print(f"the right token afterwards, same address: {status} after {waited:.1f} s")
        assert status == 303 and waited <= 8 + 1  # at most the address's capped backoff


async def test_64_guessing_addresses_cannot_keep_the_operator_out(fresh_db_url: str) -> None:
    """64 addresses guess the sign-in token without pause; the operator, from an address that
    has not been guessing, signs in within 5 s (a first-come queue made them wait 32 s, or
    answered 429 while the 64 held every slot)."""
    with serving(fresh_db_url, NIGHTCREW_DASHBOARD_TOKEN=TOKEN) as served:
        sources = [f"127.0.0.{i}" for i in range(2, 66)]
        checked_and_refused = 0
        failed_often = asyncio.Event()

        def answered(status: int) -> None:
            nonlocal checked_and_refused
            checked_and_refused += status == 401
            if checked_and_refused >= 6:
                failed_often.set()

        done = asyncio.Event()  # the wave goes on until the operator's three sign-ins are done
        attack = asyncio.create_task(
            _guesses(served.base, sources, seconds=120, on_answer=answered, until=done)
        )
        await asyncio.wait_for(failed_often.wait(), 8)  # their network has failed, many times
        tries = []
        for source in ("127.0.1.1", "127.0.1.2", "127.0.1.3"):
            tries.append(await _sign_in_took(served.base, source))
        assert not attack.done()  # every try was made amid the wave
        done.set()
        answers, took = await attack
    print(f"\nthe right token during 64 guessers: {tries}")
    assert all(status == 303 and waited < 5.0 for status, waited in tries), tries
    checked = [at for status, at in answers if status == 401]
    assert len(checked) / took <= 2.5  # the overall rate held


@pytest.mark.slow
async def test_the_browser_that_signed_in_before_goes_before_a_wave_from_fresh_networks(
    fresh_db_url: str,
) -> None:
    """64 fresh networks (/24s) each send a first wrong token at once. Each ranks with an
    operator on a new browser, who waits behind the wave (about 0.5 s a guess); the browser
    the operator signed in from before carries its device cookie (path /login, kept past
    sign-out) and signs in from yet another network within 2 s, ahead of the new browser
    that asked first."""
    with serving(fresh_db_url, NIGHTCREW_DASHBOARD_TOKEN=TOKEN) as served:
        transport = httpx.AsyncHTTPTransport(local_address="127.0.200.1")
        async with httpx.AsyncClient(transport=transport, base_url=served.base) as c:
            first = await c.post("/login", data={"token": TOKEN, "next": "/"})
        assert first.status_code == 303
        device = first.cookies["nightcrew_device"]
        assert "path=/login" in first.headers.get_list("set-cookie")[1].lower()

        sources = [f"127.{i}.0.2" for i in range(10, 74)]
        attack = asyncio.create_task(_guesses(served.base, sources, per_source=1))
        await asyncio.sleep(1)  # every first guess is queued
        new_browser = asyncio.create_task(_sign_in_took(served.base, "127.0.201.1"))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        transport = httpx.AsyncHTTPTransport(local_address="127.0.202.1")
        async with httpx.AsyncClient(
            transport=transport, base_url=served.base, cookies={"nightcrew_device": device}
        ) as c:
            again = await c.post("/login", data={"token": TOKEN, "next": "/"})
        waited = time.monotonic() - started
        # the new browser, which asked first: still behind the wave, or told 429 (every place
        # was taken and no guess to push out had failed yet)
        kept_out = not new_browser.done() or new_browser.result()[0] == 429
        for task in (attack, new_browser):
            task.cancel()
        await asyncio.gather(attack, new_browser, return_exceptions=True)
    print(
        f"\nknown device during a wave of 64 first guesses: {again.status_code} in {waited:.2f} s"
    )
    assert again.status_code == 303 and waited < 2.0, waited
    assert kept_out


@pytest.mark.slow
async def test_reconcile_bearer_guesses_are_throttled_and_each_logged(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """40 wrong bearers on POST /reconcile from 20 addresses, 20 at a time: about two checked
    a second, each logged as reconcile_auth_failed with its client; the right bearer, from
    another address, still gets the reconciler's report."""
    secret = "0123456789abcdef0123456789abcdef-reconcile"
    env = {
        "RECONCILER_SECRET": secret,
        "R2_PUBLIC_URL": "https://media.example",
        "STORAGE_URL": "memory://",
        "NIGHTCREW_DATA_DIR": str(tmp_path),
    }
    with serving(fresh_db_url, **env) as served:
        # 20 addresses on 20 networks (/24s): one network holds at most 8 places at a time
        sources = [f"127.0.{i}.2" for i in range(2, 22)]
        answers, took = await _guesses(served.base, sources, per_source=2, guess=_wrong_bearer)
        transport = httpx.AsyncHTTPTransport(local_address="127.0.1.1")
        async with httpx.AsyncClient(transport=transport, base_url=served.base, timeout=60) as c:
            right = await c.post("/reconcile", headers={"Authorization": f"Bearer {secret}"})
    refused = [at for status, at in answers if status == 401]
    assert len(refused) == 40 and {s for s, _ in answers} == {401}
    print(f"\n40 wrong bearers from 20 addresses: {len(refused) / took:.2f} checked a second")
    assert len(refused) / took <= 2.5
    logged = [e for e in served.events if e.get("event") == "reconcile_auth_failed"]
    assert len(logged) == 40
    assert {e["client"] for e in logged} == set(sources)  # each address, each logged
    assert right.status_code == 200, right.text
    assert right.json()["options"]["mode"] == "dryrun"


def test_run_shard_now_on_the_demo_dashboard_fetches_the_demo_feeds(tmp_path: Path) -> None:
    """`serve --demo`'s "Run now" for the demo's news shard: the sample feeds are served
    again on loopback and allowed, so the run fetches both without a refusal, and nothing
    counts towards parking them (the button used to fail on the loopback refusal)."""
    import re

    from tests.support.browser import demo_served

    with demo_served(tmp_path / "data") as served, httpx.Client(base_url=served.url) as c:
        page = c.get("/runs")
        assert page.status_code == 200 and "news:demo" in page.text
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        clicked = datetime.now(UTC)
        started = c.post("/runs/run-now", data={"csrf": token[1], "lane": "news:demo"})
        assert started.status_code == 303, started.text
        report_url = started.headers["location"] + "/report.json"
        deadline = time.monotonic() + 60
        report = None
        while report is None and time.monotonic() < deadline:
            report = c.get(report_url).json()  # null until the run has finished
            time.sleep(0.3)
        run_page = c.get(started.headers["location"]).text
        sources = c.get("/news").text
        # the embedded server runs while `serve --demo` does: when each source was fetched
        with psycopg.connect(
            host=str(served.data_dir / "pg"), dbname="nightcrew_demo", user="postgres"
        ) as conn:
            fetched = conn.execute(
                "SELECT name, last_fetched_at, consecutive_failures FROM news.sources"
                " WHERE shard = 'demo' AND parked_at IS NULL ORDER BY name"
            ).fetchall()
    assert report is not None, "the run did not finish within 60 s"
    assert "manual" in run_page
    assert report["fetchErrors"] == [], report
    # both sample feeds fetched by this run, none failing (the demo's own runs wrote their
    # articles: nothing new)
    assert [(name, failures) for name, _, failures in fetched] == [
        ("City desk", 0),
        ("Science desk", 0),
    ]
    assert all(at is not None and at > clicked for _, at, _ in fetched), (clicked, fetched)
    assert report["skipped"] is False, report
    assert "refused" not in sources.split("Wire (office)")[0], sources
