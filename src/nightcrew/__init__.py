"""nightcrew: the background crew for content platforms."""

__version__ = "0.1.0"
