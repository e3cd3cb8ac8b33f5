"""The reference pages that only a database can check: every table, column and function of
nightcrew's own schemas is in docs/reference/data-model.md, and every field the lanes' and the
reconciler's JSON reports carry is in docs/reference/reports.md (tests/unit/test_docs.py checks
the rest of the reference)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.test_cli import _env, run
from tests.unit.test_docs import named

pytestmark = pytest.mark.acceptance

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
OWN_SCHEMAS = ("nightcrew", "news")


def _table_sections(text: str) -> dict[str, str]:
    """``### `schema.table` `` sections, by their table."""
    sections: dict[str, str] = {}
    for part in re.split(r"^### ", text, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        sections[heading.strip().strip("`").split("`")[0]] = body.split("\n## ", 1)[0]
    return sections


def test_every_table_column_and_function_of_nightcrews_schemas_is_in_the_data_model(
    fresh_db_url: str,
) -> None:
    with psycopg.connect(fresh_db_url) as conn:
        columns = conn.execute(
            "SELECT c.table_schema || '.' || c.table_name, c.column_name"
            "  FROM information_schema.columns c"
            "  JOIN information_schema.tables t USING (table_schema, table_name)"
            " WHERE c.table_schema = ANY(%s) AND t.table_type = 'BASE TABLE'",
            [list(OWN_SCHEMAS)],
        ).fetchall()
        functions = conn.execute(
            "SELECT n.nspname || '.' || p.proname FROM pg_proc p"
            "  JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = ANY(%s) AND p.prorettype <> 'trigger'::regtype",
            [list(OWN_SCHEMAS)],
        ).fetchall()
    text = (REFERENCE / "data-model.md").read_text(encoding="utf-8")
    sections = _table_sections(text)
    missing = sorted(
        {f"table {table}" for table, _ in columns if table not in sections}
        | {
            f"{table}.{column}"
            for table, column in columns
            if table in sections and not named(sections[table], column)
        }
        | {f"function {name}" for (name,) in functions if not named(text, name)}
    )
    assert len(columns) > 50 and len(functions) >= 5
    assert missing == [], "docs/reference/data-model.md lacks: " + ", ".join(missing)


def _keys(value: Any) -> Iterator[str]:
    """Every member name of a JSON document, at any depth."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from _keys(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _keys(inner)


def test_every_field_of_the_lanes_and_the_reconcilers_reports_is_in_the_reference(
    fresh_db_url: str, tmp_path: Path
) -> None:
    env = _env(
        DATABASE_URL=fresh_db_url,
        STORAGE_URL=f"file://{tmp_path}",
        R2_PUBLIC_URL="https://media.example.test",
    )
    reports = []
    for args in (
        ("lifecycle", "run", "minute", "--json"),
        ("lifecycle", "run", "daily", "--dry-run", "--json"),
        ("lifecycle", "reconcile", "--json"),
    ):
        result = run(*args, env=env)
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    # the daily lane's reconciler skipped, as it is without R2_PUBLIC_URL: its own report's keys
    bare = _env(DATABASE_URL=fresh_db_url)
    skipped = run("lifecycle", "run", "daily", "--dry-run", "--json", env=bare)
    assert skipped.returncode == 0, skipped.stderr
    reports.append(json.loads(skipped.stdout))

    text = (REFERENCE / "reports.md").read_text(encoding="utf-8")
    fields = {key for report in reports for key in _keys(report)}
    assert {"lane", "jobs", "sizeBackfill", "orphans", "effects_delivered"} <= fields
    assert sorted(f for f in fields if not named(text, f)) == []
