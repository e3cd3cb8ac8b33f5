"""PostgreSQL: the pool, the embedded server, migrations and named queries."""
