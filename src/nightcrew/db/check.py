"""``db check``: the live catalog compared with the contract (``nightcrew.db.contract``).

Columns, functions, triggers and indexes are read from pg_catalog (not information_schema,
which hides what the role may not use), and so is what the connecting role may do. Each
mismatch is one line naming the object, what was expected and what was found.
"""

from __future__ import annotations

from dataclasses import dataclass

from nightcrew.db.check_report import CheckReport, FunctionCheck, RoleCheck, TableCheck
from nightcrew.db.contract import (
    FUNCTIONS,
    RECOMMENDED_INDEXES,
    REQUIRED_INDEXES,
    RLS_HINT,
    TABLES,
    TRIGGERS,
    WRITES,
    FunctionSpec,
    LiveType,
    UniqueIndex,
    column_rule,
    result_rule,
    signature_text,
)
from nightcrew.db.database import Database
from nightcrew.db.migrate import applied_migrations, discover_migrations
from nightcrew.db.queries import load_queries

SQL = load_queries(__file__)


@dataclass(frozen=True, kw_only=True, slots=True)
class _RoleRow:
    name: str
    superuser: bool
    bypassrls: bool
    database: str
    temporary: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class _RelationRow:
    tbl: str
    owned: bool
    rls: bool
    forced: bool
    open_policy: bool
    granted: list[bool]  # one per _PRIVILEGES


@dataclass(frozen=True, kw_only=True, slots=True)
class _ColumnRow:
    tbl: str
    column_name: str
    data_type: str
    is_enum: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class _IndexRow:
    name: str
    tbl: str
    columns: list[str]
    is_unique: bool
    predicate: str | None
    is_constraint: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class _TriggerRow:
    tgname: str
    tbl: str


@dataclass(frozen=True, kw_only=True, slots=True)
class _FunctionRow:
    fn: str
    args: list[str]
    result: str
    defaults: int
    retset: bool
    rettype: str
    columns: list[list[str]] | None  # [name, type] of each result column (None: none)
    executable: bool


async def check_schema(db: Database) -> CheckReport:
    role_row = await db.fetch_one_as(_RoleRow, SQL["role"])
    assert role_row is not None
    role = role_row.name

    relations = {
        r.tbl: LiveRelation(
            owned=r.owned,
            rls=r.rls,
            forced=r.forced,
            open_policy=r.open_policy,
            granted=frozenset(p for p, ok in zip(_PRIVILEGES, r.granted, strict=True) if ok),
        )
        for r in await db.fetch_as(_RelationRow, SQL["relations"], {"tables": list(TABLES)})
    }
    live: dict[str, dict[str, LiveType]] = {}
    for c in await db.fetch_as(_ColumnRow, SQL["columns"], {"tables": list(TABLES)}):
        live.setdefault(c.tbl, {})[c.column_name] = LiveType(c.data_type, c.is_enum)

    indexes = [
        LiveIndex(
            name=i.name,
            table=i.tbl,
            columns=tuple(i.columns),
            unique=i.is_unique,
            predicate=i.predicate,
            constraint=i.is_constraint,
        )
        for i in await db.fetch_as(_IndexRow, SQL["indexes"], {"tables": list(TABLES)})
    ]

    triggers = await db.fetch_as(
        _TriggerRow,
        SQL["triggers"],
        {"names": [name for _, name in TRIGGERS]},
    )
    live_triggers: dict[str, list[str]] = {}
    for t in triggers:
        live_triggers.setdefault(t.tgname, []).append(t.tbl)

    access = Access(role=role, superuser=role_row.superuser, bypassrls=role_row.bypassrls)
    reports = [
        _check_table(
            table,
            wanted,
            live.get(table),
            indexes,
            live_triggers,
            relations.get(table),
            access,
        )
        for table, wanted in TABLES.items()
    ]

    overloads = await _live_functions(db)
    functions = [_check_function(spec, overloads.get(spec.name, []), role) for spec in FUNCTIONS]
    problems = [p for f in functions for p in (*f.problems, *f.privileges)]

    role_problems, pending = await _role_and_migrations(db, role_row)
    problems.extend(role_problems)
    if pending:
        problems.append("nightcrew migrations not applied: " + ", ".join(pending))
    return CheckReport(
        tables=reports,
        functions=functions,
        role=RoleCheck(
            name=role,
            superuser=role_row.superuser,
            bypassrls=role_row.bypassrls,
            problems=role_problems,
        ),
        problems=problems,
        pending_migrations=pending,
    )


async def _live_functions(db: Database) -> dict[str, list[LiveFunction]]:
    """The functions the spec names, as the database has them: every overload, by name."""
    found = await db.fetch_as(
        _FunctionRow, SQL["functions"], {"names": [fn.name for fn in FUNCTIONS]}
    )
    overloads: dict[str, list[LiveFunction]] = {}
    for f in found:
        overloads.setdefault(f.fn, []).append(
            LiveFunction(
                args=tuple(f.args),
                result=f.result,
                defaults=f.defaults,
                retset=f.retset,
                returns=LiveType(f.rettype),
                columns=tuple((name, LiveType(type_)) for name, type_ in f.columns or []),
                executable=f.executable,
            )
        )
    return overloads


async def _role_and_migrations(db: Database, role_row: _RoleRow) -> tuple[list[str], list[str]]:
    """What the role lacks (schema USAGE, TEMPORARY, reading the migrations), and the
    nightcrew migrations not applied."""
    role = role_row.name
    role_problems = [
        f"schema {schema}: role {role} lacks the USAGE privilege"
        for schema in await db.fetch_values(
            str,
            SQL["schemas_without_usage"],
            {"schemas": sorted({t.split(".")[0] for t in TABLES} | _function_schemas())},
        )
    ]
    if not role_row.temporary:
        role_problems.append(
            f"database {role_row.database}: role {role} lacks the TEMPORARY privilege"
            " (the reconciler lists the store into temporary tables)"
        )
    readable = await db.fetch_value(bool, SQL["migrations_table"])
    if readable is False:  # None: there is no such table yet
        role_problems.append(
            f"table nightcrew.schema_migrations: role {role} lacks the SELECT privilege"
            " (which migrations are applied cannot be told)"
        )
        return role_problems, []
    applied = await applied_migrations(db)
    pending = [
        m.label
        for m in discover_migrations()
        if m.scope == "nightcrew" and m.version not in applied
    ]
    return role_problems, pending


def _function_schemas() -> set[str]:
    return {fn.name.split(".")[0] for fn in FUNCTIONS}


# --- the role ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Access:
    role: str
    superuser: bool
    bypassrls: bool


# --- functions, live -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveFunction:
    args: tuple[str, ...]
    result: str  # pg_get_function_result
    defaults: int
    retset: bool = False
    returns: LiveType = LiveType("")  # noqa: RUF009 (frozen: one shared instance is fine)
    columns: tuple[tuple[str, LiveType], ...] = ()  # a row result's columns
    executable: bool = True

    @property
    def signature(self) -> str:
        result = self.result
        if self.columns and not result.startswith("TABLE("):
            # OUT parameters print as "record", a row type by its name: show the columns
            cols = ", ".join(f"{name} {type_.describe()}" for name, type_ in self.columns)
            result = f"{result} ({cols})"
        return signature_text(self.args, result)

    def reachable_with(self, args: tuple[str, ...]) -> bool:
        """Would a call with exactly these argument types also resolve to this function (the
        missing trailing arguments taking their defaults)?"""
        n = len(args)
        return len(self.args) > n and self.args[:n] == args and len(self.args) - self.defaults <= n


def _result_mismatch(spec: FunctionSpec, found: LiveFunction) -> str | None:
    """Why ``found``'s result will not do for the way nightcrew calls ``spec``, or None."""
    if spec.columns:
        # read by name (`SELECT deleted, skipped FROM f(…)`): one row or a set, any column order,
        # more columns are fine
        if not found.columns:
            return f"columns {', '.join(n for n, _ in spec.columns)} expected"
        have = dict(found.columns)
        reasons: list[str] = []
        for name, reference in spec.columns:
            rule = result_rule(spec, reference)
            if name not in have:
                reasons.append(f"no column {name}")
            elif not rule.admits(have[name]):
                reasons.append(f"column {name} must be {rule.describe()}")
        return "; ".join(reasons) or None
    # called for one value (`SELECT f(…)`, inside CASE): not a set, not a row
    if found.retset or found.columns:
        return "one value expected, not a set or a row"
    rule = result_rule(spec, spec.result)
    if not rule.admits(found.returns):
        return f"the result must be {rule.describe()}"
    return None


def _check_function(spec: FunctionSpec, found: list[LiveFunction], role: str) -> FunctionCheck:
    problems: list[str] = []
    privileges: list[str] = []
    exact = [f for f in found if f.args == spec.args]
    hint = " (nightcrew's migrations are not applied: run `nightcrew db migrate`)"
    after = hint if spec.nightcrew else ""
    if not found:
        problems.append(
            f"function {spec.name}({', '.join(spec.args)}): missing — {spec.purpose}{after}"
        )
    elif not exact:
        others = "; ".join(f.signature for f in found)
        problems.append(f"function {spec.name}: expected {spec.signature}, found {others}{after}")
    elif (why := _result_mismatch(spec, exact[0])) is not None:
        problems.append(
            f"function {spec.name}: expected {spec.signature},"
            f" found {exact[0].signature} ({why}){after}"
        )
    else:
        # An overload whose extra arguments all have defaults makes the spec's call ambiguous
        # ("function … is not unique").
        shadows = [f for f in found if f.reachable_with(spec.args)]
        if shadows:
            others = "; ".join(f"{f.signature} with defaults" for f in shadows)
            problems.append(
                f"function {spec.name}: expected {spec.signature} alone, found also {others},"
                f" which makes a call with ({', '.join(spec.args)}) ambiguous"
            )
    if exact and not exact[0].executable:
        # Supabase revokes EXECUTE from PUBLIC on many functions: the call fails with 42501
        privileges.append(
            f"function {spec.name}({', '.join(spec.args)}): role {role} lacks the EXECUTE privilege"
        )
    return FunctionCheck(
        name=spec.name,
        expected=spec.signature,
        found=[f.signature for f in found],
        problems=problems,
        privileges=privileges,
    )


# --- tables, triggers, indexes -------------------------------------------------------------------

_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveRelation:
    owned: bool
    rls: bool
    forced: bool
    open_policy: bool
    granted: frozenset[str]


def _privilege_problems(table: str, relation: LiveRelation, access: Access) -> list[str]:
    lines: list[str] = []
    needed = ("SELECT", *WRITES.get(table, ()))
    lacking = [p for p in needed if p not in relation.granted]
    if lacking:
        plural = "s" if len(lacking) > 1 else ""
        lines.append(
            f"table {table}: role {access.role} lacks the {', '.join(lacking)} privilege{plural}"
        )
    # Row-level security filters every read and write to the rows a policy lets through, and
    # silently: no error, the lanes just find nothing. A superuser and a BYPASSRLS role are
    # never subject to it; the owner only when it is forced.
    hidden = (
        relation.rls
        and not access.superuser
        and not access.bypassrls
        and (relation.forced or not relation.owned)
        and not relation.open_policy
    )
    if hidden:
        lines.append(
            f"table {table}: row-level security hides rows from role {access.role} ({RLS_HINT})"
        )
    return lines


def _check_table(
    table: str,
    wanted: dict[str, str],
    have: dict[str, LiveType] | None,
    indexes: list[LiveIndex],
    live_triggers: dict[str, list[str]],
    relation: LiveRelation | None,
    access: Access,
) -> TableCheck:
    if relation is None:
        # One line: its columns, trigger and indexes are missing with it.
        return TableCheck(name=table, problems=[f"table {table}: missing"])
    have = have or {}
    problems: list[str] = []
    advice: list[str] = []
    notes: list[str] = []
    for column, reference in wanted.items():
        qualified = f"{table}.{column}"
        rule = column_rule(table, column, reference)
        found = have.get(column)
        if found is None:
            problems.append(f"column {qualified}: missing, expected {reference}")
        elif not rule.admits(found):
            problems.append(f"column {qualified}: {rule.mismatch(found)}")
        elif found.enum or found.name != reference:
            # e.g. Supabase's auth.users.email varchar(255): read as text, the same value
            notes.append(f"column {qualified}: {found.describe()}, accepted as {reference}")
    for owner, trigger in TRIGGERS:
        if owner != table:
            continue
        on = live_triggers.get(trigger, [])
        if table in on:
            if not (access.superuser or relation.owned):
                advice.append(
                    f"trigger {trigger}: role {access.role} does not own {table}, so"
                    " `lifecycle reconcile --bypass-cap-for-backfill` cannot disable it and"
                    " writes under the cap instead"
                )
            continue
        if on:
            problems.append(f"trigger {trigger}: expected on {table}, found on {', '.join(on)}")
        else:
            problems.append(f"trigger {trigger} on {table}: missing")
    own = [i for i in indexes if i.table == table]
    for unique in REQUIRED_INDEXES:
        if unique.table != table:
            continue
        problem, note = _check_unique(unique, own)
        if problem:
            problems.append(problem)
        if note:
            notes.append(note)
    names = {i.name for i in own}
    for index, owner in RECOMMENDED_INDEXES.items():
        if owner == table and index not in names:
            advice.append(f"index {index} is missing: its sweep will scan the table")
    return TableCheck(
        name=table,
        problems=problems,
        privileges=_privilege_problems(table, relation, access),
        advice=advice,
        notes=notes,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveIndex:
    name: str
    table: str
    columns: tuple[str, ...]
    unique: bool
    predicate: str | None
    constraint: bool

    def describe(self) -> str:
        shape = f"{self.name} {'UNIQUE ' if self.unique else ''}({', '.join(self.columns)})"
        if self.predicate is not None:
            shape += f" WHERE {self.predicate}"
        return shape if self.unique else f"{shape} (not unique)"

    def serves(self, wanted: UniqueIndex) -> bool:
        """Unique over the same columns (in any order), partial exactly when the reference is."""
        return (
            self.unique
            and len(self.columns) == len(wanted.columns)
            and set(self.columns) == set(wanted.columns)
            and (self.predicate is None) == (wanted.where is None)
            and (self.constraint or not wanted.name_fixed)
        )


def _check_unique(wanted: UniqueIndex, live: list[LiveIndex]) -> tuple[str | None, str | None]:
    """(problem, note): a problem when no index on the table serves, a note when one under
    another name does."""
    named = next((i for i in live if i.name == wanted.name), None)
    if named is not None and named.serves(wanted):
        return None, None
    what = f"unique index {wanted.name} on {wanted.table}"
    if not wanted.name_fixed:
        serving = next((i for i in live if i.serves(wanted)), None)
        if serving is not None:
            return None, f"{what}: found as {serving.describe()}"
    if named is not None:
        found = named.describe()
        if wanted.name_fixed and not named.constraint:
            found += " (an index, not a constraint: ON CONFLICT ON CONSTRAINT needs one)"
    else:
        similar = [i for i in live if set(i.columns) == set(wanted.columns)]
        found = "; ".join(i.describe() for i in similar) if similar else "none"
    return f"{what}: expected {wanted.expected}, found {found}", None
