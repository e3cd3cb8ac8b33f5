"""Spec 001: the news platform's RSS ingestion worker — its steps (``steps``), the two engines
that run them (``engines``), its sources (``sources``), one report (``report``) and the
schedules that run each shard (``schedule``)."""
