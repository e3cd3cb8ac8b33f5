"""The dashboard's pages, one module each: its handler, its read model, its SQL."""
