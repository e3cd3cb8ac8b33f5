"""Image hydration: an article page's og:image / twitter:image, fetched without ever letting a
feed steer us at the inside of the network.

The page is fetched through the news client, whose transport keeps the address policy on every
connection (``adapters/addresses.py``): public addresses only, each redirect hop checked again, the
connection pinned to the address that was checked. The image found is only published, so it is
checked without DNS. The page read is capped in bytes and time; only the <head> matters.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urljoin

from selectolax.parser import HTMLParser

from nightcrew.adapters.addresses import AddressPolicy, FetchLimits, UnsafeURL, UntrustedHttp
from nightcrew.errors import FetchError
from nightcrew.log import describe_error

MAX_PAGE_BYTES = 512 * 1024
MAX_HOPS = 3
READ_TIMEOUT_SECONDS = 8.0
CONNECT_TIMEOUT_SECONDS = 4.0
BUDGET_SECONDS = 15.0
IMAGE_META = (
    ('meta[property="og:image"]', "content"),
    ('meta[property="og:image:url"]', "content"),
    ('meta[name="twitter:image"]', "content"),
    ('meta[name="twitter:image:src"]', "content"),
)


def extract_image(html: str, page_url: str) -> str | None:
    tree = HTMLParser(html)
    for selector, attribute in IMAGE_META:
        node = tree.css_first(selector)
        value = node.attributes.get(attribute) if node is not None else None
        if value and value.strip():
            return urljoin(page_url, value.strip())
    return None


async def hydrate_image(
    client: UntrustedHttp,
    article_url: str,
    policy: AddressPolicy,
    *,
    max_bytes: int = MAX_PAGE_BYTES,
    budget_seconds: float = BUDGET_SECONDS,
) -> tuple[str | None, str | None]:
    """(image URL, None) when found; (None, reason) when not — never raises for a bad page."""
    try:
        async with asyncio.timeout(budget_seconds):
            return await _hydrate(client, article_url, policy, max_bytes)
    except TimeoutError:
        return None, f"the page took longer than the {budget_seconds:g} s budget"


async def _hydrate(
    client: UntrustedHttp, article_url: str, policy: AddressPolicy, max_bytes: int
) -> tuple[str | None, str | None]:
    url = article_url
    # redirects one hop at a time: each hop's address is checked before it is asked for
    limits = FetchLimits(
        max_bytes=max_bytes,
        read_seconds=READ_TIMEOUT_SECONDS,
        connect_seconds=CONNECT_TIMEOUT_SECONDS,
        over_size="truncate",  # the <head> is at the top; the rest is not needed
    )
    try:
        for _ in range(MAX_HOPS + 1):
            policy.check_url(url)
            response = await client.get(url, limits=limits, headers={"Accept": "text/html"})
            location = response.redirect_to
            if location is not None:
                url = urljoin(url, location)
                continue
            if response.status != 200:
                return None, f"the page answered {response.status}"
            found = extract_image(response.body.decode("utf-8", errors="replace"), url)
            if found is None:
                return None, "no og:image or twitter:image"
            image = policy.published_url(found)
            if image is None:
                return None, f"refused: the page's image {found[:200]!r} is not a public URL"
            return image, None
        return None, f"more than {MAX_HOPS} redirects"
    except UnsafeURL as exc:
        return None, f"refused: {exc}"
    except FetchError as exc:
        return None, str(exc)
    except ValueError as exc:  # a Location urljoin cannot read
        return None, describe_error(exc)
