"""Object keys from public URLs: ``nightcrew.object_key`` (migration 0011) and the reconciler.

The SQL function is checked as a property on one connection for the whole module (it is
IMMUTABLE: no table is read), then through ``run_reconcile`` against real stores: a reference
spelled percent-encoded protects (and backfills) the object it names, and a URL under the prefix
whose key cannot be derived protects every object of its podcast.
"""

from __future__ import annotations

import os
import random
import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nightcrew.adapters.storage import ObjectStore
from nightcrew.db.connection import with_dbname
from nightcrew.db.database import Database
from nightcrew.lifecycle.reconcile.core import ReconcileOptions, public_prefix
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from tests import factories as f
from tests.integration.lifecycle.test_reconcile import APPLY, BASE, World, later, rt

BASES = ("https://media.example", "https://cdn.example/bucket/media")
PREFIX = public_prefix(BASE)  # what the reconciler passes: R2_PUBLIC_URL + '/'


# --- one connection for the whole module ------------------------------------------------------
@pytest.fixture(scope="module")
def pg(pg_admin_url: str, template_db: str) -> Iterator[psycopg.Connection[Any]]:
    name = f"nightcrew_keys_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    try:
        with psycopg.connect(with_dbname(pg_admin_url, name), autocommit=True) as conn:
            yield conn
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def object_keys(
    conn: psycopg.Connection[Any], urls: list[str], prefix: str = PREFIX
) -> list[str | None]:
    """nightcrew.object_key over many URLs in one round trip, in order."""
    rows = conn.execute(
        "SELECT nightcrew.object_key(u.url, %(p)s)"
        "  FROM unnest(%(urls)s::text[]) WITH ORDINALITY AS u (url, n) ORDER BY u.n",
        {"p": prefix, "urls": urls},
    ).fetchall()
    return [r[0] for r in rows]


def object_key(conn: psycopg.Connection[Any], url: str, prefix: str = PREFIX) -> str | None:
    [key] = object_keys(conn, [url], prefix)
    return key


# --- strategies -------------------------------------------------------------------------------
# Characters a key may hold: the awkward ones often, anything else (astral planes included)
# now and then. Never '/' inside a segment, never NUL (not storable in PostgreSQL text), never a
# lone surrogate (not encodable as UTF-8).
AWKWARD = [" ", "+", "%", "#", "?", "&", "=", ";", "é", "ü", "ß", "中", "😀", "𝄞", "\U0010fffd"]
ANY_CHAR = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00")
SEGMENT = st.lists(st.one_of(st.sampled_from(AWKWARD), ANY_CHAR), min_size=1, max_size=8).map(
    "".join
)
KEYS = st.lists(SEGMENT, min_size=1, max_size=4).map("/".join)
TAIL_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
SUFFIX = st.one_of(
    st.just(""),
    TAIL_TEXT.map(lambda q: "?" + q),
    TAIL_TEXT.map(lambda h: "#" + h),
    st.tuples(TAIL_TEXT, TAIL_TEXT).map(lambda qh: f"?{qh[0]}#{qh[1]}"),
)


def spell(key: str, rng: random.Random) -> str:
    """The key as a URL path some client might write: each character raw or percent-encoded
    (hex in either case), except '%', '?' and '#', which a URL path must encode."""
    out = []
    for ch in key:
        if ch == "/" or (ch not in "%?#" and rng.random() < 0.5):
            out.append(ch)
        else:
            hexed = "".join(f"%{b:02X}" for b in ch.encode())
            out.append(hexed.lower() if rng.random() < 0.5 else hexed)
    return "".join(out)


PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- the SQL function, as a property ----------------------------------------------------------
@PROPERTY
@given(
    batch=st.lists(st.tuples(KEYS, SUFFIX), min_size=1, max_size=25),
    base=st.sampled_from(BASES),
    seed=st.integers(0, 2**32 - 1),
)
@example(batch=[("a b/c+d/%/#/?/😀 é", "?x=%zz#frag")], base=BASES[0], seed=0)
def test_a_percent_encoded_url_maps_back_to_exactly_its_key(
    pg: psycopg.Connection[Any], batch: list[tuple[str, str]], base: str, seed: int
) -> None:
    prefix = public_prefix(base)
    rng = random.Random(seed)
    keys = [key for key, _ in batch]
    quoted = [prefix + quote(key, safe="/") + suffix for key, suffix in batch]
    mixed = [prefix + spell(key, rng) + suffix for key, suffix in batch]
    # decoded exactly once: a doubly-encoded URL gives the singly-encoded key back
    twice = [prefix + quote(quote(key, safe="/"), safe="/") for key in keys]
    got = object_keys(pg, quoted + mixed + twice, prefix)
    n = len(batch)
    assert got[:n] == keys
    assert got[n : 2 * n] == keys
    assert got[2 * n :] == [quote(key, safe="/") for key in keys]


# Malformed escapes, each followed by '/' or the end of the path so that what follows can never
# complete it: every one must make the whole URL keyless.
MALFORMED = [
    "%zz",
    "%",
    "%2",
    "%C3",  # a lead byte alone
    "%00",  # NUL
    "%80",  # a continuation byte alone
    "%C3%28",  # a lead byte and no continuation
    "%C0%AF",  # overlong '/'
    "%ED%A0%80",  # a UTF-16 surrogate, in UTF-8
    "%F4%90%80%80",  # beyond U+10FFFF
    "%FF",
    "%G1",
    "%%41",
]


@PROPERTY
@given(
    segments=st.lists(SEGMENT, min_size=1, max_size=3),
    bad=st.sampled_from(MALFORMED),
    at=st.integers(0, 3),
    suffix=SUFFIX,
)
def test_a_malformed_escape_anywhere_in_the_path_gives_null(
    pg: psycopg.Connection[Any], segments: list[str], bad: str, at: int, suffix: str
) -> None:
    parts = [quote(s, safe="") for s in segments]
    at = min(at, len(parts))
    path = "/".join([*parts[:at], bad, *parts[at:]])  # a whole segment of its own
    glued_parts = list(parts)
    glued_parts[at - 1] += bad  # or glued to the end of a segment (the last one when at = 0)
    glued = "/".join(glued_parts)
    assert object_keys(pg, [PREFIX + path + suffix, PREFIX + glued + suffix]) == [None, None]


@pytest.mark.parametrize(
    ("url", "key"),
    [
        # not under the prefix
        ("https://other.example/podcasts/p/a.mp3", None),
        ("https://media.example.evil/podcasts/p/a.mp3", None),
        ("http://media.example/podcasts/p/a.mp3", None),
        ("https://media.example", None),
        ("podcasts/p/a.mp3", None),
        ("", None),
        # under it, but no key: empty path
        (f"{BASE}/", None),
        (f"{BASE}/?v=1", None),
        (f"{BASE}/#x", None),
        # malformed escapes
        (f"{BASE}/podcasts/p/bad%zz.mp3", None),
        (f"{BASE}/podcasts/p/trailing%", None),
        (f"{BASE}/podcasts/p/half%C3", None),
        (f"{BASE}/podcasts/p/half%C3.mp3", None),
        (f"{BASE}/podcasts/p/nul%00.mp3", None),
        # '+' is '+', never a space; '%2B' is '+'
        (f"{BASE}/podcasts/p/a+b.mp3", "podcasts/p/a+b.mp3"),
        (f"{BASE}/podcasts/p/a%2Bb.mp3", "podcasts/p/a+b.mp3"),
        (f"{BASE}/podcasts/p/a%2bb.mp3", "podcasts/p/a+b.mp3"),
        # decoded exactly once
        (f"{BASE}/podcasts/p/a%2520b.mp3", "podcasts/p/a%20b.mp3"),
        (f"{BASE}/podcasts/p/a%25zz.mp3", "podcasts/p/a%zz.mp3"),
        (f"{BASE}/podcasts/p/my%20file.mp3", "podcasts/p/my file.mp3"),
        # the query and the fragment are cut, encoded '?' and '#' are part of the key
        (f"{BASE}/podcasts/p/a.mp3?v=%zz", "podcasts/p/a.mp3"),
        (f"{BASE}/podcasts/p/a.mp3#t=%", "podcasts/p/a.mp3"),
        (f"{BASE}/podcasts/p/a.mp3#frag?not-a-query", "podcasts/p/a.mp3"),
        (f"{BASE}/podcasts/p/a%3Fb%23c.mp3?x#y", "podcasts/p/a?b#c.mp3"),
        # unicode, raw or encoded, astral included
        (f"{BASE}/podcasts/p/%F0%9F%98%80.mp3", "podcasts/p/😀.mp3"),
        (f"{BASE}/podcasts/p/😀 é.mp3", "podcasts/p/😀 é.mp3"),
        (f"{BASE}/podcasts/p/%c3%a9t%C3%A9.mp3", "podcasts/p/été.mp3"),
    ],
)
def test_object_key_cases(pg: psycopg.Connection[Any], url: str, key: str | None) -> None:
    assert object_key(pg, url) == key


def test_object_key_of_null_is_null(pg: psycopg.Connection[Any]) -> None:
    row = pg.execute("SELECT nightcrew.object_key(NULL, %(p)s)", {"p": PREFIX}).fetchone()
    assert row == (None,)


# --- an independent model must say the same ---------------------------------------------------
# The rule written a second way, in Python, from its description rather than from the SQL: two
# spellings of one rule that agree on every generated URL are far likelier right than either.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def key_from_url(url: str | None, public_base: str) -> str | None:
    """The store key behind a public URL: the URL without the prefix, cut at the first ``?`` or
    ``#``, percent-decoded once. None when the URL is not ours (external hosting) or no key can
    be derived from it (a malformed escape, not UTF-8, a NUL)."""
    if not url:
        return None
    prefix = public_prefix(public_base)
    if not url.startswith(prefix):
        return None
    path = url[len(prefix) :].split("#", 1)[0].split("?", 1)[0]
    if not path or "%" not in path:
        return path or None
    if _BAD_ESCAPE.search(path):
        return None
    try:
        key = unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in key else key


@PROPERTY
@given(batch=st.lists(st.tuples(KEYS, SUFFIX), min_size=1, max_size=10))
@example(batch=[("podcasts/p/e/e1/my file.mp3", "")])
def test_key_from_url_agrees_with_the_sql_function(
    pg: psycopg.Connection[Any], batch: list[tuple[str, str]]
) -> None:
    urls = [PREFIX + quote(key, safe="/") + suffix for key, suffix in batch]
    assert [key_from_url(u, BASE) for u in urls] == object_keys(pg, urls)


@pytest.mark.parametrize(
    "url",
    [
        f"{BASE}/podcasts/p/a.mp3?v=2",
        f"{BASE}/podcasts/p/a+b.mp3",
        f"{BASE}/podcasts/p/my%20file.mp3",
        f"{BASE}/podcasts/p/a%2Bb.mp3",
        f"{BASE}/podcasts/p/a%2520b.mp3",
        f"{BASE}/podcasts/p/%F0%9F%98%80.mp3",
        f"{BASE}/podcasts/p/bad%zz.mp3",
        f"{BASE}/podcasts/p/nul%00.mp3",
        "https://other.example/podcasts/p/a.mp3",
    ],
)
def test_key_from_url_agrees_with_the_sql_function_on_known_cases(
    pg: psycopg.Connection[Any], url: str
) -> None:
    assert key_from_url(url, BASE) == object_key(pg, url)


# --- through the reconciler -------------------------------------------------------------------
NAMES = [
    # (the object's file name, the file name as the episode's URL spells it)
    ("my file.mp3", "my%20file.mp3"),
    ("a+b.mp3", "a+b.mp3"),
    ("épisode ünï 😀 𝄞.mp3", quote("épisode ünï 😀 𝄞.mp3")),
]


@pytest.mark.parametrize(("name", "spelled"), NAMES, ids=["space", "plus", "unicode"])
async def test_an_encoded_reference_keeps_its_object_and_backfills_its_size(
    db: Database, fresh_db_url: str, store: ObjectStore, name: str, spelled: str
) -> None:
    w = await World(db, store).setup()
    key = await w.obj(w.key(name), 321)
    url = f"{BASE}/{w.key(spelled)}"
    assert url != f"{BASE}/{key}" or name == spelled
    episode = await f.episode(
        db, w.podcast, audio_url=url, audio_file_size_bytes=None, status="draft"
    )
    stray = await w.obj(w.key("stray.mp3", episode="e2"), 5)  # the sweep did run
    clock = later(days=8)  # far past the orphan age guard

    report = (await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, APPLY)).to_json()

    assert await w.exists(key), "a referenced object was deleted as an orphan"
    assert not await w.exists(stray)
    assert report["orphans"]["deleted"] == 1
    assert report["missing"]["count"] == 0, report["missing"]
    assert report["sizeBackfill"]["written"] == 1
    row = await w.row(episode)
    assert row["audio_file_size_bytes"] == 321 and row["audio_url"] == url


@pytest.mark.parametrize("column", ["audio_url", "original_audio_url"])
async def test_an_undecodable_url_protects_every_audio_object_of_its_podcast(
    db: Database, fresh_db_url: str, store: ObjectStore, column: str
) -> None:
    w = await World(db, store).setup()
    other = await World(db, store).setup()
    unknown = await w.obj(w.key("something.mp3", episode="e2"), 10)
    stale_image = await w.obj(w.key("old.jpg", episode="e3", kind="images"), 10)
    theirs = await other.obj(other.key("stray.mp3"), 10)
    await f.episode(db, w.podcast, status="published", **{column: f"{BASE}/{w.key('bad%zz.mp3')}"})
    clock = later(days=8)

    report = (await run_reconcile(await rt(db, clock, fresh_db_url, store), clock, APPLY)).to_json()

    assert await w.exists(unknown), "an object the undecodable URL may mean was deleted"
    assert not await other.exists(theirs)  # another podcast's orphan still goes
    assert report["orphans"]["deleted"] == 1
    # the undecodable URL is not a missing-object candidate (it cannot be HEAD-checked)
    assert report["missing"]["count"] == 0
    # an audio URL says nothing about images: the episode-image sweep still runs for it
    assert not await w.exists(stale_image)


async def test_an_undecodable_cover_url_protects_the_podcasts_episode_images(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    other = await World(db, store).setup()
    image = await w.obj(w.key("cover.jpg", episode="e2", kind="images"), 10)
    theirs = await other.obj(other.key("cover.jpg", kind="images"), 10)
    await f.episode(db, w.podcast, cover_image_url=f"{BASE}/{w.key('c%C3.jpg', kind='images')}")
    clock = later(days=8)

    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, store), clock, ReconcileOptions(mode="apply")
    )

    assert await w.exists(image)
    assert not await other.exists(theirs)
    assert report.episode_images.deleted == 1
