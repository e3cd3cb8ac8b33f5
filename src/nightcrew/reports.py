"""What every job returns: counts for the lane's summary, failures for its errors, details."""

from __future__ import annotations

from typing import Any, Protocol

# One failed item: {"event": <the spec's event name>, "error": <one line>, **ids}.
Failure = dict[str, Any]


class JobReport(Protocol):
    @property
    def errors(self) -> list[Failure]:
        """Items this job could not handle; each was also logged under its event name."""
        ...

    def counts(self) -> dict[str, int]:
        """Counters surfaced at the top of the lane report and in its completion event."""
        ...

    def to_json(self) -> dict[str, Any]: ...
