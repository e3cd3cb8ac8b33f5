"""Small real servers on 127.0.0.1 for the outside systems: S3 (moto), Stripe, the feed worker."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response


def answers(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on host:port (a port expected free, a server a test started)."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def embedded_postgres(parent: Path | None = None) -> Iterator[str]:
    """An embedded PostgreSQL (pgserver) in a temporary directory of its own; yields its URL.
    The directory goes afterwards too: pgserver deletes the data directory, not its parent."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver import get_server

        home = Path(tempfile.mkdtemp(prefix="nightcrew-test-pg-", dir=parent))
        try:
            server = get_server(home / "pg", cleanup_mode="delete")
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            raise
    try:
        yield str(server.get_uri())
    finally:
        try:
            server.cleanup()
        finally:
            shutil.rmtree(home, ignore_errors=True)


@contextmanager
def moto_s3() -> Iterator[str]:
    """A moto S3 server on loopback; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


S3_CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, str]:
        from urllib.parse import parse_qsl

        return dict(parse_qsl(self.body.decode(), keep_blank_values=True))


class RecordingServer:
    """An HTTP server that answers by a handler and records every request it received."""

    def __init__(self) -> None:
        self.server = HTTPServer(host="127.0.0.1", port=free_port())
        self.requests: list[Recorded] = []
        self.status = 200
        self.responder: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def start(self) -> None:
        self.server.expect_request("").respond_with_handler(self._handle)
        self.server.start()

    def reset(self) -> None:
        self.requests.clear()
        self.status = 200
        self.responder = None

    def stop(self) -> None:
        self.server.clear()
        if self.server.is_running():
            self.server.stop()

    def _handle(self, request: Request) -> Response:
        self.requests.append(
            Recorded(
                method=request.method,
                path=request.path,
                query=dict(request.args),
                headers=dict(request.headers),
                body=request.get_data(),
            )
        )
        if self.responder is not None:
            answer = self.responder(request)
            if isinstance(answer, Response):  # a test that needs full control of the reply
                return answer
            status, payload = answer
        else:
            status, payload = self.status, {"ok": self.status < 400}
        return Response(json.dumps(payload), status=status, content_type="application/json")


@contextmanager
def recording_server() -> Iterator[RecordingServer]:
    server = RecordingServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def stripe_responder(subscriptions: dict[str, list[str]], *, fail_status: int | None = None) -> Any:
    """A Stripe stand-in: lists subscriptions by customer, accepts subscription updates."""

    def respond(request: Request) -> tuple[int, dict[str, Any]]:
        if fail_status is not None:
            return fail_status, {"error": {"type": "api_error", "message": "Stripe is down"}}
        if request.method == "GET" and request.path == "/v1/subscriptions":
            ids = subscriptions.get(request.args.get("customer", ""), [])
            return 200, {
                "object": "list",
                "url": "/v1/subscriptions",
                "has_more": False,
                "data": [{"id": i, "object": "subscription"} for i in ids],
            }
        if request.method == "POST" and request.path.startswith("/v1/subscriptions/"):
            sub = request.path.rsplit("/", 1)[1]
            return 200, {"id": sub, "object": "subscription", "pause_collection": None}
        return 404, {"error": {"type": "invalid_request_error", "message": "no such route"}}

    return respond
