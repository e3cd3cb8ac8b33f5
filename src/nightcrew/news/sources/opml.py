"""Feed lists in and out: OPML (what every feed reader exports) and plain URL lists.

Pure: bytes in, entries with their line numbers out (and OPML text out); validating URLs against
what is already a source is ``sources/registry.py``'s. The file is untrusted. The XML goes through
expat with a DOCTYPE refused outright: the standard library never fetches external entities,
but it does expand internal ones (a "billion laughs" document is a few hundred bytes), and an
OPML file has no use for a DTD. The tree is ElementTree's, built from expat's events so that
every outline keeps the line it stands on for the report.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime
from enum import StrEnum
from typing import Literal
from xml.parsers import expat

from nightcrew.errors import NightcrewError
from nightcrew.jsonable import Jsonable, named

# A feed list is small (2,000 feeds of OPML are ~400 KB): anything far larger is not one.
MAX_FILE_BYTES = 64 * 1024 * 1024

FileFormat = Literal["opml", "urls"]


class FeedListError(NightcrewError, ValueError):
    """The file cannot be read as a feed list at all; nothing of it may be imported."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None) -> None:
        where = ""
        if line is not None:
            where = f"line {line}, column {column}: " if column is not None else f"line {line}: "
        super().__init__(where + message)
        self.line = line


class SkipReason(StrEnum):
    """Why an entry of the file did not become a source (the report's ``reason``)."""

    missing_xmlurl = "missing_xmlurl"  # an OPML outline that is neither a feed nor a category
    invalid_url = "invalid_url"  # refused by the URL check `sources add` uses
    duplicate = "duplicate"  # the same feed URL earlier in the file
    exists = "exists"  # already a source


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedEntry:
    """One feed the file names. ``url`` is as written (checked later); ``name`` None means the
    file gave none (the source is then named after the URL's host)."""

    line: int
    url: str
    name: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Skipped(Jsonable):
    line: int
    reason: SkipReason
    url: str | None = named("feedUrl")
    name: str | None
    detail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedList:
    format: FileFormat
    entries: tuple[FeedEntry, ...]
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class OpmlFeed:
    """A source as it goes into an exported OPML file."""

    name: str
    feed_url: str


def parse_feed_list(data: bytes) -> FeedList:
    """OPML when the file is XML (its first character is ``<``), otherwise a URL list."""
    if len(data) > MAX_FILE_BYTES:
        raise FeedListError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MB: not a feed list")
    if _looks_like_xml(data):
        return parse_opml(data)
    return parse_url_list(data)


def _looks_like_xml(data: bytes) -> bool:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16: only XML says how it is encoded
        return True
    return data.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"<")


# --- plain URL lists -----------------------------------------------------------------------------
# C0 controls (tab aside) and DEL: PostgreSQL text refuses NUL, and none belongs in a URL or a name.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def parse_url_list(data: bytes) -> FeedList:
    """One feed per line: ``URL`` or ``URL NAME``; ``#`` comments and blank lines are ignored.

    Whitespace ends the URL (a URL holds none), so the rest of the line can only be a name."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        at = data[: exc.start].count(b"\n") + 1
        raise FeedListError("not UTF-8 text (neither OPML nor a URL list)", line=at) from None
    entries: list[FeedEntry] = []
    skipped: list[Skipped] = []
    # split on "\n" alone: str.splitlines also splits on form feeds, U+2028 and others, and the
    # line numbers would no longer be an editor's
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if _CONTROL.search(line):
            skipped.append(_control_character(number, line.split()[0], None))
            continue
        url, _, rest = line.replace("\t", " ").partition(" ")
        if "://" not in url:
            # not "URL NAME" at all ("not a url at all"): the line is reported whole, not its
            # first word as if it were the URL
            skipped.append(
                Skipped(
                    line=number,
                    reason=SkipReason.invalid_url,
                    url=line[:200],
                    name=None,
                    detail="the line does not start with an http(s) URL",
                )
            )
            continue
        entries.append(FeedEntry(line=number, url=url, name=_clean_name(rest)))
    return FeedList(format="urls", entries=tuple(entries), skipped=tuple(skipped))


def _control_character(line: int, url: str, name: str | None) -> Skipped:
    return Skipped(
        line=line,
        reason=SkipReason.invalid_url,
        url=_CONTROL.sub("?", url),
        name=name,
        detail="it holds a control character",
    )


def _clean_name(value: str | None) -> str | None:
    # Names land in one-line reports: runs of whitespace (newlines included) become one space.
    name = " ".join((value or "").split())
    return name or None


# --- OPML ----------------------------------------------------------------------------------------
def parse_opml(data: bytes) -> FeedList:
    """Every ``outline`` under ``body``, at any depth: one with an ``xmlUrl`` is a feed (named by
    its ``title``, else its ``text``); one without that holds outlines is a category (walked);
    any other is reported as ``missing_xmlurl``."""
    root, lines = _parse_xml(data)
    if root.tag != "opml":
        raise FeedListError(f"not an OPML document: its root element is <{root.tag}>", line=1)
    body = root.find("body")
    if body is None:
        raise FeedListError("not an OPML document: it has no <body>")
    entries: list[FeedEntry] = []
    skipped: list[Skipped] = []
    for outline in _outlines(body):
        line = lines[outline]
        attrs = {key.lower(): value for key, value in outline.attrib.items()}
        # readers write the name in both (OPML 2.0 requires `text`), some in only one; attribute
        # names are compared without case, as older exporters wrote `xmlurl`
        name = _clean_name(attrs.get("title")) or _clean_name(attrs.get("text"))
        url = attrs.get("xmlurl", "").strip()
        if url and _CONTROL.search(url):  # a character reference (&#10;) can put one there
            skipped.append(_control_character(line, url, name))
        elif url:
            entries.append(FeedEntry(line=line, url=url, name=name))
        elif len(outline) == 0:
            skipped.append(
                Skipped(
                    line=line,
                    reason=SkipReason.missing_xmlurl,
                    url=attrs.get("htmlurl") or attrs.get("url"),
                    name=name,
                    detail="an outline without xmlUrl (no feed) and without outlines inside",
                )
            )
    return FeedList(format="opml", entries=tuple(entries), skipped=tuple(skipped))


def _outlines(parent: ET.Element) -> Iterator[ET.Element]:
    """Outlines in document order, categories' children after the category itself."""
    for child in parent:
        if child.tag == "outline":
            yield child
            yield from _outlines(child)


def _refuse_doctype(*_: object) -> None:
    raise FeedListError("refused: the document has a DOCTYPE (OPML needs none; entities can bomb)")


def _refuse_entity(*_: object) -> None:
    raise FeedListError("refused: the document declares an entity")


def _parse_xml(data: bytes) -> tuple[ET.Element, dict[ET.Element, int]]:
    builder = ET.TreeBuilder()
    lines: dict[ET.Element, int] = {}
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse_doctype
    parser.EntityDeclHandler = _refuse_entity
    parser.UnparsedEntityDeclHandler = _refuse_entity

    def start(tag: str, attrs: dict[str, str]) -> None:
        lines[builder.start(tag, attrs)] = parser.CurrentLineNumber

    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    try:
        parser.Parse(data, True)
    except FeedListError as exc:
        if exc.line is None:
            raise FeedListError(str(exc), line=parser.CurrentLineNumber) from None
        raise
    except expat.ExpatError as exc:
        reason = expat.ErrorString(exc.code) or "malformed"
        raise FeedListError(
            f"not well-formed XML ({reason})", line=exc.lineno, column=exc.offset + 1
        ) from None
    return builder.close(), lines


# --- export --------------------------------------------------------------------------------------
# Characters XML 1.0 cannot carry even escaped; a name typed with one cannot go out as is.
_NOT_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def build_opml(feeds: Iterable[OpmlFeed], *, title: str, created: datetime) -> str:
    """An OPML 2.0 document, one ``type="rss"`` outline per feed; ElementTree does the escaping."""
    root = ET.Element("opml", version="2.0")
    head = ET.SubElement(root, "head")
    ET.SubElement(head, "title").text = title
    ET.SubElement(head, "dateCreated").text = format_datetime(created)
    body = ET.SubElement(root, "body")
    for feed in feeds:
        name = _NOT_XML.sub("", feed.name)
        ET.SubElement(
            body,
            "outline",
            type="rss",
            text=name,
            title=name,
            # a URL must survive as the same URL: what XML cannot hold is percent-encoded
            xmlUrl=_NOT_XML.sub(lambda m: "".join(f"%{b:02X}" for b in _utf8(m[0])), feed.feed_url),
        )
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _utf8(char: str) -> bytes:
    return char.encode("utf-8", "surrogatepass")
