"""The effects outbox: calls to the outside world recorded in the same transaction as the
change that needs them, and delivered after it commits (``outbox``, ``deliver``)."""
