"""The twins in ``src/``: which of the pairs ``duplicates`` finds repeat logic.

    python -m bench.twins            # every pair, each marked "logic" or "declaration"
    python -m bench.twins --check    # exit 1 when a pair repeats logic

``duplicates`` (the team's tool, on PATH where it is installed) lists the places that share six
or more lines of the same shape. Beside typed records most of them are declarations that only
look alike: two records' fields (``id: UUID`` / ``kind: str``), two functions' signatures, two
tables of routes or jobs, two calls that build a record from keyword arguments. A run is marked
``declaration`` when most of the lines it counts lie in one of those (or in a module's
constants and imports); ``logic`` when at least half are anything else: a condition, a loop, a
statement's work, SQL. A pair is logic when either of its runs is. Boilerplate rows and
migrations are left out, as in the records-and-rooms target.

``duplicates`` names one run of each pair, its longest; a pair's other runs (``+N more runs``)
are not read here. A list it had to cut short (``+N more pairs``) stops the script.
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
    """A value a declaration may hold: a constant, a name, an f-string, or a call, a container
    or a negation of those."""
    if isinstance(node, ast.Constant | ast.Name | ast.Attribute | ast.JoinedStr):
        return True
    if isinstance(node, ast.UnaryOp):
        return _simple(node.operand)
    if isinstance(node, ast.Call):
        return all(_simple(a) for a in node.args) and all(_simple(k.value) for k in node.keywords)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return all(_simple(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is None or _simple(k) for k in node.keys) and all(
            _simple(v) for v in node.values
        )
    return False


def _span(node: ast.AST) -> range:
    start = getattr(node, "lineno", 0)
    return range(start, (getattr(node, "end_lineno", None) or start) + 1)


def _header(node: ast.stmt) -> range:
    """The lines of a compound statement before its body: a class's or a function's name and
    signature, an ``if``'s condition, a loop's iteration."""
    body: list[ast.stmt] = getattr(node, "body", [])
    first = body[0].lineno if body else node.lineno + 1
    return range(node.lineno, max(first, node.lineno + 1))


def _constant(statement: ast.stmt) -> bool:
    """A name given a plain value, or only a type: a module's constant, a record's field."""
    return isinstance(statement, ast.Assign | ast.AnnAssign) and (
        statement.value is None or _simple(statement.value)
    )


def _docstring(body: list[ast.stmt]) -> ast.stmt | None:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return first
    return None


@cache
def declaration_lines(path: Path) -> frozenset[int]:
    """The lines of a Python module that declare rather than compute: imports, constants,
    docstrings, record fields, signatures, and calls that build a record or a table's entry from
    keyword arguments (the lines of the arguments that are values, not computations)."""
    module = ast.parse(path.read_text(encoding="utf-8"))
    declared: set[int] = set()
    logic: set[int] = set()  # a condition or a loop's head, whatever its calls look like
    parents = {child: node for node in ast.walk(module) for child in ast.iter_child_nodes(node)}
    for statement in module.body:  # a module's constants
        if _constant(statement):
            declared.update(_span(statement))
    for node in ast.walk(module):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = _docstring(node.body)
            if docstring is not None:
                declared.update(_span(docstring))
        if isinstance(node, ast.Import | ast.ImportFrom):
            declared.update(_span(node))
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                declared.update(_span(d))
            declared.update(_header(node))
            if isinstance(node, ast.ClassDef):
                for statement in node.body:  # fields, not the methods' bodies
                    if _constant(statement) or isinstance(statement, ast.Pass):
                        declared.update(_span(statement))
        elif isinstance(
            node, ast.If | ast.While | ast.For | ast.AsyncFor | ast.With | ast.AsyncWith | ast.Try
        ):
            logic.update(_header(node))
        elif (
            isinstance(node, ast.Call)
            and all(_simple(a) for a in node.args)
            and (node.keywords or isinstance(parents.get(node), ast.List | ast.Tuple))
        ):
            # a record built from keyword arguments, a table's entry, a log event's fields
            declared.add(node.lineno)
            for a in node.args:
                declared.update(_span(a))
            for k in node.keywords:
                if _simple(k.value):
                    declared.update(_span(k.value))
        elif isinstance(node, ast.comprehension) and _simple(node.iter) and not node.ifs:
            declared.update(_span(node))  # ``for row in rows``, building a record from each
    return frozenset(declared - logic)


def is_logic(path: Path, first: int, last: int) -> bool:
    """Whether at least half the lines ``duplicates`` counts in this run are not declarations
    (a run of nothing but passed-over lines is not)."""
    if path.suffix != ".py":
        return True  # SQL is statements, whatever its shape
    text = path.read_text(encoding="utf-8").splitlines()
    declared = declaration_lines(path)
    counted = [n for n in range(first, last + 1) if not _PASSED_OVER.match(text[n - 1].strip())]
    logic = sum(n not in declared for n in counted)
    return bool(counted) and 2 * logic >= len(counted)


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
    if "incomplete:" in answer or re.search(r"\(\+\d+ more pairs\)", answer):
        last = answer.splitlines()[-1]
        raise SystemExit(f"bench.twins: duplicates did not list every pair: {last}")
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
