"""Structured JSON events on stderr.

``event(name, **fields)`` is the only way jobs report what happened; the name is the spec's
event name and tests assert it. stdout is left to reports, so ``--json`` output stays parseable.

Secrets never reach a log line: fields whose names look secret are masked, and every configured
secret value is scrubbed from every string field wherever it appears (an exception message that
echoes a URL with a token in it, say).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import structlog

_SECRET_FIELD = re.compile(r"(secret|token|password|passwd|authorization|api_key|apikey)", re.I)
_TOKEN_COUNT = re.compile(r"tokens$", re.I)
# scheme://[user]:password@ — the user may be empty (`redis://:pw@host`, Redis before ACLs),
# and the password runs to the last "@" of the authority (an unencoded "@" in it is common)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://[^:/@\s]*):[^\s/]+@", re.I)
REDACTED = "[redacted]"


def redact_url_passwords(text: str) -> str:
    """``scheme://user:[redacted]@host…`` for every URL with a password in ``text``."""
    return _URL_PASSWORD.sub(r"\g<scheme>:" + REDACTED + "@", text)


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

_logger = structlog.get_logger("nightcrew")


# A secret cut by a truncation ("…Bearer re_live_ab" at character 200) is still most of it:
# a text that ends in at least this much of a secret's beginning loses that end too.
_CUT_SECRET_MIN = 8


class SecretValues:
    """The configured secrets' values, replaced wherever they appear in a text — whole, or cut
    at the text's end by a truncation. (Not URL passwords: a stored feed URL keeps its own.)"""

    def __init__(self, secrets: Iterable[str] = (), *, shortest: int = 4) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= shortest}, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def redact(self, text: str) -> str:
        for secret in self._secrets:  # the longest first
            if secret in text:
                text = text.replace(secret, REDACTED)
        for secret in self._secrets:
            # also when it appeared whole earlier: an error quoting a key twice, then cut
            if len(secret) > _CUT_SECRET_MIN and text[-_CUT_SECRET_MIN:] in secret:
                for cut in range(len(secret) - 1, _CUT_SECRET_MIN - 1, -1):
                    if text.endswith(secret[:cut]):
                        text = text[:-cut] + REDACTED
                        break
        return text


class SecretScrubber:
    """A structlog processor that masks secret-named fields and scrubs known secret values."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._values = SecretValues(secrets)

    def __call__(
        self, logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in list(event_dict.items()):
            if key != "event" and value is not None and _SECRET_FIELD.search(key):
                if _TOKEN_COUNT.search(key) and isinstance(value, int | float):
                    continue  # a count of a model's tokens (aiPromptTokens), not a token
                event_dict[key] = REDACTED
            else:
                event_dict[key] = self._scrub(value)
        return event_dict

    def text(self, value: str) -> str:
        """Scrub one line meant for a person (the CLI's error line)."""
        scrubbed: str = self._scrub(value)
        return scrubbed

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return redact_url_passwords(self._values.redact(value))
        if isinstance(value, dict):
            return {k: self._scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub(v) for v in value]
        return value


class _StdlibJSON(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler through which other libraries' logging (uvicorn's "Invalid HTTP request
    received", the connection pool's multi-line warnings) reaches stderr as one JSON line."""


def _route_stdlib_logging(level: str, scrubber: SecretScrubber, stream: TextIO) -> None:
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            scrubber,  # after the traceback is text: a secret in it is scrubbed too
            structlog.processors.JSONRenderer(default=str, sort_keys=False),
        ],
    )
    handler = _StdlibJSON(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not isinstance(h, _StdlibJSON)] + [handler]
    root.setLevel(max(_LEVELS.get(level, logging.INFO), logging.INFO))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "psycopg", "psycopg.pool"):
        library = logging.getLogger(name)
        library.handlers = []  # uvicorn installs its own plain-text handlers
        library.propagate = True
    # one line per HTTP request (a feed, a page, a model call) would drown the events that say
    # what happened; nightcrew logs those outcomes itself
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # aio-pika and aiormq log every failed connect and reconnect themselves ("error when
    # creating transport", "Reconnecting after 5 seconds"), each a second line beside
    # nightcrew's own: the one-line "cannot reach RabbitMQ" at start-up, the worker's
    # news.broker_* events and the effects' retries afterwards. At debug level they are kept.
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.NOTSET if level == "debug" else logging.CRITICAL)


def configure_logging(
    level: str = "info", secrets: Iterable[str] = (), *, stream: TextIO | None = None
) -> None:
    """Set up the JSON pipeline once per process (structlog's configuration is process-wide);
    the standard library's loggers go through it too, so every line is one JSON object.
    The lines go to stderr, or to ``stream`` (the demo keeps its events in a file)."""
    stream = stream if stream is not None else sys.stderr
    _route_stdlib_logging(level, SecretScrubber(secrets), stream)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            structlog.processors.format_exc_info,
            SecretScrubber(secrets),  # after the traceback is text: a secret in it is scrubbed
            structlog.processors.JSONRenderer(default=str, sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def event(name: str, **fields: Any) -> None:
    """Log one named event at info level."""
    _logger.info(name, **fields)


def warning(event: str, **fields: Any) -> None:
    """Log one named event that an operator should look at."""
    _logger.warning(event, **fields)


def error(event: str, **fields: Any) -> None:
    """Log one named failure event."""
    _logger.error(event, **fields)


def describe_error(exc: BaseException) -> str:
    """A one-line, secret-free description of an exception for events and reports."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
