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


@dataclass(frozen=True, kw_only=True, slots=True)
class _RoleRow:
    name: str
    superuser: bool
    bypassrls: bool
    database: str
    temporary: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class _SchemaRow:
    nspname: str


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
    role_row = await db.fetch_one_as(_RoleRow, _ROLE_SQL)
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
        for r in await db.fetch_as(_RelationRow, _RELATIONS_SQL, {"tables": list(TABLES)})
    }
    live: dict[str, dict[str, LiveType]] = {}
    for c in await db.fetch_as(_ColumnRow, _COLUMNS_SQL, {"tables": list(TABLES)}):
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
        for i in await db.fetch_as(_IndexRow, _INDEXES_SQL, {"tables": list(TABLES)})
    ]

    triggers = await db.fetch_as(
        _TriggerRow,
        "SELECT t.tgname, n.nspname || '.' || c.relname AS tbl FROM pg_trigger t"
        " JOIN pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE NOT t.tgisinternal AND t.tgname = ANY(%(names)s)"
        " ORDER BY 2",
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
        _FunctionRow, _FUNCTIONS_SQL, {"names": [fn.name for fn in FUNCTIONS]}
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


@dataclass(frozen=True, kw_only=True, slots=True)
class _Readable:
    readable: bool


async def _role_and_migrations(db: Database, role_row: _RoleRow) -> tuple[list[str], list[str]]:
    """What the role lacks (schema USAGE, TEMPORARY, reading the migrations), and the
    nightcrew migrations not applied."""
    role = role_row.name
    role_problems = [
        f"schema {schema.nspname}: role {role} lacks the USAGE privilege"
        for schema in await db.fetch_as(
            _SchemaRow,
            "SELECT nspname FROM pg_namespace"
            " WHERE nspname = ANY(%(schemas)s) AND NOT has_schema_privilege(oid, 'USAGE')"
            " ORDER BY nspname",
            {"schemas": sorted({t.split(".")[0] for t in TABLES} | _function_schemas())},
        )
    ]
    if not role_row.temporary:
        role_problems.append(
            f"database {role_row.database}: role {role} lacks the TEMPORARY privilege"
            " (the reconciler lists the store into temporary tables)"
        )
    migrations_table = await db.fetch_one_as(_Readable, _MIGRATIONS_TABLE_SQL)
    if migrations_table is not None and not migrations_table.readable:
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

# The role every privilege below is checked for: current_user, as nightcrew's sessions run.
_ROLE_SQL = """
SELECT current_user AS name, r.rolsuper AS superuser, r.rolbypassrls AS bypassrls,
       current_database() AS database,
       has_database_privilege(current_database(), 'TEMPORARY') AS temporary
  FROM pg_roles r
 WHERE r.rolname = current_user
"""

# Exists, and may this role read it (it never needs to write it: `db migrate` does).
_MIGRATIONS_TABLE_SQL = """
SELECT has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT') AS readable
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'nightcrew' AND c.relname = 'schema_migrations'
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Access:
    role: str
    superuser: bool
    bypassrls: bool


# --- functions, live -----------------------------------------------------------------------------

# Every function of a contract name: its input argument types in order (proargtypes: OUT and
# TABLE columns excluded), its result as PostgreSQL prints it, how many trailing arguments have
# defaults (which lets a shorter call reach it), whether it returns a set, and the columns a
# row result has — from the OUT/INOUT/TABLE arguments, or else the composite type it returns —
# so RETURNS TABLE(…), OUT parameters and RETURNS SETOF a_row_type are read alike. And whether
# the current role may execute it.
_FUNCTIONS_SQL = """
SELECT n.nspname || '.' || p.proname AS fn,
       ARRAY(SELECT format_type(a.oid, NULL)
               FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a (oid, i)
              ORDER BY a.i) AS args,
       pg_get_function_result(p.oid) AS result,
       p.pronargdefaults AS defaults,
       p.proretset AS retset,
       format_type(p.prorettype, NULL) AS rettype,
       coalesce(
           (SELECT array_agg(ARRAY[coalesce(p.proargnames[o.i], ''), format_type(o.t, NULL)]
                             ORDER BY o.i)
              FROM unnest(p.proallargtypes, p.proargmodes) WITH ORDINALITY AS o (t, m, i)
             WHERE o.m IN ('o', 'b', 't')),
           (SELECT array_agg(ARRAY[a.attname::text, format_type(a.atttypid, NULL)]
                             ORDER BY a.attnum)
              FROM pg_type rt
              JOIN pg_attribute a ON a.attrelid = rt.typrelid
             WHERE rt.oid = p.prorettype AND rt.typrelid <> 0
               AND a.attnum > 0 AND NOT a.attisdropped),
           '{}') AS columns,
       has_function_privilege(p.oid, 'EXECUTE') AS executable
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.prokind = 'f'
   AND n.nspname || '.' || p.proname = ANY(%(names)s)
 ORDER BY 1, p.pronargs, p.oid
"""


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

# Every contract table that exists, whatever the role may see of it (pg_class, not
# information_schema, which lists only what the role has a privilege on): whether the role owns
# it (a member of the owner role does), its row-level security, whether a permissive policy for
# every command with `USING (true)` (and no restrictive one) opens it to the role anyway, and
# which of _PRIVILEGES the role holds on the table as a whole.
_RELATIONS_SQL = """
SELECT n.nspname || '.' || c.relname AS tbl,
       pg_has_role(c.relowner, 'USAGE') AS owned,
       c.relrowsecurity AS rls,
       c.relforcerowsecurity AS forced,
       (EXISTS (SELECT 1 FROM pg_policy p
                 WHERE p.polrelid = c.oid AND p.polpermissive AND p.polcmd = '*'
                   AND pg_get_expr(p.polqual, p.polrelid) = 'true'
                   AND (p.polwithcheck IS NULL
                        OR pg_get_expr(p.polwithcheck, p.polrelid) = 'true')
                   AND EXISTS (SELECT 1 FROM unnest(p.polroles) AS r (oid)
                                WHERE CASE WHEN r.oid = 0 THEN true
                                           ELSE pg_has_role(r.oid, 'USAGE') END))
        AND NOT EXISTS (SELECT 1 FROM pg_policy p
                         WHERE p.polrelid = c.oid AND NOT p.polpermissive
                           AND EXISTS (SELECT 1 FROM unnest(p.polroles) AS r (oid)
                                        WHERE CASE WHEN r.oid = 0 THEN true
                                                   ELSE pg_has_role(r.oid, 'USAGE') END)))
           AS open_policy,
       ARRAY[has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
             has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE')]
           AS granted
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
   AND n.nspname || '.' || c.relname = ANY(%(tables)s)
"""

# Every column of a contract table (pg_attribute: all of them, whatever the role's grants), by
# its type's name — a domain's base type; an enum's schema-qualified — and whether that is an
# enum.
_COLUMNS_SQL = """
SELECT n.nspname || '.' || c.relname AS tbl, a.attname AS column_name,
       CASE WHEN b.typtype = 'e' THEN b.typnamespace::regnamespace::text || '.' || b.typname
            ELSE format_type(b.oid, NULL) END AS data_type,
       b.typtype = 'e' AS is_enum
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_type t ON t.oid = a.atttypid
  JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
   AND n.nspname || '.' || c.relname = ANY(%(tables)s)
   AND a.attnum > 0 AND NOT a.attisdropped
"""


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


# Every index on a contract table: its key columns (or expressions) in order, whether it is
# unique, its predicate (partial index), and whether a constraint owns it.
_INDEXES_SQL = """
SELECT c.relname AS name, n.nspname || '.' || t.relname AS tbl,
       ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true)
               FROM generate_series(1, i.indnkeyatts) AS k
              ORDER BY k) AS columns,
       i.indisunique AS is_unique,
       pg_get_expr(i.indpred, i.indrelid, true) AS predicate,
       EXISTS (SELECT 1 FROM pg_constraint k
                WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid
                  AND k.contype IN ('u', 'p')) AS is_constraint
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_class t ON t.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
 WHERE n.nspname || '.' || t.relname = ANY(%(tables)s)
 ORDER BY 2, 1
"""


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
