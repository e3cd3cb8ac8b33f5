"""Loopback stand-ins for the news tests and benchmarks: a farm of RSS feeds with their
article pages, and an OpenAI-compatible model that answers after a set delay. Both are threaded
HTTP servers on 127.0.0.1 that record what they were asked. They live with the tests, not in
``nightcrew.news``: the worker never uses them, and the installed package does not ship them
(the benchmarks, run from a checkout, import them from here).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape


class _Server:
    def __init__(self) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        raise NotImplementedError

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # buffered: headers and body leave in one segment (written separately, the client's
            # delayed ACK would add ~40 ms to every answer on loopback)
            wbufsize = 1 << 16

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, ctype, payload = server.respond(method, self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


class FeedFarm(_Server):
    """``feeds`` RSS feeds at /feeds/{n}, each listing ``items`` stories (``grow`` adds more),
    each story's page at /articles/{n}-{i} with an og:image. With ``thumbnails``, items carry
    a media:thumbnail (they skip image hydration)."""

    def __init__(self, feeds: int, items: int, *, thumbnails: bool = False) -> None:
        super().__init__()
        self.feeds = feeds
        self.items = items
        self.thumbnails = thumbnails
        self.feed_requests = 0
        self.page_requests = 0

    def feed_urls(self) -> list[str]:
        return [f"{self.url}/feeds/{n}" for n in range(self.feeds)]

    def article_urls(self) -> set[str]:
        return {
            f"{self.url}/articles/{n}-{i}" for n in range(self.feeds) for i in range(self.items)
        }

    def grow(self, items: int) -> None:
        with self.lock:
            self.items += items

    def feed(self, n: int) -> bytes:
        stories = []
        for i in range(self.items - 1, -1, -1):  # newest first, as feeds list them
            link = f"{self.url}/articles/{n}-{i}"
            thumb = (
                f'<media:thumbnail url="{self.url}/img/{n}-{i}.jpg"/>' if self.thumbnails else ""
            )
            day, minute = divmod(i, 1440)
            stories.append(
                f"<item><title>Feed {n} story {i}: the council meets again</title>"
                f"<link>{escape(link)}</link><guid>{escape(link)}</guid>"
                f"<pubDate>Sun, {1 + day % 28:02d} Nov 2026 {minute // 60:02d}:{minute % 60:02d}"
                f":00 +0000</pubDate>"
                f"<description>A long enough description of story {i} of feed {n}."
                f"</description>{thumb}</item>"
            )
        return (
            '<?xml version="1.0"?><rss version="2.0" '
            'xmlns:media="http://search.yahoo.com/mrss/"><channel>'
            f"<title>Feed {n}</title>{''.join(stories)}</channel></rss>"
        ).encode()

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path.startswith("/feeds/"):
            with self.lock:
                self.feed_requests += 1
            return 200, "application/rss+xml", self.feed(int(path.rsplit("/", 1)[1]))
        if path.startswith("/articles/"):
            with self.lock:
                self.page_requests += 1
            page = f'<html><head><meta property="og:image" content="/img{path}.jpg"></head></html>'
            return 200, "text/html", page.encode()
        return 404, "text/plain", b"not found"


class ModelStandIn(_Server):
    """An OpenAI-compatible chat-completions endpoint that accepts every article after
    ``delay`` seconds, and counts the reviews it was asked for, per article URL (``fail``
    answers 500 to the URLs in it; ``fail_once`` to the first review request of each URL in
    it). With a ``summary``, each verdict carries it, so the worker asks for its translation
    too: those answered are counted in ``translations``, not ``reviews``
    (``fail_first_translation``: the first request for each text answers 500;
    ``translations_down``: every translation request answers 500 while it is set)."""

    def __init__(
        self, delay: float = 0.1, *, summary: str = "", fail_first_translation: bool = False
    ) -> None:
        super().__init__()
        self.delay = delay
        self.summary = summary
        self.fail_first_translation = fail_first_translation
        self.reviews: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()
        self.translation_requests: Counter[str] = Counter()
        self.translations = 0
        self.fail: set[str] = set()
        self.fail_once: set[str] = set()
        self.translations_down = False

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if method != "POST" or not path.endswith("/chat/completions"):
            return 404, "text/plain", b"not found"
        request = json.loads(body)
        user = request["messages"][-1]["content"]
        if request["messages"][0]["content"].startswith("Translate"):
            with self.lock:
                self.translation_requests[user] += 1
                first = self.translation_requests[user] == 1
                if self.translations_down or (self.fail_first_translation and first):
                    return 500, "application/json", b'{"error": "down"}'
                self.translations += 1
            return self._completion(f"(translated) {user}")
        url = next((line[5:].strip() for line in user.splitlines() if line.startswith("URL: ")), "")
        with self.lock:
            self.reviews[url] += 1
            first = self.reviews[url] == 1
        time.sleep(self.delay)
        if url in self.fail or (first and url in self.fail_once):
            return 500, "application/json", b'{"error": "down"}'
        with self.lock:
            self.answered[url] += 1
        # the article's own summary (so each translation request is its own text)
        summary = f"{self.summary} [{url}]" if self.summary else ""
        verdict = {"accept": True, "reason": "news", "summary": summary}
        return self._completion(json.dumps(verdict))

    def _completion(self, content: str) -> tuple[int, str, bytes]:
        answer = {
            "id": "c",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        }
        return 200, "application/json", json.dumps(answer).encode()
