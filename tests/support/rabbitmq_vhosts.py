"""A RabbitMQ vhost of a test's own, with the permissions the test gives its user: how a test
makes a real broker refuse a queue (ACCESS_REFUSED) without touching anyone else's queues."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support.services import AMQP_URL


def vhost_url(vhost: str) -> str:
    """The test broker's URL, on ``vhost``."""
    return urlunsplit(urlsplit(AMQP_URL)._replace(path="/" + vhost))


def open_channels(vhost: str) -> int:
    """The channels the broker has open on ``vhost``'s connections, all together."""
    done = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "--no-table-headers", "vhost", "channels"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [line.split("\t") for line in done.stdout.splitlines() if line.strip()]
    return sum(int(n) for v, n in rows if v == vhost)


@contextlib.contextmanager
def rabbitmq_vhost(vhost: str, *, configure: str) -> Iterator[None]:
    """A RabbitMQ vhost of the test's own, where the test user may configure (declare) only the
    queues ``configure`` matches and write and read everything; deleted afterwards. Made with
    rabbitmqctl, on the broker's own machine: skipped, with the reason, where it cannot be."""
    if urlsplit(AMQP_URL).hostname not in ("127.0.0.1", "localhost", "::1"):
        pytest.skip("rabbitmqctl acts on this machine's broker; the test broker is elsewhere")
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl is not on PATH: a vhost with refused queues cannot be made")
    user = urlsplit(AMQP_URL).username or "guest"

    def ctl_run(*args: str) -> None:
        done = subprocess.run([ctl, *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            pytest.skip(f"rabbitmqctl {args[0]} failed: {done.stderr.strip()[:200]}")

    ctl_run("add_vhost", vhost)
    try:
        ctl_run("set_permissions", "-p", vhost, user, configure, ".*", ".*")
        yield
    finally:
        subprocess.run([ctl, "delete_vhost", vhost], capture_output=True, timeout=60)
