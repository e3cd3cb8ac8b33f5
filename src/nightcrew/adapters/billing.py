"""Stripe, through the official SDK (StripeClient with its async httpx client).

Two operations, both for resuming billing after a paused podcast is reactivated: find a
customer's subscription, and clear its ``pause_collection``. ``STRIPE_API_BASE`` points the
SDK elsewhere (a test server). Errors become ``BillingError`` with the HTTP status when there
is one, so callers can tell a 5xx from a 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from nightcrew.errors import BillingError

if TYPE_CHECKING:
    import stripe

REQUEST_TIMEOUT_SECONDS = 20
# The SDK retries connection errors, 409s and 5xx with backoff and an idempotency key.
MAX_NETWORK_RETRIES = 2


class Billing(Protocol):
    configured: bool

    async def find_subscription_id(self, customer_id: str) -> str | None:
        """The customer's current (not canceled) subscription, newest first; None if none."""
        ...

    async def resume_collection(
        self, subscription_id: str, *, idempotency_key: str | None = None
    ) -> None:
        """Clear ``pause_collection`` so invoices are collected again. Stripe answers a retry
        with the same ``idempotency_key`` (within 24 h) from its record of the first one."""
        ...


class StripeBilling:
    configured = True

    def __init__(
        self,
        api_key: str,
        *,
        api_base: str | None = None,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        max_network_retries: int = MAX_NETWORK_RETRIES,
    ) -> None:
        # imported here: the SDK is ~50 ms of every process's start, and only a platform with
        # STRIPE_SECRET_KEY set ever calls it
        import stripe

        self._stripe_error = stripe.StripeError
        self._http = stripe.HTTPXClient(timeout=timeout)
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": api_base} if api_base else {},
            http_client=self._http,
            max_network_retries=max_network_retries,
        )

    async def find_subscription_id(self, customer_id: str) -> str | None:
        try:
            page = await self._client.v1.subscriptions.list_async(
                params={"customer": customer_id, "limit": 1}
            )
        except self._stripe_error as exc:
            raise _billing_error("listing subscriptions", exc) from exc
        return str(page.data[0].id) if page.data else None

    async def resume_collection(
        self, subscription_id: str, *, idempotency_key: str | None = None
    ) -> None:
        try:
            await self._client.v1.subscriptions.update_async(
                subscription_id,
                params={"pause_collection": ""},
                options={"idempotency_key": idempotency_key} if idempotency_key else None,
            )
        except self._stripe_error as exc:
            raise _billing_error(f"resuming {subscription_id}", exc) from exc

    async def close(self) -> None:
        await self._http.close_async()  # type: ignore[no-untyped-call]


class NoBilling:
    """STRIPE_SECRET_KEY is unset: every resume is skipped, loudly, by the caller."""

    configured = False

    async def find_subscription_id(self, customer_id: str) -> str | None:
        raise BillingError("Stripe is not configured (STRIPE_SECRET_KEY is unset)")

    async def resume_collection(
        self, subscription_id: str, *, idempotency_key: str | None = None
    ) -> None:
        raise BillingError("Stripe is not configured (STRIPE_SECRET_KEY is unset)")


class DryRunBilling:
    """A dry run's billing: configured as the real one, but calls nothing."""

    def __init__(self, configured: bool) -> None:
        self.configured = configured
        self.would_resume: list[str] = []

    async def find_subscription_id(self, customer_id: str) -> str | None:
        return f"(subscription of {customer_id})"

    async def resume_collection(
        self, subscription_id: str, *, idempotency_key: str | None = None
    ) -> None:
        self.would_resume.append(subscription_id)


def is_transient(exc: BillingError) -> bool:
    """Whether retrying may succeed: no answer at all, 408, 409 (a concurrent request with the
    same idempotency key), 429 or a 5xx. Any other 4xx will fail the same way again."""
    status = exc.http_status
    return status is None or status in (408, 409, 429) or status >= 500


def _billing_error(action: str, exc: stripe.StripeError) -> BillingError:
    status = exc.http_status
    detail = exc.user_message or type(exc).__name__
    return BillingError(
        f"Stripe {action} failed" + (f" ({status})" if status else "") + f": {detail}",
        http_status=status,
    )
