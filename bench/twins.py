"""The twins in ``src/``: which of the pairs ``duplicates`` finds repeat logic.

    python -m bench.twins            # every pair, each marked "logic" or "declaration"
    python -m bench.twins --check    # exit 1 when a pair repeats logic

``duplicates`` (the team's tool, on PATH where it is installed) lists the places that share six
or more lines of the same shape. Beside typed records most of them are declarations that only
look alike: two records' fields (``id: UUID`` / ``kind: str``), two functions' signatures, two
tables of routes or jobs, two calls that build a record from keyword arguments. A run is marked
``declaration`` when most of the lines it counts lie in one of those (or in a module's
constants and imports); ``logic`` when at least half are anything else: a condition, a loop, a
statement's work, SQL. A pair is logic when either of its runs is.
Boilerplate rows and migrations are left out, as in the records-and-rooms target.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
_ROW = re.compile(r"^(D\d+) (\S+):(\d+)-(\d+) ~ (\S+):(\d+)-(\d+)(.*)$")
# lines duplicates passes over: blank, comments, lone punctuation, imports
_PASSED_OVER = re.compile(r"^(#.*|[\s()\[\]{},:;]*|(from \S+ )?import .*)$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Twin:
    row: str
    left: str
    right: str
    logic: bool


def _simple(node: ast.expr) -> bool:
    """A positional argument a table entry may hold: a value, a name, or a call of those."""
    if isinstance(node, ast.Constant | ast.Name | ast.Attribute):
        return True
    if isinstance(node, ast.Call):
        return all(_simple(a) for a in node.args) and all(_simple(k.value) for k in node.keywords)
    return isinstance(node, ast.List | ast.Tuple) and all(_simple(e) for e in node.elts)


def _span(node: ast.AST) -> range:
    start = getattr(node, "lineno", 0)
    return range(start, (getattr(node, "end_lineno", None) or start) + 1)


@cache
def declaration_lines(path: Path) -> frozenset[int]:
    """The lines of a Python module that declare rather than compute."""
    lines: set[int] = set()
    module = ast.parse(path.read_text(encoding="utf-8"))
    for statement in module.body:  # a module's constants
        if isinstance(statement, ast.Assign | ast.AnnAssign) and (
            statement.value is None or _simple(statement.value)
        ):
            lines.update(_span(statement))
    for node in ast.walk(module):
        if isinstance(node, ast.Import | ast.ImportFrom):
            lines.update(_span(node))
        elif isinstance(node, ast.ClassDef):
            for d in node.decorator_list:
                lines.update(_span(d))
            lines.add(node.lineno)
            for statement in node.body:  # fields and the docstring, not the methods' bodies
                if isinstance(statement, ast.AnnAssign | ast.Assign | ast.Expr | ast.Pass):
                    lines.update(_span(statement))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                lines.update(_span(d))
            body = node.body
            lines.update(range(node.lineno, body[0].lineno))  # the signature
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                lines.update(_span(first))  # the docstring
        elif isinstance(node, ast.Call) and all(_simple(a) for a in node.args):
            # a record built from keyword arguments, a table's entry, a log event's fields
            lines.update(_span(node))
        elif (
            isinstance(node, ast.ListComp)
            and isinstance(node.elt, ast.Call)
            and all(_simple(a) for a in node.elt.args)
            and not any(g.ifs for g in node.generators)
        ):  # a record built from each row
            lines.update(_span(node))
    return frozenset(lines)


def is_logic(path: Path, first: int, last: int) -> bool:
    """Whether at least half the lines ``duplicates`` counts in this run are not declarations."""
    if path.suffix != ".py":
        return True  # SQL is statements, whatever its shape
    text = path.read_text(encoding="utf-8").splitlines()
    declared = declaration_lines(path)
    in_docstring = False
    counted = logic = 0
    for number in range(first, last + 1):
        line = text[number - 1].strip()
        if line.count('"""') == 1:
            in_docstring = not in_docstring
            continue
        if in_docstring or _PASSED_OVER.match(line):
            continue
        counted += 1
        logic += number not in declared
    return 2 * logic >= counted


def find_twins(root: Path = SRC) -> list[Twin]:
    tool = shutil.which("duplicates")
    if tool is None:
        raise SystemExit("bench.twins: the `duplicates` command is not on PATH")
    answer = subprocess.run(
        [tool, "--repo", str(root), "--most", "200", "--seconds", "120"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "incomplete:" in answer:
        raise SystemExit(f"bench.twins: duplicates did not finish: {answer.splitlines()[-1]}")
    twins = []
    for line in answer.splitlines():
        match = _ROW.match(line)
        if match is None or "boilerplate" in match[8] or "migrations/" in line:
            continue
        sides = [(match[2], int(match[3]), int(match[4])), (match[5], int(match[6]), int(match[7]))]
        logic = any(is_logic(root / name, first, last) for name, first, last in sides)
        twins.append(
            Twin(
                row=match[1],
                left=f"{match[2]}:{match[3]}-{match[4]}",
                right=f"{match[5]}:{match[6]}-{match[7]}",
                logic=logic,
            )
        )
    return twins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a pair repeats logic")
    args = parser.parse_args(argv)
    twins = find_twins()
    for twin in twins:
        kind = "logic" if twin.logic else "declaration"
        print(f"  {twin.row:4} {kind:11}  {twin.left} ~ {twin.right}")
    logic = sum(t.logic for t in twins)
    print(
        f"src/: {len(twins)} pairs outside boilerplate and migrations: "
        f"{logic} repeat logic, {len(twins) - logic} declarations"
    )
    return 1 if args.check and logic else 0


if __name__ == "__main__":
    sys.exit(main())
