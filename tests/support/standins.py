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
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape

# (status, content type, body) or, with headers to add, (status, content type, body, headers)
Answer = tuple[int, str, bytes] | tuple[int, str, bytes, dict[str, str]]


class _Listener(ThreadingHTTPServer):
    # socketserver's default backlog is 5: a burst of 20 new connections overflows it, and the
    # kernel's SYN retry adds a whole second to the rest (seen as a model "slow" by 1 s)
    request_queue_size = 1024


class _Server:
    def __init__(self) -> None:
        self._httpd = _Listener(("127.0.0.1", 0), self._handler_class())
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

    def respond(self, method: str, path: str, body: bytes) -> Answer:
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
                status, ctype, payload, *more = server.respond(method, self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for name, value in (more[0] if more else {}).items():
                    self.send_header(name, value)
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


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One request the model stand-in received: when (monotonic), how many were in flight with
    it (itself included), what it asked, and what it was answered."""

    at: float
    in_flight: int
    kind: str  # "review" or "translation"
    request: dict[str, Any]
    status: int


class ModelStandIn(_Server):
    """An OpenAI-compatible chat-completions endpoint that accepts every article after
    ``delay`` seconds, and counts the reviews it was asked for, per article URL (``fail``
    answers 500 to the URLs in it; ``fail_once`` to the first review request of each URL in
    it). With a ``summary``, each verdict carries it, so the worker asks for its translation
    too: those answered are counted in ``translations``, not ``reviews``
    (``fail_first_translation``: the first request for each text answers 500;
    ``translations_down``: every translation request answers 500 while it is set).

    Every request is recorded (``calls``: its arrival, the calls in flight with it, the body,
    the status answered) and ``most_in_flight`` kept. On command: ``throttle(seconds,
    retry_after)`` answers 429 with that ``Retry-After`` to every request arriving in the next
    ``seconds``; ``refuse_json_schema`` answers 400 to a ``response_format`` of ``json_schema``
    (as servers without structured outputs do); ``verdict_text`` replaces the verdict's text;
    ``hold_after = n`` holds every review request after the first n for ``hold_seconds`` (a
    model that answered part of a batch and is still working on the rest); ``hold_translations``
    holds every translation request for ``hold_seconds``.
    Each answer reports its usage: prompt tokens = the request's characters // 4, completion
    tokens = the answer's // 4 (summed in ``prompt_tokens``/``completion_tokens``)."""

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
        self.refuse_json_schema = False
        self.verdict_text: str | None = None
        self.hold_after: int | None = None
        self.hold_translations = False
        self.hold_seconds = 60.0
        self.calls: list[ModelCall] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._throttled_until = 0.0
        self._retry_after = "1"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def throttle(self, seconds: float, retry_after: float) -> None:
        with self.lock:
            self._throttled_until = time.monotonic() + seconds
            self._retry_after = f"{retry_after:g}"

    def respond(self, method: str, path: str, body: bytes) -> Answer:
        if method != "POST" or not path.endswith("/chat/completions"):
            return 404, "text/plain", b"not found"
        request = json.loads(body)
        translation = request["messages"][0]["content"].startswith("Translate")
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            at, in_flight = time.monotonic(), self.in_flight
        answer: Answer = (500, "application/json", b'{"error": "unanswered"}')
        try:
            answer = self._answer(request, translation)
            return answer
        finally:
            with self.lock:
                self.in_flight -= 1
                kind = "translation" if translation else "review"
                self.calls.append(ModelCall(at, in_flight, kind, request, answer[0]))

    def _answer(self, request: dict[str, Any], translation: bool) -> Answer:
        user = request["messages"][-1]["content"]
        with self.lock:
            throttled = time.monotonic() < self._throttled_until
        if throttled:
            error = {"error": {"message": "rate limited", "type": "rate_limit"}}
            body = json.dumps(error).encode()
            return 429, "application/json", body, {"Retry-After": self._retry_after}
        if translation:
            if self.hold_translations:
                time.sleep(self.hold_seconds)
            with self.lock:
                self.translation_requests[user] += 1
                first = self.translation_requests[user] == 1
                if self.translations_down or (self.fail_first_translation and first):
                    return 500, "application/json", b'{"error": "down"}'
                self.translations += 1
            return self._completion(request, f"(translated) {user}")
        response_format = (request.get("response_format") or {}).get("type")
        if self.refuse_json_schema and response_format == "json_schema":
            error = {"error": {"message": "response_format json_schema is not supported"}}
            return 400, "application/json", json.dumps(error).encode()
        url = str(json.loads(user)["url"])
        with self.lock:
            self.reviews[url] += 1
            first = self.reviews[url] == 1
            held = self.hold_after is not None and sum(self.reviews.values()) > self.hold_after
        time.sleep(self.hold_seconds if held else self.delay)
        if url in self.fail or (first and url in self.fail_once):
            return 500, "application/json", b'{"error": "down"}'
        with self.lock:
            self.answered[url] += 1
        if self.verdict_text is not None:
            return self._completion(request, self.verdict_text)
        # the article's own summary (so each translation request is its own text)
        summary = f"{self.summary} [{url}]" if self.summary else ""
        verdict = {"accept": True, "reason": "news", "summary": summary}
        return self._completion(request, json.dumps(verdict))

    def _completion(self, request: dict[str, Any], content: str) -> Answer:
        prompt = sum(len(m["content"]) for m in request["messages"]) // 4
        completion = len(content) // 4
        with self.lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion
        answer = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
        return 200, "application/json", json.dumps(answer).encode()


def chat_reviewer(base_url: str, *, model: str = "stand-in", **settings: Any) -> Any:
    """The production model reviewer (``ChatReviewer``) for ``base_url``, as NEWS_AI_* would
    configure it (``settings``: more of them, by name); the caller closes it (``aclose``)."""
    from nightcrew.adapters.news import model_calls
    from nightcrew.adapters.reviewer import make_reviewer
    from nightcrew.config import Settings

    config = Settings.model_validate(
        {"NEWS_AI_BASE_URL": base_url, "NEWS_AI_MODEL": model, **settings}
    )
    return make_reviewer(config, model_calls(config, None))
