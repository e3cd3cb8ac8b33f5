"""Named SQL queries kept in ``.sql`` files beside the code that runs them.

A file holds blocks introduced by ``-- name: <query_name>``; everything up to the next header is
the query. Parameters are psycopg named placeholders (``%(now)s``); ``now`` is always a parameter
so that every time-based decision follows the Clock, never the database's ``now()``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import LiteralString

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.M)


class Queries:
    def __init__(self, source: Path, queries: dict[str, str]) -> None:
        self.source = source
        self._queries = queries

    def __getitem__(self, name: str) -> LiteralString:
        # A literal all the same: the text of a .sql file shipped beside the code, never input.
        # (mypy reads LiteralString as str; ruff's S608 refuses SQL built from strings.)
        try:
            return self._queries[name]
        except KeyError:
            raise KeyError(f"no query named {name!r} in {self.source.name}") from None

    def names(self) -> list[str]:
        return list(self._queries)


def parse_queries(text: str, source: Path) -> Queries:
    headers = list(_HEADER.finditer(text))
    if not headers:
        raise ValueError(f"{source}: no '-- name: …' header")
    queries: dict[str, str] = {}
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        body = text[header.end() : end].strip()
        name = header["name"]
        if not body:
            raise ValueError(f"{source}: query {name!r} is empty")
        if name in queries:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        queries[name] = body
    return Queries(source, queries)


def load_queries(module_file: str) -> Queries:
    """Load the ``.sql`` file that sits beside a module: ``load_queries(__file__)``."""
    path = Path(module_file).with_suffix(".sql")
    return parse_queries(path.read_text(encoding="utf-8"), path)
