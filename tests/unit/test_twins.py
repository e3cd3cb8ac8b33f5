"""``bench.twins`` tells a twin of logic from declarations that only look alike."""

from __future__ import annotations

from pathlib import Path

from bench.twins import is_logic

RECORDS = '''\
LIMIT = 40


@dataclass(frozen=True, kw_only=True, slots=True)
class Due:
    """A row of due_things."""

    id: UUID
    slug: str
    at: datetime


def build(row: Due, now: datetime) -> Report:
    return Report(
        id=row.id,
        slug=row.slug,
        at=now,
        late=None if row.at is None else now - row.at,
    )
'''

LOGIC = """\
async def settle(db: Database, rows: list[Row]) -> int:
    done = 0
    for row in rows:
        if row.failed:
            await db.execute(SQL["retry"], {"id": row.id})
            continue
        done += 1
    return done
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_record_fields_constants_and_a_keyword_built_record_are_declarations(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, "records.py", RECORDS)
    assert not is_logic(path, 1, 10)  # a constant, the decorator, the class and its fields
    assert not is_logic(path, 13, 19)  # the signature and the record built from keywords


def test_a_loop_with_its_conditions_is_logic(tmp_path: Path) -> None:
    path = _write(tmp_path, "logic.py", LOGIC)
    assert is_logic(path, 1, 8)
    assert is_logic(path, 2, 8)  # without the signature


def test_a_run_mostly_of_declarations_with_one_statement_is_a_declaration(tmp_path: Path) -> None:
    text = "def prefix(podcast_id: str) -> str:\n    return f'podcasts/{podcast_id}/'\n\n\n"
    path = _write(tmp_path, "mixed.py", text + RECORDS)
    assert not is_logic(path, 2, 14)  # one statement, then a constant and a record
    assert is_logic(path, 1, 2)  # a signature and one statement: half is logic enough
    assert is_logic(path, 2, 2)  # the statement alone


def test_sql_is_logic_whatever_its_shape(tmp_path: Path) -> None:
    path = _write(tmp_path, "queries.sql", "SELECT 1;\nSELECT 2;\n")
    assert is_logic(path, 1, 2)
