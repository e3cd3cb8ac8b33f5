-- db check: the live catalog, as check.py compares it with the contract (pg_catalog, not
-- information_schema, which hides what the role may not use).

-- name: role
-- The role every privilege below is checked for: current_user, as nightcrew's sessions run.
SELECT current_user AS name, r.rolsuper AS superuser, r.rolbypassrls AS bypassrls,
       current_database() AS database,
       has_database_privilege(current_database(), 'TEMPORARY') AS temporary
  FROM pg_roles r
 WHERE r.rolname = current_user;

-- name: migrations_table
-- Exists, and may this role read it (it never needs to write it: `db migrate` does).
SELECT has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT') AS readable
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'nightcrew' AND c.relname = 'schema_migrations';

-- name: functions
-- Every function of a contract name: its input argument types in order (proargtypes: OUT and
-- TABLE columns excluded), its result as PostgreSQL prints it, how many trailing arguments have
-- defaults (which lets a shorter call reach it), whether it returns a set, and the columns a
-- row result has — from the OUT/INOUT/TABLE arguments, or else the composite type it returns —
-- so RETURNS TABLE(…), OUT parameters and RETURNS SETOF a_row_type are read alike. And whether
-- the current role may execute it.
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
 ORDER BY 1, p.pronargs, p.oid;

-- name: relations
-- Every contract table that exists, whatever the role may see of it (pg_class, not
-- information_schema, which lists only what the role has a privilege on): whether the role owns
-- it (a member of the owner role does), its row-level security, whether a permissive policy for
-- every command with `USING (true)` (and no restrictive one) opens it to the role anyway, and
-- which of _PRIVILEGES the role holds on the table as a whole.
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
   AND n.nspname || '.' || c.relname = ANY(%(tables)s);

-- name: columns
-- Every column of a contract table (pg_attribute: all of them, whatever the role's grants), by
-- its type's name — a domain's base type; an enum's schema-qualified — and whether that is an
-- enum.
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
   AND a.attnum > 0 AND NOT a.attisdropped;

-- name: indexes
-- Every index on a contract table: its key columns (or expressions) in order, whether it is
-- unique, its predicate (partial index), and whether a constraint owns it.
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
 ORDER BY 2, 1;

-- name: triggers
SELECT t.tgname, n.nspname || '.' || c.relname AS tbl
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE NOT t.tgisinternal AND t.tgname = ANY(%(names)s)
 ORDER BY 2;

-- name: schemas_without_usage
SELECT nspname FROM pg_namespace
 WHERE nspname = ANY(%(schemas)s) AND NOT has_schema_privilege(oid, 'USAGE')
 ORDER BY nspname;
