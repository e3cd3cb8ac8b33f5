"""The shape targets of ``src/`` hold (``python -m bench.shape`` prints the counts)."""

from __future__ import annotations

from bench.shape import measure, targets


def test_the_shape_targets_hold() -> None:
    missed = [
        f"{what}: {measured} (target <= {target})"
        for what, measured, target in targets(measure())
        if measured > target
    ]
    assert missed == []
