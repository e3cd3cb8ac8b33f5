"""Content decoding with a ceiling: an untrusted body is decoded as it streams, and decoding stops
at the caller's byte cap — never after it.

httpx decodes each network chunk whole (``zlib.decompress`` with no output bound): one 64 KB
chunk of a gzip bomb becomes 64 MB before anything can count it, and a 1 MB bomb became a 67 MB
body against a 512 KB cap. Here every step inflates at most ``STEP_BYTES`` and the caller asks
only for what is left under its cap, so memory and CPU stay proportional to the cap, whatever
the ratio. Only what can be bounded this way is accepted: identity, gzip and deflate (the
client asks for nothing else); any other ``Content-Encoding``, or a stack of them, is refused.
"""

from __future__ import annotations

import zlib

from nightcrew.errors import FetchError

ACCEPT_ENCODING = "gzip, deflate"
# The most one inflate step produces: the bound on memory beyond the cap itself.
STEP_BYTES = 64 * 1024
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class UnsupportedEncoding(FetchError):
    """A Content-Encoding that cannot be decoded under a bound (brotli, zstd, a stack)."""


class BoundedDecoder:
    """One response body's ``Content-Encoding`` undone a step at a time: ``feed`` takes raw
    bytes and returns at most ``room`` decoded bytes; what it could not yet return waits for
    the next call (``pending``)."""

    def __init__(self, content_encoding: str | None) -> None:
        codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if len(codings) > 1:
            raise UnsupportedEncoding(f"more than one content encoding: {content_encoding!r}")
        coding = codings[0] if codings else "identity"
        if coding in ("gzip", "x-gzip"):
            self._wbits: int | None = _GZIP_WBITS
        elif coding == "deflate":
            self._wbits = zlib.MAX_WBITS  # zlib-wrapped, as the RFC says; raw tried on failure
        elif coding == "identity":
            self._wbits = None
        else:
            raise UnsupportedEncoding(f"unsupported content encoding {coding!r}")
        self._deflate = coding == "deflate"
        self._inflater = zlib.decompressobj(self._wbits) if self._wbits is not None else None
        self._tail = b""  # raw input the inflater has not consumed yet
        self._started = False
        self._full = False

    @property
    def pending(self) -> bool:
        """Decoded bytes may still come without more input (the last call stopped at its
        ``room``): call ``feed(b"", room)`` at the end of the stream until it returns nothing."""
        return bool(self._tail) or self._full

    def feed(self, raw: bytes, room: int) -> bytes:
        """Up to ``room`` more decoded bytes from what was fed so far plus ``raw``."""
        if self._inflater is None:
            data, self._tail = self._tail + raw, b""
            if len(data) > room:
                data, self._tail = data[:room], data[room:]
            return data
        self._tail += raw
        out = bytearray()
        self._full = False
        while len(out) < room:
            step = min(STEP_BYTES, room - len(out))
            chunk = self._inflate(step)
            out += chunk
            if self._inflater.eof:
                # gzip may hold several members back to back (``cat a.gz b.gz``); whatever
                # follows a finished deflate stream is not part of the body
                rest = self._inflater.unused_data
                self._inflater = zlib.decompressobj(self._inflater_wbits())
                self._tail = rest if self._wbits == _GZIP_WBITS else b""
                if not self._tail:
                    break
            elif len(chunk) < step:
                break  # the input ran out before the step's output did: wait for more
        # a full last step may have left output inside zlib, with no input left to show it
        self._full = len(out) >= room
        return bytes(out)

    def _inflater_wbits(self) -> int:
        assert self._wbits is not None  # an inflater exists only for gzip and deflate
        return self._wbits

    def _inflate(self, step: int) -> bytes:
        assert self._inflater is not None
        data, self._tail = self._tail, b""
        try:
            out = self._inflater.decompress(data, step)
        except zlib.error as exc:
            if not (self._deflate and not self._started):
                raise FetchError(f"the body does not decode: {exc}") from exc
            # servers send raw deflate as often as zlib-wrapped: read it as raw (as httpx does)
            self._wbits = -zlib.MAX_WBITS
            self._inflater = zlib.decompressobj(self._wbits)
            try:
                out = self._inflater.decompress(data, step)
            except zlib.error as again:
                raise FetchError(f"the body does not decode: {again}") from again
        self._started = True
        self._tail = self._inflater.unconsumed_tail
        return out
