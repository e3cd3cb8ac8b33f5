"""The process's garbage collector, set once its imports are done (``nightcrew`` does it first
thing, ``cli.common.main``).

A news run allocates in bursts: 10,000 items become feed entries, items, candidates, rows and
verdicts within a second or two. With CPython's defaults (a young collection every 700
allocations, a full one every ~100 of those) the full collections walk every object the
process has — most of them the imported modules' functions, classes and constants, which
are never garbage. Measured in ``bench.news`` (gc.callbacks around the first run, this
machine): 64-83 ms of collection per 1.2-1.6 s run with the defaults, 13-21 ms frozen and at
a 10,000 young threshold.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython's default is 700)


def tune_for_bursts() -> None:
    """Move everything alive now (the imports) out of the collector's sight for good
    (``gc.freeze``), and collect the young generation less often. Cycles are still found:
    only when is changed."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
