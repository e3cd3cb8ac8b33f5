"""The shape of ``src/``: how big its rooms are and how typed its records.

    python -m bench.shape            # the counts, and the targets they are held to
    python -m bench.shape --check    # exit 1 when a target is missed (tests/unit/test_shape.py)

What is counted:

- ``row["…"]`` subscripts: a string-keyed subscript of ``row`` or of a name ending in
  ``_row`` (a database row as a dict) — what a typed record replaces;
- ``dict[str, Any]`` spelled in annotations and aliases — and, beside it (no target, so that
  a rename cannot pass for typing), the uses of its two aliases: ``JsonObject`` (a JSON
  document: a report, a message body) and ``Row`` (a row not yet a record);
- modules over 600 lines, functions over 120 lines, functions with more than 6 parameters
  (``self`` and ``cls`` not counted).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "nightcrew"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120
MAX_PARAMETERS = 6


@dataclass
class Shape:
    row_subscripts: int = 0
    dict_any: int = 0
    json_object: int = 0  # ``JsonObject`` spelled (its definition included)
    row_alias: int = 0  # ``Row`` spelled as a name
    long_modules: list[tuple[str, int]] = field(default_factory=list)
    long_functions: list[tuple[str, int]] = field(default_factory=list)
    wide_functions: list[tuple[str, int]] = field(default_factory=list)
    lines: int = 0


def _is_row(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and (node.id == "row" or node.id.endswith("_row"))


def measure(root: Path = SRC) -> Shape:
    shape = Shape()
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(root.parent))
        lines = text.count("\n")
        shape.lines += lines
        shape.dict_any += text.count("dict[str, Any]")
        shape.json_object += len(re.findall(r"\bJsonObject\b", text))
        shape.row_alias += len(re.findall(r"\bRow\b", text))
        if lines > MAX_MODULE_LINES:
            shape.long_modules.append((name, lines))
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Subscript)
                and _is_row(node.value)
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                shape.row_subscripts += 1
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where = f"{name}:{node.lineno} {node.name}"
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    shape.long_functions.append((where, length))
                arguments = node.args
                every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                count = len([a for a in every if a.arg not in ("self", "cls")])
                if count > MAX_PARAMETERS:
                    shape.wide_functions.append((where, count))
    return shape


# (what, measured, target): the targets of the "records and rooms" work
def targets(shape: Shape) -> list[tuple[str, int, int]]:
    return [
        ('row["…"] subscripts', shape.row_subscripts, 30),
        ("dict[str, Any] spelled", shape.dict_any, 60),
        (f"modules over {MAX_MODULE_LINES} lines", len(shape.long_modules), 0),
        (f"functions over {MAX_FUNCTION_LINES} lines", len(shape.long_functions), 0),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    shape = measure()
    print(f"src/nightcrew: {shape.lines} lines")
    missed = 0
    for what, measured, target in targets(shape):
        mark = "ok" if measured <= target else "MISSED"
        missed += measured > target
        print(f"  {what:32} {measured:5}   target <= {target:<4} {mark}")
    print(f"  JsonObject spelled (documents)   {shape.json_object:5}")
    print(f"  Row spelled (rows as dicts)      {shape.row_alias:5}")
    print(f"  functions over {MAX_PARAMETERS} parameters     {len(shape.wide_functions):5}")
    for title, rows in (
        ("modules", shape.long_modules),
        ("functions", shape.long_functions),
        ("parameters", shape.wide_functions),
    ):
        for where, n in sorted(rows, key=lambda x: -x[1]):
            print(f"    {title:10} {n:5}  {where}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
