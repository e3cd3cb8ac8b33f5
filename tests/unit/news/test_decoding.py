"""Bounded content decoding: a compressed body is inflated a bounded step at a time and
never past what the caller has room for, whatever its ratio; what cannot be bounded is refused."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from nightcrew.adapters.decoding import STEP_BYTES, BoundedDecoder, UnsupportedEncoding
from nightcrew.errors import FetchError

TEXT = os.urandom(50_000) + b"<rss>" * 40_000  # some incompressible, some very compressible


def _decode_all(decoder: BoundedDecoder, raw: bytes, chunk: int = 4096) -> bytes:
    out = bytearray()
    for start in range(0, len(raw), chunk):
        out += decoder.feed(raw[start : start + chunk], 1 << 30)
    while decoder.pending:
        more = decoder.feed(b"", 1 << 30)
        if not more:
            break
        out += more
    return bytes(out)


@pytest.mark.parametrize(
    ("encoding", "raw"),
    [
        (None, TEXT),
        ("identity", TEXT),
        ("gzip", gzip.compress(TEXT)),
        ("x-gzip", gzip.compress(TEXT)),
        ("GZIP", gzip.compress(TEXT)),
        ("deflate", zlib.compress(TEXT)),  # zlib-wrapped, as RFC 9110 says
        ("deflate", zlib.compress(TEXT)[2:-4]),  # raw deflate, as many servers send it
        ("gzip", gzip.compress(TEXT[:1000]) + gzip.compress(TEXT[1000:])),  # two members
    ],
)
def test_every_accepted_encoding_decodes_whole(encoding: str | None, raw: bytes) -> None:
    assert _decode_all(BoundedDecoder(encoding), raw) == TEXT


def test_a_bomb_is_inflated_no_further_than_the_room_given() -> None:
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MB of zeros in ~64 KB
    assert len(bomb) < 100_000
    decoder = BoundedDecoder("gzip")
    cap = 300_000
    # the whole bomb in one network chunk: httpx would inflate all 64 MB in one call
    first = decoder.feed(bomb, cap + 1)
    assert len(first) == cap + 1
    assert decoder.pending  # there is more, but it was not produced
    # asked for a little more, it produces exactly that much, a step at most at a time
    assert len(decoder.feed(b"", 10)) == 10
    assert len(decoder.feed(b"", STEP_BYTES * 3)) == STEP_BYTES * 3


def test_a_decoded_body_can_be_read_to_its_end_in_small_rooms() -> None:
    decoder = BoundedDecoder("gzip")
    raw = gzip.compress(TEXT)
    out = bytearray(decoder.feed(raw, 1000))
    while decoder.pending:
        more = decoder.feed(b"", 1000)
        assert len(more) <= 1000
        if not more:
            break
        out += more
    assert bytes(out) == TEXT


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip", "deflate, br"])
def test_what_cannot_be_bounded_is_refused(encoding: str) -> None:
    with pytest.raises(UnsupportedEncoding):
        BoundedDecoder(encoding)


def test_a_body_that_is_not_what_it_claims_is_a_fetch_error() -> None:
    with pytest.raises(FetchError, match="does not decode"):
        BoundedDecoder("gzip").feed(b"this is not gzip at all", 1000)
    with pytest.raises(FetchError, match="does not decode"):
        BoundedDecoder("deflate").feed(b"\xff\xfe neither zlib nor raw deflate", 1000)
