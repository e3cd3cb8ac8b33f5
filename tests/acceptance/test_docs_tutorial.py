"""The tutorial's commands (docs/tutorial.md), run in order as a reader runs them, against this
test's own empty database and data directory.

The rules, visible here and nowhere else:

- only ```` ```console ```` blocks count; in them a line that starts with ``$ `` is a command,
  and the other lines are what it prints (ignored, except the JSON a ``curl`` prints, which is
  compared with the answer);
- ``export NAME=VALUE`` sets NAME for the commands after it — except ``DATABASE_URL``: every
  command runs against this test's empty database, whatever the tutorial exports;
- ``nightcrew …`` must exit 0. ``nightcrew serve …`` runs on a free port (the tutorial's 8787 is
  replaced in the ``curl`` URLs after it) until the next ``nightcrew`` command or the end; it must
  answer ``/health`` meanwhile and exit 0 on SIGTERM;
- ``curl [-s] URL`` asks the running ``serve`` and must get a 2xx;
- the feed a ``news sources add`` names is replaced by one this test serves on 127.0.0.1
  (``NEWS_ALLOWED_PRIVATE_HOSTS=127.0.0.1`` lets the runs fetch it): the tests reach no internet;
- any other command fails the test: a console block holds only what this test can run.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from werkzeug import Request, Response

from tests.acceptance.test_cli import _env, _nightcrew
from tests.support.servers import RecordingServer

pytestmark = pytest.mark.acceptance

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
# what the tutorial must keep walking through, whatever else it says
THE_WAY = ("demo", "serve --demo", "db migrate", "db check", "serve", "news sources add")


@dataclass(frozen=True)
class Step:
    command: str
    prints: list[str] = field(default_factory=list)  # the lines shown after it


def tutorial_steps(text: str) -> Iterator[Step]:
    for block in re.findall(r"^```console\n(.*?)^```", text, re.S | re.M):
        command: str | None = None
        prints: list[str] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command is not None:
                    yield Step(command, prints)
                command, prints = line[2:].strip(), []
            elif command is not None:
                prints.append(line)
        if command is not None:
            yield Step(command, prints)


def _feed(base: str) -> bytes:
    items = "".join(
        f"<item><title>Story {n}: the council approves the river bridge</title>"
        f"<link>{base}/articles/story-{n}</link>"
        f"<description>A long enough summary of story {n}, for the offline rules.</description>"
        "</item>"
        for n in range(3)
    )
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>Local</title>'
        f"{items}</channel></rss>"
    ).encode()


class Tutorial:
    """The reader's shell: its environment, and the `serve` running in it, if any."""

    def __init__(self, env: dict[str, str], cwd: Path, feed: str) -> None:
        self.env, self.cwd, self.feed = env, cwd, feed
        self.serving: tuple[subprocess.Popen[str], int] | None = None

    def run(self, step: Step) -> None:
        argv = shlex.split(step.command)
        if argv[0] == "export":
            for assignment in argv[1:]:
                name, _, value = assignment.partition("=")
                if name != "DATABASE_URL":
                    self.env[name] = value
        elif argv[0] == "nightcrew":
            self.stop()
            self.nightcrew(argv[1:])
        elif argv[0] == "curl":
            self.curl(argv[1:], step.prints)
        else:
            pytest.fail(f"the tutorial's console blocks may run nightcrew, export and curl: {argv}")

    def nightcrew(self, args: list[str]) -> None:
        if args[:2] == ["news", "sources"] and args[2:3] == ["add"]:
            args = [args[0], args[1], args[2], self.feed, *args[4:]]
        if args[0] == "serve":
            self.serve(args)
            return
        done = subprocess.run(
            [_nightcrew(), *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, f"nightcrew {' '.join(args)}: {done.stderr[-2000:]}"

    def serve(self, args: list[str]) -> None:
        from tests.support.browser import serve_on_a_free_port

        if "--port" in args:  # a free port instead
            at = args.index("--port")
            args = args[:at] + args[at + 2 :]
        proc, port = serve_on_a_free_port([_nightcrew(), *args], self.env, within=60)
        self.serving = proc, port
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        pytest.fail(f"nightcrew {' '.join(args)} did not answer /health within 30 s")

    def curl(self, args: list[str], prints: list[str]) -> None:
        [url] = [a for a in args if not a.startswith("-")]
        assert self.serving is not None, f"curl {url}: no nightcrew serve is running"
        parts = urlsplit(url)
        local = urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.serving[1]}"))
        answer = httpx.get(local, timeout=10)
        assert answer.is_success, f"curl {url}: {answer.status_code} {answer.text[:500]}"
        if prints and prints[0].startswith("{"):
            assert answer.json() == json.loads(prints[0]), f"curl {url} printed {answer.text}"

    def stop(self) -> None:
        if self.serving is None:
            return
        proc, _ = self.serving
        self.serving = None
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"serve exited {proc.returncode}: {stderr[-2000:]}"


def test_the_tutorial_reads_as_the_way_in() -> None:
    commands = [s.command for s in tutorial_steps(TUTORIAL.read_text(encoding="utf-8"))]
    ran = [c.removeprefix("nightcrew ") for c in commands if c.startswith("nightcrew ")]
    for way in THE_WAY:
        assert any(c == way or c.startswith(way + " ") for c in ran), f"the tutorial lacks {way}"
    assert ran.index("demo") < ran.index("db migrate") < ran.index("news run --shard tutorial")


@pytest.mark.slow
def test_the_tutorials_commands_run(
    tmp_path: Path, empty_db_url: str, feed_server: RecordingServer
) -> None:
    def respond(request: Request) -> Response:
        if request.path == "/feed.xml":
            return Response(_feed(feed_server.url), content_type="application/rss+xml")
        return Response(status=404)

    feed_server.responder = respond
    env = _env(
        NIGHTCREW_DATA_DIR=str(tmp_path / "data"),
        DATABASE_URL=empty_db_url,
        NEWS_ALLOWED_PRIVATE_HOSTS="127.0.0.1",
    )
    shell = Tutorial(env, tmp_path, f"{feed_server.url}/feed.xml")
    steps = list(tutorial_steps(TUTORIAL.read_text(encoding="utf-8")))
    try:
        for step in steps:
            shell.run(step)
    finally:
        shell.stop()
    # the first news source was fetched, as the tutorial says
    assert any(r.path == "/feed.xml" for r in feed_server.requests)
