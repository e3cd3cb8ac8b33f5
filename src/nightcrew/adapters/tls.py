"""The process's client TLS contexts, built once.

httpx builds a new ``ssl.SSLContext`` for every client and transport it is given none for,
and building one loads and parses the whole CA bundle (~25 ms of CPU here). A runtime opens
four clients (the platform's services, the feeds' pinned transport and its pool, the model), so
every CLI command, serve start and test paid ~0.1 s for contexts that are all the same. A
context is safe to share between clients, threads and event loops; nothing may change one
after it is built (httpcore sets its ALPN protocols on every connect — the same ``http/1.1``
each time while no client enables HTTP/2). ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` are read
once per process.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context(*, trust_env: bool) -> ssl.SSLContext:
    """httpx's default context (certifi's CAs, verification on); ``trust_env`` honours
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, as httpx's own ``trust_env`` does."""
    return httpx.create_ssl_context(trust_env=trust_env)
