"""In-process metrics, rendered in the Prometheus text exposition format at ``GET /metrics``.

Small on purpose: counters and gauges with labels, owned by the Runtime (one per process), no
registry globals. Each replica exposes its own; Prometheus sums across replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["counter", "gauge"]
LabelSet = tuple[tuple[str, str], ...]

# name → (kind, help). Declared up front so /metrics documents itself even before a first run.
METRICS: dict[str, tuple[Kind, str]] = {
    "nightcrew_lane_runs_total": (
        "counter",
        "Lane runs by lane and status: completed, failed, or abandoned (a run that died "
        "without finishing, counted by the replica whose next run of the lane marked it).",
    ),
    "nightcrew_lane_run_duration_seconds": ("gauge", "Duration of the last run of a lane."),
    "nightcrew_lane_last_success_timestamp_seconds": (
        "gauge",
        "Unix time of the last completed run of a lane (alert when it goes stale).",
    ),
    "nightcrew_job_failures_total": ("counter", "Jobs or sweeps that threw, by lane and name."),
    "nightcrew_job_items_total": (
        "counter",
        "What the lanes' jobs counted (requeued, reactivated, deleted, ...), by count.",
    ),
    "nightcrew_effects_pending": (
        "gauge",
        "Effects owed and not yet confirmed, by kind (as of the last deliverEffects run).",
    ),
    "nightcrew_effects_dead": (
        "gauge",
        "Effects given up, by kind: see `nightcrew effects list --dead`.",
    ),
    "nightcrew_effects_delivered_total": ("counter", "Effects confirmed delivered, by kind."),
    "nightcrew_scheduler_slots_total": (
        "counter",
        "Scheduled slots by lane and whether this replica won the claim.",
    ),
    "nightcrew_scheduler_last_tick_timestamp_seconds": (
        "gauge",
        "Unix time the scheduler last fired a slot (any lane): stale means nothing runs.",
    ),
    "nightcrew_db_up": (
        "gauge",
        "1 when PostgreSQL answered the last check (every /ready and /metrics request), else 0.",
    ),
    # the news pipeline (NEWS_PIPELINE=rabbitmq), read from PostgreSQL and the broker at scrape
    "nightcrew_ai_tokens_total": (
        "counter",
        "Tokens the news model's answers used (kind: prompt or completion), as the news run and "
        "pass reports saved by this process account for them.",
    ),
    "nightcrew_news_stage_queued": (
        "gauge",
        "Candidates queued for a stage: waiting in its queue, in the outbox, or being worked on.",
    ),
    "nightcrew_news_stage_ready": ("gauge", "Messages waiting in a stage's queue (the broker)."),
    "nightcrew_news_stage_in_flight": (
        "gauge",
        "Candidates of a stage taken by a worker or owed by the outbox (queued minus ready).",
    ),
    "nightcrew_news_stage_held": (
        "gauge",
        "Candidates held back from a stage (backpressure, a model that failed for now).",
    ),
    "nightcrew_news_stage_oldest_age_seconds": (
        "gauge",
        "Age of the oldest candidate queued for a stage (alert when it keeps growing).",
    ),
    "nightcrew_news_stage_dead_letters": (
        "gauge",
        "Messages in a stage's dead-letter queue: see `nightcrew news dlq list`.",
    ),
    "nightcrew_news_stage_processed_total": (
        "counter",
        "Messages a stage's workers handled (every worker process, summed in PostgreSQL).",
    ),
    "nightcrew_news_stage_failed_total": ("counter", "Deliveries a stage's handler failed."),
    "nightcrew_news_stage_dead_lettered_total": (
        "counter",
        "Messages a stage's workers gave up on (dead-lettered).",
    ),
}


@dataclass
class Metrics:
    _values: dict[str, dict[LabelSet, float]] = field(default_factory=dict)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self._check(name, "counter")
        series = self._values.setdefault(name, {})
        key = _labels(labels)
        series[key] = series.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        self._check(name, "gauge")
        self._values.setdefault(name, {})[_labels(labels)] = float(value)

    def set_total(self, name: str, value: float, **labels: str) -> None:
        """A counter whose running total is kept elsewhere (summed across processes)."""
        self._check(name, "counter")
        self._values.setdefault(name, {})[_labels(labels)] = float(value)

    def value(self, name: str, **labels: str) -> float:
        return self._values.get(name, {}).get(_labels(labels), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text) in METRICS.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in sorted(self._values.get(name, {}).items()):
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(
                    f"{name}{{{rendered}}} {_number(value)}"
                    if labels
                    else f"{name} {_number(value)}"
                )
        return "\n".join(lines) + "\n"

    @staticmethod
    def _check(name: str, kind: Kind) -> None:
        declared = METRICS.get(name)
        if declared is None or declared[0] != kind:
            raise KeyError(f"{name} is not a declared {kind}")


def _labels(labels: dict[str, str]) -> LabelSet:
    return tuple(sorted(labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)
