"""The feed worker's cache-invalidation endpoint.

``POST {PUBLIC_FEED_URL}/_internal/invalidate`` with ``Authorization: Bearer
{RSS_INVALIDATION_SECRET}`` and body ``{"id": podcast_id}``. ``?wait=1`` is the confirmable
lane: the worker answers 2xx only after the cache entry is gone. Only a 2xx confirms; anything
else — another status, a timeout, a refused connection, no configuration — is a failure the
caller reports and retries later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import httpx

from nightcrew.log import describe_error

INVALIDATE_PATH = "/_internal/invalidate"
# The wait=1 lane refreshes a snapshot before answering; give it longer than a plain purge.
TIMEOUT = httpx.Timeout(10.0, connect=5.0)
WAIT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Invalidation:
    ok: bool
    status: int | None = None
    error: str | None = None
    # Retrying will not help: not configured, or a 4xx other than 408/409/429.
    permanent: bool = False


class FeedCache(Protocol):
    async def invalidate(self, podcast_id: str, *, wait: bool = False) -> Invalidation: ...


class HttpFeedCache:
    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str | None,
        secret: str | None,
        *,
        timeout: httpx.Timeout = TIMEOUT,
        wait_timeout: httpx.Timeout = WAIT_TIMEOUT,
    ) -> None:
        self._client = client
        self._base = base_url.rstrip("/") if base_url else None
        self._secret = secret
        self._timeout = timeout
        self._wait_timeout = wait_timeout

    @property
    def configured(self) -> bool:
        return bool(self._base and self._secret)

    async def invalidate(self, podcast_id: str, *, wait: bool = False) -> Invalidation:
        if not self._base or not self._secret:
            return Invalidation(
                ok=False,
                permanent=True,
                error="feed cache not configured (PUBLIC_FEED_URL and "
                "RSS_INVALIDATION_SECRET are both needed)",
            )
        try:
            response = await self._client.post(
                self._base + INVALIDATE_PATH,
                params={"wait": "1"} if wait else None,
                json={"id": podcast_id},
                headers={"Authorization": f"Bearer {self._secret}"},
                timeout=self._wait_timeout if wait else self._timeout,
            )
        except httpx.HTTPError as exc:
            return Invalidation(ok=False, error=describe_error(exc))
        if 200 <= response.status_code < 300:
            return Invalidation(ok=True, status=response.status_code)
        status = response.status_code
        return Invalidation(
            ok=False,
            status=status,
            error=f"feed worker answered {status}",
            permanent=400 <= status < 500 and status not in (408, 409, 429),
        )


class RecordingFeedCache:
    """A dry run's feed cache: records what would be invalidated, confirms nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    async def invalidate(self, podcast_id: str, *, wait: bool = False) -> Invalidation:
        self.calls.append((podcast_id, wait))
        return Invalidation(ok=True, status=None, error=None)
