"""The operator's dashboard, served by ``nightcrew serve`` at ``/`` (issue 15)."""
