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


LOOP_OF_CALLS = """\
async def tick(db: Database, conn: Tx, stopping: Event) -> None:
    while not stopping.is_set():
        if await is_due(db, conn):
            await send(db, conn)
            continue
        await rest(conn)
        await note(db)
"""

AFTER_A_DOCSTRING = '''\
def settle(rows: list[Row]) -> int:
    """Settle each row.

    Failed rows are retried.
    """
    done = 0
    for row in rows:
        if row.failed:
            retry(row)
        done += 1
    return done
'''

COMPUTED_RECORD = """\
def report(rows: list[Row], now: datetime) -> list[Report]:
    return [
        Report(
            late=now - r.at if r.at else None,
            flags=[f for f in r.flags if f],
            total=sum(x.n for x in r.parts),
            label=r.name.strip().lower(),
        )
        for r in rows
    ]
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


def test_conditions_and_loops_are_logic_even_when_their_calls_look_like_declarations(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, "loop.py", LOOP_OF_CALLS)
    assert is_logic(path, 2, 7)  # a loop, a condition, calls of positional names


def test_a_run_that_starts_inside_a_docstring_still_sees_the_code_after_it(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, "doc.py", AFTER_A_DOCSTRING)
    assert is_logic(path, 4, 11)
    assert not is_logic(path, 1, 5)  # the signature and the docstring alone


def test_a_record_built_from_computed_values_is_logic(tmp_path: Path) -> None:
    path = _write(tmp_path, "computed.py", COMPUTED_RECORD)
    assert is_logic(path, 2, 10)


def test_a_run_of_nothing_counted_is_not_logic(tmp_path: Path) -> None:
    path = _write(tmp_path, "blank.py", "x = (\n    # a comment\n\n    1\n)\n")
    assert not is_logic(path, 2, 3)  # a comment and a blank line
