"""Spec 001's run report: one frozen ``NewsReport`` for both engines — what one inline run, or
one pipeline pass, found and decided — its JSON (the spec's field names), the one builder both
engines fill it with (``ReportDraft``), and where it is kept (``news.worker_reports``, the newest
per shard on ``GET /news/reports`` and the dashboard).

The spec's fields mean the same thing in both engines, because both run the same steps in the
same order under the same shard lock: fetch, new-item lookup, queue count, article count,
admission (``steps``). Where a run then does the expensive steps itself, a pass hands what it
admitted to the stage workers:

* ``queuedCount``/``queuedBySource``: candidates not written yet, by "source (shard)", counted
  after the run's (or pass's) fetches — the shard's backlog plus what the fetches found new;
* ``deferredCount``/``deferredReasons``: of those, the ones left waiting for a later run or
  pass — by a limit, MAX_AI_REVIEWS, a lost lease, a model that failed for now — and why;
* ``processedCount``, ``aiReviewedCount``, ``acceptedCount``, ``rejectedCount``,
  ``translatedCount``, ``redisAiReviewLockSkippedCount``, ``writeErrors``: what this run did
  with what it admitted. A pass does none of it itself (its ``processedCount`` is 0, its
  ``translatedCount`` the backlog it translated): the stage workers do it later, and the next
  pass reports their results since the previous report under ``workers`` — named as theirs,
  never folded into the pass's own counts;
* ``retriedCount``: accepted articles without a thumbnail due another try (the no-thumbnail
  retry; at most NO_THUMBNAIL_RETRY_MAX) — tried by the run or pass unless a limit stopped it;
* ``lockedCount``: 1 when another run or pass held the shard's lock, so this one did nothing
  (``status: skipped``); else 0;
* ``aiPromptTokens``/``aiCompletionTokens`` (added, not spec 001's): the tokens the model's
  answers used for this run's reviews and translations (a pass: its backlog translations; its
  workers' under ``workers``) — the spend MAX_AI_REVIEWS protects;
* ``redisEnabled``: Redis configured and never failing during the run (or pass);
* ``backpressureDbArticleCount`` (or ``…Error``): the article count the DB limit saw, or why it
  could not be read (the run goes on without the DB limit);
* ``fetchErrors`` (``source``, ``error``): feeds whose fetch, in this run or pass, failed;
  ``droppedItems`` (``source``, ``reason``, ``count``): items a feed listed that cannot be kept.

``status`` says how it ended: ``completed``; ``skipped`` (the shard's lock was held); or
``superseded`` — a newer holder of the shard's lease wrote first, so this run stopped, wrote
nothing more, and left the rest to it (not a failure: exit 0).

A pipeline pass adds its own figures (``PassFigures``): ``enqueuedSources``,
``unfetchedSources``, ``admittedCount``, ``resentCount``, ``relayedCount``, ``stages`` and
``workers`` (``WorkerResults``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from nightcrew.db.database import Database, json_param
from nightcrew.db.queries import load_queries
from nightcrew.jsonable import JsonObject, omitted, to_json
from nightcrew.log import event, warning

if TYPE_CHECKING:
    from nightcrew.adapters.news import NewsAdapters
    from nightcrew.config import Settings
    from nightcrew.metrics import Metrics

SQL = load_queries(__file__)

Trigger = Literal["manual", "scheduled"]
Engine = Literal["inline", "rabbitmq"]
Status = Literal["completed", "skipped", "superseded"]

SUPERSEDED_REASON = (
    "superseded: a newer holder of the shard's lease has written; what this run did not "
    "write waits for it"
)
LOCKED_REASON = "another run holds this shard's lock"


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchFailure:
    """A feed whose fetch failed (``fetchErrors``)."""

    source: str  # the source's name
    error: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DroppedItems:
    """Items a feed listed that cannot be kept, of one source for one reason
    (``droppedItems``): not fetch errors, they never park a source."""

    source: str
    reason: str  # a link too long, not http(s), none
    count: int


@dataclass(frozen=True, kw_only=True, slots=True)
class WriteFailure:
    """An article the database refused for its own data (``writeErrors``)."""

    url: str
    error: str


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerResults:
    """What the pipeline's stage workers did for the shard in the window (``since``,
    ``until``] — reported by the next pass, as theirs."""

    since: datetime | None  # where the shard's previous report stopped (None: the start)
    until: datetime | None = None  # when this report read them (the next window starts there)
    processed_count: int = 0  # articles written
    ai_reviewed_count: int = 0  # verdicts written with them
    accepted_count: int = 0
    rejected_count: int = 0
    translated_count: int = 0  # with their review (the backlog's: the pass that translated)
    redis_ai_review_lock_skipped_count: int = 0  # parked: their review lease held elsewhere
    fetch_lease_skipped_count: int = 0  # fetches put off: their source's lease held elsewhere
    review_retry_count: int = 0  # candidates waiting for another review (model failed)
    ai_prompt_tokens: int = 0  # the model's usage on the workers' review stage
    ai_completion_tokens: int = 0
    redis_enabled: bool = True  # no worker noted a Redis failure in the window
    write_errors: list[WriteFailure] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        # the window's ends as ISO 8601 text: a saved report is jsonb, and the next pass reads
        # ``until`` back from it (``notes.previous_report``)
        document: JsonObject = to_json(self)
        return document | {"since": _iso(self.since), "until": _iso(self.until)}


@dataclass(frozen=True, kw_only=True, slots=True)
class PassFigures:
    """What only a pipeline pass reports, beside spec 001's fields."""

    enqueued_sources: int  # due sources sent to the fetch stage
    unfetched_sources: int  # of the shard's sent ones, not fetched within the fetch budget
    admitted_count: int  # candidates this pass admitted into the stages
    resent_count: int  # admitted, their message presumed lost or their backoff over: sent again
    relayed_count: int  # outbox rows an earlier crash or absent broker left, published now
    stages: dict[str, dict[str, int]]  # the shard's candidates, by stage and state
    workers: WorkerResults

    def to_json(self) -> JsonObject:
        document: JsonObject = to_json(self)
        return document | {"workers": self.workers.to_json()}


@dataclass(frozen=True, kw_only=True, slots=True)
class NewsReport:
    """One run's (inline) or one pass's (pipeline) report; see the module's docstring for what
    each field means — the same in both engines."""

    shard: str
    trigger: str
    status: Status = "completed"
    queued_count: int = 0
    queued_by_source: dict[str, int] = field(default_factory=dict)
    deferred_count: int = 0
    deferred_reasons: list[str] = field(default_factory=list)
    retried_count: int = 0
    processed_count: int = 0
    ai_reviewed_count: int = 0
    accepted_count: int = 0
    rejected_count: int = 0
    backpressure_queue_limit: int = 0
    backpressure_db_article_limit: int = 0
    backpressure_db_article_count: int | None = None
    backpressure_db_article_count_error: str | None = None
    locked_count: int = 0
    redis_ai_review_lock_skipped_count: int = 0
    redis_enabled: bool = False
    translated_count: int = 0
    # the tokens the model's answers used (reviews and translations): what MAX_AI_REVIEWS
    # protects, in the unit a provider bills; 0 with the offline rules (not in spec 001; added)
    ai_prompt_tokens: int = 0
    ai_completion_tokens: int = 0
    # who gave the verdicts counted in aiReviewedCount: "model" or "offline rules" (no AI)
    reviewer: str = "model"
    fetch_errors: list[FetchFailure] = field(default_factory=list)
    dropped_items: list[DroppedItems] = field(default_factory=list)
    write_errors: list[WriteFailure] = field(default_factory=list)
    duration_ms: float = 0.0
    # a pipeline pass's own figures (None: an inline run), beside spec 001's in the JSON
    pipeline: PassFigures | None = omitted(default=None)

    @property
    def engine(self) -> Engine:
        return "inline" if self.pipeline is None else "rabbitmq"

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    def to_json(self) -> JsonObject:
        # flat: ``pipeline`` names the engine, and a pass's own figures are members of their own
        body: JsonObject = to_json(self)
        body |= {"pipeline": self.engine, "skipped": self.skipped}
        if self.pipeline is not None:
            body |= self.pipeline.to_json()
        return body


# The fields every report carries, whichever engine made it (the parity suite checks both).
SPEC_FIELDS = tuple(NewsReport(shard="", trigger="manual").to_json())
# Spec 001's fields that count what the expensive steps did: an inline run's are its own; a
# pass does none of it (its own are 0 or empty) and reports its workers' by the same names
# under ``workers``.
WORK_FIELDS = (
    "processedCount",
    "aiReviewedCount",
    "acceptedCount",
    "rejectedCount",
    "translatedCount",
    "redisAiReviewLockSkippedCount",
    "writeErrors",
    "aiPromptTokens",
    "aiCompletionTokens",
)


def reviewer_label(adapters: NewsAdapters) -> str:
    from nightcrew.news.steps.review import calls_a_model

    return "model" if calls_a_model(adapters.reviewer) else "offline rules"


class ReportDraft:
    """The one builder of a ``NewsReport``, for both engines: a run (or pass) sets and adds its
    figures as its steps learn them, and ``build`` freezes the report once, at the end."""

    def __init__(self, settings: Settings, adapters: NewsAdapters, *, shard: str, trigger: str):
        from nightcrew.news.steps.admission import limits

        queue_limit, article_limit = limits(settings)
        self.report = NewsReport(
            shard=shard,
            trigger=trigger,
            backpressure_queue_limit=queue_limit,
            backpressure_db_article_limit=article_limit,
            reviewer=reviewer_label(adapters),
        )

    def set(self, **values: Any) -> None:
        self.report = dataclasses.replace(self.report, **values)

    def add(self, **counts: int) -> None:
        self.set(**{name: getattr(self.report, name) + n for name, n in counts.items()})

    def defer(self, reason: str) -> None:
        """A reason some of the queue waits for a later run or pass (said once)."""
        if reason not in self.report.deferred_reasons:
            self.set(deferred_reasons=[*self.report.deferred_reasons, reason])

    def extend(
        self,
        *,
        fetch_errors: Sequence[FetchFailure] = (),
        dropped_items: Sequence[DroppedItems] = (),
        write_errors: Sequence[WriteFailure] = (),
    ) -> None:
        """Entries added to the report's lists."""
        report = self.report
        self.set(
            fetch_errors=[*report.fetch_errors, *fetch_errors],
            dropped_items=[*report.dropped_items, *dropped_items],
            write_errors=[*report.write_errors, *write_errors],
        )

    def build(
        self,
        *,
        status: Status,
        duration_ms: float,
        redis_enabled: bool,
        pipeline: PassFigures | None = None,
    ) -> NewsReport:
        """The report, frozen; ``redis_enabled`` is the run's ``RedisUse.enabled()``."""
        return dataclasses.replace(
            self.report,
            status=status,
            duration_ms=duration_ms,
            redis_enabled=redis_enabled,
            pipeline=pipeline,
        )


def count_spend(metrics: Metrics, report: NewsReport) -> None:
    """The tokens a saved report accounts for — its own and, for a pass, its workers' — added
    to this process's ``nightcrew_ai_tokens_total``: each token is reported by exactly one
    report, so the counter counts each once."""
    workers = report.pipeline.workers if report.pipeline is not None else WorkerResults(since=None)
    for kind, n in (
        ("prompt", report.ai_prompt_tokens + workers.ai_prompt_tokens),
        ("completion", report.ai_completion_tokens + workers.ai_completion_tokens),
    ):
        if n:
            metrics.inc("nightcrew_ai_tokens_total", float(n), kind=kind)


def redis_down(exc: BaseException) -> None:
    """A Redis call failed and PostgreSQL answered instead: said, once per failure. A run or a
    pass counts it through ``RedisUse``; a stage worker's process breaker keeps it, and the
    worker notes it for the next pass (``notes.note_redis_trouble``)."""
    warning("worker.redis.unavailable", error=str(exc))


class RedisUse:
    """Whether Redis served a run (or pass) throughout: false once a call failed — told by a
    fallback (``failed``), or seen by the process's Redis circuit breaker since the start (the
    adapters' ``redis_breaker``; None without Redis)."""

    def __init__(self, adapters: NewsAdapters) -> None:
        self.configured = adapters.redis_configured
        self._breaker = adapters.redis_breaker
        self._started = self._breaker.now() if self._breaker is not None else 0.0
        self.failures: list[str] = []

    def failed(self, exc: BaseException) -> None:
        """A Redis call failed and its PostgreSQL fallback answered (spec 001: the run goes on
        and says ``redisEnabled: false``)."""
        redis_down(exc)
        self.failures.append(str(exc))

    def enabled(self) -> bool:
        """Redis configured and no failure since the start."""
        if not self.configured or self.failures:
            return False
        return self._breaker is None or not self._breaker.failed_since(self._started)


async def locked_report(
    db: Database,
    draft: ReportDraft,
    *,
    redis_enabled: bool,
    duration_ms: float,
    pipeline: PassFigures | None = None,
) -> NewsReport:
    """Another run or pass held the shard's lock: this one did nothing (said at info when an
    operator asked for it, as a warning when a schedule did); what waits counted."""
    from nightcrew.news.steps import candidates

    shard, trigger = draft.report.shard, draft.report.trigger
    (event if trigger == "manual" else warning)("worker.shard_locked", shard=shard, trigger=trigger)

    draft.set(locked_count=1, deferred_count=await candidates.count_held(db, draft.report.shard))
    draft.defer(LOCKED_REASON)
    return draft.build(
        status="skipped", duration_ms=duration_ms, redis_enabled=redis_enabled, pipeline=pipeline
    )


# --- keeping them -------------------------------------------------------------------------------
async def save_report(db: Database, *, started_at: datetime, report: NewsReport) -> None:
    """One report (either engine's) into ``news.worker_reports``."""
    await db.execute(
        SQL["save_report"],
        {
            "shard": report.shard,
            "trigger": report.trigger,
            "now": started_at,
            "report": json_param(report.to_json()),
        },
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SavedReport:
    """A report as ``news.worker_reports`` keeps it (``latest_reports``)."""

    shard: str
    trigger: str
    started_at: datetime
    report: JsonObject  # its JSON, as saved

    def to_json(self) -> JsonObject:
        # ``startedAt`` as ISO 8601 text: GET /news/reports answers JSON
        document: JsonObject = to_json(self)
        return document | {"startedAt": self.started_at.isoformat()}


async def latest_reports(db: Database) -> list[JsonObject]:
    """The newest report of each shard, whichever engine saved it."""
    return [r.to_json() for r in await db.fetch_as(SavedReport, SQL["latest_reports"])]
