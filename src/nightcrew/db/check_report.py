"""What `nightcrew db check` found: one record per table, function and the role, and the
report that says them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class TableCheck:
    name: str
    problems: list[str] = field(default_factory=list)
    # what the role may not do with it (grants, row-level security)
    privileges: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    # what was accepted although it differs from the reference (an index under another name)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.privileges

    @property
    def missing(self) -> bool:
        return self.problems == [f"table {self.name}: missing"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FunctionCheck:
    name: str
    expected: str  # "(uuid, text) → numeric"
    found: list[str]  # every signature of that name, as "(…) → …"
    problems: list[str] = field(default_factory=list)
    privileges: list[str] = field(default_factory=list)  # EXECUTE

    @property
    def ok(self) -> bool:
        return not self.problems and not self.privileges

    @property
    def missing(self) -> bool:
        return not self.found


@dataclass(frozen=True, kw_only=True, slots=True)
class RoleCheck:
    """The role nightcrew connects as, and what it may not do beyond single tables and
    functions (schemas, temporary tables, the migrations table)."""

    name: str
    superuser: bool
    bypassrls: bool
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckReport:
    tables: list[TableCheck]
    functions: list[FunctionCheck]
    role: RoleCheck
    # what belongs to no table: the functions' mismatches and privileges, the role's, then
    # unapplied migrations
    problems: list[str]
    pending_migrations: list[str]

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and all(t.ok for t in self.tables)
            and all(f.ok for f in self.functions)
        )

    @property
    def mismatches(self) -> list[str]:
        """Every mismatch, one line each."""
        lines = [p for t in self.tables for p in (*t.problems, *t.privileges)]
        return lines + self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "role": {
                "name": self.role.name,
                "superuser": self.role.superuser,
                "bypassrls": self.role.bypassrls,
                "problems": self.role.problems,
            },
            "tables": {
                t.name: {
                    "ok": t.ok,
                    "missing": t.missing,
                    "problems": t.problems,
                    "privileges": t.privileges,
                    "advice": t.advice,
                    "notes": t.notes,
                }
                for t in self.tables
            },
            "functions": {
                f.name: {
                    "ok": f.ok,
                    "missing": f.missing,
                    "expected": f.expected,
                    "found": f.found,
                    "problems": f.problems,
                    "privileges": f.privileges,
                }
                for f in self.functions
            },
            "problems": self.problems,
            "pending_migrations": self.pending_migrations,
        }
