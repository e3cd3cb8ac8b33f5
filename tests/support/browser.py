"""A real browser on the dashboard: the demo's night served by `nightcrew serve --demo`, and
Debian's Chromium driven by Playwright (no browser download: ``executable_path``).

Chromium starts with its background networking off, so it opens no connection but the ones the
page asks for — and the pages ask only for 127.0.0.1 (the dashboard has no external asset).

Also a command: ``python -m tests.support.browser docs/dashboard.png`` runs the demo in a
temporary directory, serves it, and saves the README's screenshots (the overview, a run, and
the effects page with its actions: ``dashboard-actions.png``).
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from tests.acceptance.test_cli import _env, _nightcrew
from tests.support.servers import free_port

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
]


def chromium_path() -> str | None:
    """NIGHTCREW_TEST_CHROMIUM, else the first Chromium installed; None when there is none."""
    configured = os.environ.get("NIGHTCREW_TEST_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    return next((p for p in CHROMIUM_CANDIDATES if Path(p).exists()), None)


@dataclass(frozen=True)
class Served:
    url: str
    data_dir: Path


PORT_TRIES = 5


def serve_on_a_free_port(
    command: list[str], environ: dict[str, str], *, within: float = 60
) -> tuple[subprocess.Popen[str], int]:
    """``command --port N`` started on a free loopback port and listening. A port found free can
    be taken by another test's server before this one binds it ("Address already in use"):
    then another port, up to PORT_TRIES times; any other exit is an error with its stderr."""
    for _ in range(PORT_TRIES):
        port = free_port()
        proc = subprocess.Popen(
            [*command, "--port", str(port)],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                stderr = proc.stderr.read() if proc.stderr else ""
                if "Address already in use" in stderr:
                    break  # lost the race for the port: another one
                raise RuntimeError(f"{' '.join(command[1:])} exited: {stderr}")
            with socket.socket() as probe:
                probe.settimeout(0.5)
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return proc, port
            time.sleep(0.2)
        else:
            proc.kill()
            proc.communicate()
            raise RuntimeError(f"{' '.join(command[1:])} did not listen within {within:g} s")
    raise RuntimeError(f"no free port held after {PORT_TRIES} tries")


@contextmanager
def demo_served(data_dir: Path, **env: str) -> Iterator[Served]:
    """`nightcrew demo`, then `nightcrew serve --demo` on a free loopback port until exit."""
    cmd = [_nightcrew()]
    # the acceptance tests' environment: no nightcrew setting of the caller's shell but these
    environ = _env(NIGHTCREW_DATA_DIR=str(data_dir), NIGHTCREW_LOG_LEVEL="warning", **env)
    demo = subprocess.run([*cmd, "demo"], env=environ, capture_output=True, text=True, timeout=240)
    if demo.returncode != 0:
        raise RuntimeError(f"nightcrew demo failed: {demo.stderr.strip()[-2000:]}")
    proc, port = serve_on_a_free_port([*cmd, "serve", "--demo"], environ)
    try:
        yield Served(url=f"http://127.0.0.1:{port}", data_dir=data_dir)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def png_colours(png: bytes, sample: int = 4) -> dict[tuple[int, ...], int]:
    """How many (sampled: one pixel in every ``sample`` by ``sample`` block) pixels of each
    colour a PNG has — enough to tell a rendered page from a blank one."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    with Image.open(io.BytesIO(png)) as image:
        rgb = image.convert("RGB")
    width, height = max(1, rgb.width // sample), max(1, rgb.height // sample)
    sampled = rgb.resize((width, height), Image.Resampling.NEAREST)
    return {colour: count for count, colour in sampled.getcolors(maxcolors=width * height)}


def assert_not_blank(png: bytes) -> None:
    colours = png_colours(png)
    total = sum(colours.values())
    background = max(colours.values())
    assert len(colours) >= 8, f"only {len(colours)} colour(s): a blank page"
    assert background / total < 0.97, "almost every pixel is the background: a blank page"


async def screenshot(url: str, out: Path, *, width: int = 1280, height: int = 900) -> None:
    from playwright.async_api import async_playwright

    executable = chromium_path()
    if executable is None:
        raise RuntimeError("no Chromium: apt-get install -y chromium")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": width, "height": height})
            await page.goto(url)
            out.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(out), full_page=False)
        finally:
            await browser.close()


def main() -> None:
    import asyncio

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png").resolve()
    with tempfile.TemporaryDirectory(prefix="nightcrew-screenshot-") as tmp:
        with demo_served(Path(tmp)) as served:
            asyncio.run(screenshot(served.url + "/", target))
            asyncio.run(screenshot(served.url + "/runs/2", target.with_name("dashboard-run.png")))
            # the actions: the dead effects' Retry / Drop buttons, "Retry all dead…" per kind
            actions = target.with_name("dashboard-actions.png")
            asyncio.run(screenshot(served.url + "/effects", actions, height=1000))
    for saved in (target, target.with_name("dashboard-run.png"), actions):
        assert_not_blank(saved.read_bytes())
    print(f"saved {target}, {target.with_name('dashboard-run.png')} and {actions}")


if __name__ == "__main__":
    main()
