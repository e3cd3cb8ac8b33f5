"""The operator's dashboard, served by ``nightcrew serve`` at ``/``."""
