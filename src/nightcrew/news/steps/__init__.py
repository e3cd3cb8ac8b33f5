"""Spec 001's steps, each once, called by both engines: admission (backpressure), fetch and parse,
items (what is new), candidates (what waits), hydrate and images, review (the cost bound, the
retry rule, the translation backlog), write, snapshot, and leases (the shard lock, fences)."""
