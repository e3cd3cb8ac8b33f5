"""Spec 000: the podcast platform's lifecycle manager."""
