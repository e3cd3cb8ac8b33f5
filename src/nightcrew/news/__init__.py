"""Spec 001: the news platform's RSS ingestion worker (sources and fetching so far)."""
