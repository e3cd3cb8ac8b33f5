"""The news sources: the registry of feeds (``registry``) and OPML import and export (``opml``)."""
