"""One rooted hierarchy for every failure nightcrew translates at its edges.

Adapters catch their driver's exceptions and raise one of these ``from`` the original, so core
code and the doors (CLI, HTTP) never need to know which driver is underneath.
"""

from __future__ import annotations


class NightcrewError(Exception):
    """Base of every error nightcrew raises on purpose."""


class ConfigError(NightcrewError):
    """The configuration (environment or flags) is unusable; the message names the setting."""


class DatabaseUnavailableError(NightcrewError):
    """PostgreSQL could not be reached; the message names the host, never the password.

    ``silent``: nothing answered in time (a statement's deadline, the pool's checkout): the
    database itself is gone or frozen, not one session cut under a job."""

    def __init__(self, message: str, *, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent


class QueryError(NightcrewError):
    """PostgreSQL refused a statement. ``sqlstate`` is its five-character error code. (Here,
    not beside the driver: the command line catches it without importing psycopg.)"""

    def __init__(self, message: str, *, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class MigrationError(NightcrewError):
    """A migration could not be applied, or an applied one was edited afterwards."""


class QueueError(NightcrewError):
    """A queue backend refused or failed a send."""


class QueueUnavailableError(QueueError):
    """The queue backend could not be reached at start-up; the message names where."""


class QueueMisconfiguredError(QueueError):
    """The queue itself cannot be used — its table missing, the broker refusing the queue
    (access refused, not found, declared otherwise): no retry will help until someone fixes
    the configuration, so a sweep says so once and stops sending."""


class StoreError(NightcrewError):
    """The object store failed an operation."""


class FetchError(NightcrewError):
    """An outbound fetch of an untrusted address failed (network, protocol, redirects); the
    message is one line, driver-neutral, and names the cause."""


class BillingError(NightcrewError):
    """Stripe failed an operation. ``http_status`` is Stripe's answer, None if there was none."""

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


# SQLSTATEs of a schema that is not there (undefined table, undefined schema): the database was
# never migrated, or is not the one meant.
SCHEMA_MISSING_SQLSTATES = ("42P01", "3F000")
MIGRATE_HINT = "the database lacks nightcrew's schema: run `nightcrew db migrate` first"
