from __future__ import annotations

import pytest

from nightcrew.metrics import METRICS, Metrics


def test_render_declares_every_metric_and_escapes_labels() -> None:
    m = Metrics()
    m.inc("nightcrew_job_failures_total", lane="minute", job='we"ird\nname')
    text = m.render()
    for name, (kind, _) in METRICS.items():
        assert f"# TYPE {name} {kind}" in text
    assert 'job="we\\"ird\\nname"' in text
    assert text.endswith("\n")


def test_undeclared_or_mistyped_metrics_are_refused() -> None:
    m = Metrics()
    with pytest.raises(KeyError):
        m.inc("nightcrew_typo_total")
    with pytest.raises(KeyError):
        m.set("nightcrew_lane_runs_total", 1)
