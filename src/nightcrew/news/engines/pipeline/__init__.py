"""The pipeline engine (NEWS_PIPELINE=rabbitmq): the pass (``passes``), the outbox and relay
(``outbox``), the stage consumers (``stages``) with their attempts (``attempts``) and leases
(``heartbeat``), the worker that runs them (``worker``), the dead letters (``dlq``), what the
workers leave for the next pass's report (``notes``) and the figures for /metrics
(``metrics``)."""
