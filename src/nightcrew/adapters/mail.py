"""Platform billing mail through Resend's HTTP API.

``POST {RESEND_API_BASE}/emails`` with ``Authorization: Bearer {RESEND_API_KEY}`` and an
``Idempotency-Key`` — the send-once guard: two callers sending the same notice with the same key
get one delivery. The outcome tells the caller whether to claim the stage:

* ``sent``      — 2xx;
* ``transient`` — 408, 409, 429, 5xx, a timeout or a network error: retry later, do not claim;
* ``permanent`` — any other 4xx, or Resend not configured: retrying will not help; claim and
                  move on (a misconfiguration must never stall the escalation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import httpx

from nightcrew.log import describe_error

Outcome = Literal["sent", "transient", "permanent"]
TIMEOUT = httpx.Timeout(15.0, connect=5.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Email:
    to: str
    subject: str
    text: str
    html: str
    idempotency_key: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SendResult:
    outcome: Outcome
    status: int | None = None
    error: str | None = None
    message_id: str | None = None

    @property
    def final(self) -> bool:
        return self.outcome != "transient"


class Mailer(Protocol):
    @property
    def configured(self) -> bool: ...

    async def send(self, email: Email) -> SendResult: ...


class ResendMailer:
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        api_base: str,
        api_key: str | None,
        from_email: str | None,
        timeout: httpx.Timeout = TIMEOUT,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._base = api_base.rstrip("/")
        self._key = api_key
        self._from = from_email

    @property
    def configured(self) -> bool:
        return bool(self._key and self._from)

    async def send(self, email: Email) -> SendResult:
        if not self._key or not self._from:
            return SendResult(
                outcome="permanent",
                error="Resend is not configured (RESEND_API_KEY, RESEND_FROM_EMAIL)",
            )
        try:
            response = await self._client.post(
                f"{self._base}/emails",
                json={
                    "from": self._from,
                    "to": [email.to],
                    "subject": email.subject,
                    "text": email.text,
                    "html": email.html,
                },
                headers={
                    "Authorization": f"Bearer {self._key}",
                    "Idempotency-Key": email.idempotency_key,
                },
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            return SendResult(outcome="transient", error=describe_error(exc))
        status = response.status_code
        if 200 <= status < 300:
            message_id = None
            try:
                message_id = response.json().get("id")
            except ValueError:
                pass
            return SendResult(outcome="sent", status=status, message_id=message_id)
        detail = response.text[:200].strip()
        # 409: Resend is still processing a request with the same Idempotency-Key (our own
        # earlier attempt that timed out) — retry later, like 408, 429 and 5xx.
        outcome: Outcome = (
            "transient" if status in (408, 409, 429) or status >= 500 else "permanent"
        )
        return SendResult(
            outcome=outcome, status=status, error=f"Resend answered {status}: {detail}"
        )


class RecordingMailer:
    """Dry runs and unit tests: records what would be sent, sends nothing."""

    def __init__(self, *, configured: bool = True) -> None:
        self.configured = configured
        self.sent: list[Email] = []

    async def send(self, email: Email) -> SendResult:
        self.sent.append(email)
        return SendResult(outcome="sent", status=None)
