"""`nightcrew serve` against clients that never finish their request: each is closed within
the read timeout, `/health` answers throughout, and with a low descriptor limit the server
neither runs out of descriptors nor floods stderr."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_cli import _env, _nightcrew
from tests.support.browser import serve_on_a_free_port

pytestmark = pytest.mark.acceptance

READ_TIMEOUT = 3.0


@contextmanager
def _serve(
    db_url: str, tmp_path: Path, *, prefix: tuple[str, ...] = (), **env: str
) -> Iterator[tuple[str, list[str]]]:
    proc, port = serve_on_a_free_port(
        [*prefix, _nightcrew(), "serve", "--host", "127.0.0.1"],
        _env(
            DATABASE_URL=db_url,
            NIGHTCREW_DATA_DIR=str(tmp_path / "data"),
            STORAGE_URL="memory://",
            NIGHTCREW_HTTP_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT),
            **env,
        ),
    )
    lines: list[str] = []
    drain = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    drain.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, lines
                time.sleep(0.1)
        yield url, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(timeout=5)


def _half_sent(port: int, count: int) -> list[tuple[socket.socket, float]]:
    """``count`` connections, each holding part of a request: headers without their end, or a
    body shorter than its Content-Length."""
    held = []
    for n in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if n % 2:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        else:
            s.sendall(
                b"POST /reconcile HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n0123"
            )
        held.append((s, time.monotonic()))
    return held


def _closed_after(s: socket.socket, opened: float) -> float | None:
    """Seconds from its opening until the server closed the connection (an answer to the part
    already sent may come first: POST /reconcile refuses a missing bearer before its body);
    None if it was still open READ_TIMEOUT + 5 s after."""
    s.settimeout(0.5)
    deadline = opened + READ_TIMEOUT + 5
    try:
        while time.monotonic() < deadline:
            try:
                if s.recv(65536) == b"":
                    return time.monotonic() - opened
            except TimeoutError:
                continue
            except ConnectionResetError:
                return time.monotonic() - opened
        return None
    finally:
        s.close()


def _probe_health(url: str, seconds: float) -> list[float]:
    """How long /health took, every 0.2 s for ``seconds``, each on a new connection."""
    took = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        answer = httpx.get(f"{url}/health", timeout=10)
        took.append(time.monotonic() - started)
        assert answer.status_code == 200
        time.sleep(0.2)
    return took


def test_half_sent_requests_are_closed_within_the_read_timeout_and_health_answers(
    fresh_db_url: str, tmp_path: Path
) -> None:
    with _serve(fresh_db_url, tmp_path) as (url, lines):
        port = int(url.rsplit(":", 1)[1])
        held = _half_sent(port, 300)
        took = _probe_health(url, READ_TIMEOUT + 1)
        closed_after = [_closed_after(s, opened) for s, opened in held]
    assert max(took) < 1.5, max(took)
    still_open = [c for c in closed_after if c is None]
    assert not still_open, f"{len(still_open)} of 300 half-sent connections were never closed"
    assert max(c for c in closed_after if c is not None) < READ_TIMEOUT + 3.0
    events = [line for line in lines if "http_slow_clients_closed" in line]
    assert 1 <= len(events) <= 2, lines[-5:]  # once per minute, with the count


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
def test_under_a_low_descriptor_limit_health_answers_and_stderr_stays_quiet(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """500 half-sent connections against a server limited to 256 descriptors: it keeps its
    connections under the limit by closing the oldest waiting one for each new one, so
    `/health` answers all the while; stderr holds a few lines, not one traceback per refused
    accept. (A burst can still run the descriptors out once before the closes it caused are
    done: asyncio then pauses accepting for 1 s, said in one http_accept_failed line.)"""
    with _serve(fresh_db_url, tmp_path, prefix=("prlimit", "--nofile=256:256")) as (url, lines):
        port = int(url.rsplit(":", 1)[1])
        held = _half_sent(port, 500)
        took = _probe_health(url, 3)
        for s, _ in held:
            s.close()
    assert max(took) < 2.5, (took, lines[:20])
    assert sorted(took)[len(took) // 2] < 0.5, took
    assert len(lines) < 20, lines[:20]
    assert not [line for line in lines if "Traceback" in line], lines
    assert any("http_slow_clients_closed" in line for line in lines), lines


def test_a_client_that_stops_reading_is_cut_off_after_the_read_timeout(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """2,000 pipelined requests for /openapi.json, none of the answers read: once the unread
    answers fill the buffers, the connection is aborted within the read timeout — the rest is
    never sent — and /health answers meanwhile."""
    with _serve(fresh_db_url, tmp_path) as (url, lines):
        port = int(url.rsplit(":", 1)[1])
        one = httpx.get(f"{url}/openapi.json").content
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        request = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        s.sendall(request * 2000)
        took = _probe_health(url, READ_TIMEOUT + 4)
        received = 0
        s.settimeout(5)
        try:
            while chunk := s.recv(65536):
                received += len(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        finally:
            s.close()
    assert max(took) < 1.5, took
    assert received < 2000 * len(one) // 2, (received, 2000 * len(one))
    assert any("the client stopped reading" in line for line in lines), lines[-5:]
