"""Sample feeds for ``nightcrew demo``: served from memory on 127.0.0.1 for the length of the
demo, so the news worker fetches real HTTP without touching the internet. The demo runs from
the installed package, so this lives in it — in the ``demo`` package, not among the news steps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STORIES = {
    "/city.xml": [
        (
            "Council approves the new river bridge after two years of debate",
            "The vote was 9 to 2; construction starts in spring and should take eighteen months.",
        ),
        (
            "Library extends opening hours on weekends from January",
            "The central library will open on Sundays for the first time, the city said.",
        ),
        (
            "Win big at the new online casino tonight",
            "Sign up now for a bonus: this is an advert, not news.",
        ),
    ],
    "/science.xml": [
        (
            "Astronomers spot a comet that will be visible in December",
            "It should be bright enough to see with binoculars away from city lights.",
        ),
        (
            "Council approves the new river bridge after two years of debate",
            "Syndicated: the same story as the city desk carried this morning.",
        ),
    ],
}


def _feed(path: str, base: str) -> bytes:
    items = "".join(
        f"<item><title>{title}</title><link>{base}/stories{path[:-4]}/{n}</link>"
        f"<description>{text}</description>"
        f'<media:thumbnail url="{base}/img/{n}.jpg"/></item>'
        for n, (title, text) in enumerate(STORIES[path])
    )
    return (
        '<?xml version="1.0"?><rss version="2.0" xmlns:media="http://search.yahoo.com/mrss/">'
        f"<channel><title>{path}</title>{items}</channel></rss>"
    ).encode()


@contextmanager
def serve_feeds() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A threaded HTTP server on 127.0.0.1 answering GET from a dict of path → feed bytes.

    Yields (base URL, that dict): the caller fills it once it knows the base, which the feeds'
    links need. The server stops when the block ends.
    """
    feeds: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, and no Nagle stall between headers and body (~40 ms of delayed ACK per
        # response otherwise: a benchmark would measure TCP, not nightcrew).
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            body = feeds.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/rss+xml")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", feeds
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serve_sample_feeds() -> Iterator[str]:
    """The demo's sample feeds; yields the base URL."""
    with serve_feeds() as (base, feeds):
        feeds.update({path: _feed(path, base) for path in STORIES})
        yield base
