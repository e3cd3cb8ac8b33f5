"""What every job returns: counts for the lane's summary, failures for its errors, details."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from nightcrew.errors import DatabaseUnavailableError
from nightcrew.jsonable import JsonObject
from nightcrew.log import describe_error, error

# One failed item, as the report's ``errors`` and the log write it: {"event": <the spec's event
# name>, "error": <one line>, **ids}.
Failure = JsonObject


class JobReport(Protocol):
    @property
    def errors(self) -> list[Failure]:
        """Items this job could not handle; each was also logged under its event name."""
        ...

    def counts(self) -> dict[str, int]:
        """Counters surfaced at the top of the lane report and in its completion event."""
        ...

    def to_json(self) -> JsonObject: ...


@dataclass
class Item:
    failed: bool = False


@contextmanager
def one_item(errors: list[Failure], event: str, **ids: Any) -> Iterator[Item]:
    """One item's work, isolated: whatever it raises is logged under ``event`` with ``ids``,
    recorded in ``errors``, and does not stop the next item (``item.failed`` says so) — except
    the database going away, which is no item's problem: the lane stops, the next run resumes.
    """
    item = Item()
    try:
        yield item
    except DatabaseUnavailableError:
        raise
    except Exception as exc:
        failure = {"event": event, **ids, "error": describe_error(exc)}
        error(**failure)
        errors.append(failure)
        item.failed = True
