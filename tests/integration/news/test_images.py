"""Image hydration against pages on a loopback server, and its refusal to go inside."""

from __future__ import annotations

import pytest
from werkzeug import Request, Response

from nightcrew.adapters.addresses import AddressPolicy, UnsafeURL, UntrustedHttp, new_client
from nightcrew.news.steps.images import extract_image, hydrate_image
from tests.integration.news.conftest import LOOPBACK
from tests.support.network import LoopbackOnlyBackend
from tests.support.servers import RecordingServer

PRODUCTION = AddressPolicy.parse("")


PAGE = """<html><head><title>x</title>
<meta property="og:image" content="/img/lead.jpg">
<meta name="twitter:image" content="https://cdn.example/twitter.jpg">
</head><body>story</body></html>"""


def pages(server: RecordingServer, routes: dict[str, Response]) -> None:
    def respond(request: Request) -> Response:
        return routes[request.path]

    server.responder = respond


async def test_og_image_is_found_and_resolved_against_the_page(
    feed_server: RecordingServer, http: UntrustedHttp
) -> None:
    pages(
        feed_server,
        {
            "/story": Response(PAGE, content_type="text/html"),
            "/moved": Response(status=301, headers={"Location": "/story"}),
            "/bare": Response("<html><head></head></html>", content_type="text/html"),
        },
    )
    image, why = await hydrate_image(http, feed_server.url + "/moved", LOOPBACK)
    assert image == feed_server.url + "/img/lead.jpg" and why is None
    image, why = await hydrate_image(http, feed_server.url + "/bare", LOOPBACK)
    assert image is None and why == "no og:image or twitter:image"


def test_twitter_image_is_the_fallback() -> None:
    html = '<meta name="twitter:image" content="https://cdn.example/t.jpg">'
    assert extract_image(html, "https://news.example/a") == "https://cdn.example/t.jpg"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "file:///etc/passwd",
        "http://10.0.0.8/x",
        "http://[::1]/",
        "gopher://example.com/",
    ],
)
async def test_production_mode_refuses_the_inside_of_the_network(
    url: str, network: LoopbackOnlyBackend
) -> None:
    with pytest.raises(UnsafeURL):
        PRODUCTION.check_url(url)
    async with new_client(PRODUCTION, inner=network) as client:
        image, why = await hydrate_image(client, url, PRODUCTION)
    assert image is None and why is not None and why.startswith("refused")
    assert network.opened == [] and network.refused == []  # refused before any connection


async def test_a_redirect_into_the_network_is_refused(
    feed_server: RecordingServer, http: UntrustedHttp, network: LoopbackOnlyBackend
) -> None:
    pages(
        feed_server,
        {
            "/out": Response(status=302, headers={"Location": "http://169.254.169.254/latest/"}),
        },
    )
    # only the test server's own address is allowed; where it redirects to is checked for real
    image, why = await hydrate_image(http, feed_server.url + "/out", LOOPBACK)
    assert image is None and why is not None and "169.254.169.254" in why
    assert [r.path for r in feed_server.requests] == ["/out"]  # the metadata IP never asked
    assert network.refused == []  # the policy refused it, not the test's network guard
