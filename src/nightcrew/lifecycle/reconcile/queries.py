"""The reconciler's named queries (``queries.sql``): one session's temp tables and the joins
over them, shared by its phases."""

from nightcrew.db.queries import load_queries

SQL = load_queries(__file__)
