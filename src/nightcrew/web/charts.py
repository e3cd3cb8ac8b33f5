"""Small bar charts as inline SVG, drawn on the server: no chart library, no JavaScript.

The output is markup built from numbers and from labels escaped here, so a template may insert
it with ``|safe``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape


@dataclass(frozen=True)
class Bar:
    label: str  # shown under the bar (a few characters) and in its tooltip
    value: int
    tip: str = ""


def bar_chart(
    bars: Sequence[Bar],
    *,
    title: str,
    width: int = 720,
    height: int = 160,
    every: int = 1,  # label every n-th bar
) -> str:
    """A bar per value, scaled to the largest; an all-zero series draws a flat baseline."""
    top, bottom, left = 18, 22, 4
    plot = height - top - bottom
    peak = max((b.value for b in bars), default=0)
    # a few points stay bars, not slabs
    step = min((width - left) / max(len(bars), 1), 28.0)
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" preserveAspectRatio="xMinYMin meet" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<text x="{left}" y="12" class="chart-label">max {peak:,}</text>',
        f'<line x1="{left}" y1="{top + plot}" x2="{width}" y2="{top + plot}" class="axis"/>',
    ]
    for i, bar in enumerate(bars):
        h = 0.0 if peak == 0 else plot * bar.value / peak
        x = left + i * step
        tip = escape(bar.tip or f"{bar.label}: {bar.value:,}")
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{top + plot - h:.1f}" width="{max(step - 2, 1):.1f}" '
            f'height="{h:.1f}" class="bar"><title>{tip}</title></rect>'
        )
        if i % every == 0:
            parts.append(
                f'<text x="{x + step / 2:.1f}" y="{height - 6}" class="chart-label" '
                f'text-anchor="middle">{escape(bar.label)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
