"""The Redis and the RabbitMQ the tests may use, and the one place that reads their addresses.

``NIGHTCREW_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``) and
``NIGHTCREW_TEST_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``); set one to the
empty string or ``off`` and the tests that need that server are skipped, as they are when
nothing answers there. ``REDIS_URL`` and ``QUEUE_URL`` are never read: they configure
nightcrew itself, and a test must not write into the servers a developer pointed it at.

Redis database 15, not 0: the tests add and remove keys nightcrew itself uses (the
processed-URL set), which must not touch a local nightcrew's data in the default database.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

import pytest

REDIS_VARIABLE = "NIGHTCREW_TEST_REDIS_URL"
AMQP_VARIABLE = "NIGHTCREW_TEST_AMQP_URL"
_DEFAULTS = {
    REDIS_VARIABLE: "redis://127.0.0.1:6379/15",
    AMQP_VARIABLE: "amqp://guest:guest@127.0.0.1:5672/",
}
_DEFAULT_PORTS = {"redis": 6379, "amqp": 5672}


def configured(variable: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The URL a test variable names; None when it is set to "" or "off"."""
    value = environ.get(variable, _DEFAULTS[variable]).strip()
    return None if value.lower() in ("", "off") else value


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)


def with_port(url: str, port: int, host: str = "127.0.0.1") -> str:
    """The same URL (credentials, database, vhost) at another address: a proxy in front."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{host}:{port}" if credentials else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def skip_reason(variable: str, url: str | None) -> str | None:
    """Why the tests needing this server cannot run (None: they can)."""
    if url is None:
        return f"{variable} is off"
    host, port = host_port(url)
    try:
        with socket.create_connection((host, port), timeout=1):
            return None
    except OSError:
        return f"nothing answers at {host}:{port} ({variable}; start the server or set it to off)"


# Decided once, at collection. The addresses are "" when off: only tests marked to be skipped
# then read them.
REDIS_URL = configured(REDIS_VARIABLE) or ""
AMQP_URL = configured(AMQP_VARIABLE) or ""
_REDIS_SKIP = skip_reason(REDIS_VARIABLE, configured(REDIS_VARIABLE))
_AMQP_SKIP = skip_reason(AMQP_VARIABLE, configured(AMQP_VARIABLE))
needs_redis = pytest.mark.skipif(_REDIS_SKIP is not None, reason=_REDIS_SKIP or "")
needs_rabbitmq = pytest.mark.skipif(_AMQP_SKIP is not None, reason=_AMQP_SKIP or "")
