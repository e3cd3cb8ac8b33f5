"""Review: the model's verdict on an article (and, for an accepted one, its summary
translated), under a per-article lock so two runs never pay for the same article at once.

Both engines review through ``review_item`` and lock by ``review_lock_name`` — the inline run
in batches under its shard lease, the pipeline's review stage one candidate per message — so
the two never review the same article at once while an operator switches modes. A transient
failure (429, 5xx, network) is tried again later, up to MAX_REVIEW_ATTEMPTS; after that, or on
a permanent failure, the article is written unreviewed. The translation backlog (summaries
whose translation failed) is worked through by both engines under the shard lock: by the inline
run after its batch, by the pipeline's pass after its admission.

**The cost bound, MAX_AI_REVIEWS, counts model reviews only** (``calls_a_model``): spec 001
names it among the controls on "AI calls" ("reduce MAX_AI_REVIEWS … during incidents") and
protects "cost owners … before AI calls"; the offline rules cost nothing, so their verdicts do
not spend it — with no model configured, the queue limit alone bounds a run. (Spending it on
rule verdicts would hold a new shard of 300 articles for twelve runs.) Both engines apply it
when they admit a batch (``within_budget``): per run inline, per pass in the pipeline. A review
the model failed for now waits for a later run or pass (``review_again_later``), which admits
it again within its own bound, so a retry is never a model call outside the bound.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nightcrew.adapters.locks import Lease, Leases
from nightcrew.adapters.reviewer import (
    Article,
    CallScope,
    OfflineReviewer,
    Reviewer,
    ReviewError,
    Spend,
    Verdict,
)
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.log import warning
from nightcrew.news.steps.candidates import Candidate
from nightcrew.news.steps.entries import FeedItem

SQL = load_queries(__file__)

MAX_REVIEW_ATTEMPTS = 5
TRANSLATION_LANGUAGE = "English"
REVIEW_FAILED_FOR_NOW = "the model failed for now; reviewed again by a later run or pass"


def review_lock_name(url: str) -> str:
    """One article's review lock: the inline run's and the pipeline's review stage's alike, so
    the two never review the same article at once (while an operator switches modes)."""
    return "news:review:" + hashlib.sha256(url.encode()).hexdigest()[:32]


async def acquire_review_locks(
    leases: Leases, settings: Settings, urls: list[str]
) -> dict[str, Lease]:
    """The inline run's review locks on ``urls`` (UPSTASH_REDIS_AI_REVIEW_LOCK_TTL_SECONDS),
    by URL: a URL missing from the answer is being reviewed by another holder."""
    names = {review_lock_name(u): u for u in urls}
    held = await leases.acquire_many(list(names), settings.ai_review_lock_ttl_seconds)
    return {names[name]: lease for name, lease in held.items()}


@dataclass(frozen=True, slots=True)
class Reviewed:
    """A candidate after review: its verdict (None: the model failed for good — written as
    unreviewed) and, for an accepted one, the translation of its summary."""

    candidate: Candidate
    verdict: Verdict | None
    translation: str | None

    @property
    def url(self) -> str:
        return self.candidate.url

    @property
    def status(self) -> str:
        if self.verdict is None:
            return "unreviewed"
        return "accepted" if self.verdict.accepted else "rejected"


Verdicts = list[Reviewed]


async def review_item(
    reviewer: Reviewer,
    item: FeedItem,
    scope: CallScope | None = None,
    *,
    on_verdict: Callable[[Verdict], None] | None = None,
) -> tuple[Verdict | None, str | None, bool]:
    """(verdict, translation of an accepted one's summary, transient failure). A permanent
    failure means the article is written unreviewed; a transient one (429, 5xx, network)
    means try again later. The calls' tokens go to ``scope.spend``. ``on_verdict`` hears the
    verdict the moment it arrives, before its translation is asked for: a run stopped while
    the translation is in flight keeps the review it paid for (the translation backlog asks
    for the translation later)."""
    scope = scope or CallScope()
    try:
        verdict = await reviewer.review(
            Article(url=item.url, title=item.title, summary=item.summary), scope
        )
    except ReviewError as exc:
        warning("worker.ai_review_failed", url=item.url, error=str(exc), transient=exc.transient)
        return None, None, exc.transient
    if on_verdict is not None:
        on_verdict(verdict)
    translation = None
    if verdict.accepted and reviewer.translation_enabled and verdict.summary:
        try:
            translation = await reviewer.translate(verdict.summary, TRANSLATION_LANGUAGE, scope)
        except ReviewError as exc:
            warning("worker.translation_failed", url=item.url, error=str(exc))
    return verdict, translation, False


# --- the inline run's batch, concurrently -------------------------------------------------------
class ShardLeaseLost(Exception):
    """The shard lease could not be renewed while a batch was reviewed: the calls still in
    flight are cancelled and what they had not reviewed waits for the lease's next holder."""


@dataclass(frozen=True, slots=True)
class ItemReview:
    candidate: Candidate
    verdict: Verdict | None
    translation: str | None
    failed_for_now: bool


@dataclass(kw_only=True, slots=True)
class BatchReview:
    """A batch's reviews, in the batch's order; ``cut_off``: the candidates not reviewed
    because the shard lease was lost (their calls cancelled, or never started)."""

    done: list[ItemReview] = field(default_factory=list)
    cut_off: list[Candidate] = field(default_factory=list)


async def review_batch(
    reviewer: Reviewer,
    batch: list[Candidate],
    *,
    spend: Spend,
    keep_alive: Callable[[], Awaitable[bool]],
    renew_every: float,
    arrived: dict[int, ItemReview] | None = None,
) -> BatchReview:
    """Every candidate of ``batch`` reviewed (and an accepted one's summary translated),
    concurrently: the reviewer holds its calls to NEWS_AI_CONCURRENCY in flight (and the rate),
    so this starts them all and lets the limits pace them. The shard lease is renewed every
    ``renew_every`` seconds while they run (``keep_alive``); a renewal refused cancels the
    calls still in flight (structured: a TaskGroup) and leaves their candidates in ``cut_off``
    — but a review that answered is paid for: one whose translation was cut is in ``done``,
    untranslated (the translation backlog asks for it later).
    A cancellation from outside (SIGTERM) cancels every call too, and propagates; the reviews
    answered before it are in ``arrived`` (by the batch's index), paid for and the caller's to
    keep. The offline rules are asked one after another: they cost nothing, and their
    duplicate-title rule reads the batch in order."""
    scope = CallScope(spend=spend)  # one for the batch: every call adds to the run's spend
    if not calls_a_model(reviewer):
        done = []
        for candidate in batch:
            verdict, translation, failed = await review_item(reviewer, candidate.item, scope)
            done.append(ItemReview(candidate, verdict, translation, failed))
        return BatchReview(done=done)
    results: dict[int, ItemReview] = {} if arrived is None else arrived

    async def one(index: int, candidate: Candidate) -> None:
        def answered(verdict: Verdict) -> None:  # paid for, whatever becomes of its translation
            results[index] = ItemReview(candidate, verdict, None, False)

        verdict, translation, failed = await review_item(
            reviewer, candidate.item, scope, on_verdict=answered
        )
        results[index] = ItemReview(candidate, verdict, translation, failed)

    async def renew() -> None:
        while True:
            await asyncio.sleep(renew_every)
            if not await keep_alive():
                raise ShardLeaseLost("the shard lease was lost during review")

    lost = False
    try:
        async with asyncio.TaskGroup() as group:
            renewer = group.create_task(renew())
            await asyncio.gather(*(group.create_task(one(i, c)) for i, c in enumerate(batch)))
            renewer.cancel()
    except BaseExceptionGroup as failed:
        _, others = failed.split(ShardLeaseLost)
        if others is not None and not _cancelling():  # not the lease: the first error, itself
            raise _first(others) from failed
        lost = True
    if _cancelling():
        # a SIGTERM that came as the lease was lost, or as a renewal failed in its own way (a
        # database cut while it was cancelled): the stop wins, so the caller keeps what arrived
        # and the process ends as stopped, not as failed
        raise asyncio.CancelledError
    return BatchReview(
        done=[results[i] for i in sorted(results)],
        cut_off=[c for i, c in enumerate(batch) if i not in results] if lost else [],
    )


def _cancelling() -> bool:
    """Whether this task was asked to stop (a cancellation not yet delivered, or swallowed by
    the TaskGroup in favour of its children's errors)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def review_again_later(candidate: Candidate, failed_for_now: bool) -> bool:
    """The retry rule, both engines': a review the model failed for now waits for a later run
    or pass (its attempt counted), up to MAX_REVIEW_ATTEMPTS in a row; after that the article
    is written unreviewed, so one article cannot take a review slot of every run for ever."""
    return failed_for_now and candidate.attempts + 1 < MAX_REVIEW_ATTEMPTS


# --- the cost bound ---------------------------------------------------------------------------
def calls_a_model(reviewer: Reviewer) -> bool:
    """Whether a review by ``reviewer`` spends MAX_AI_REVIEWS: a model's does, the offline
    rules' does not (they cost nothing; see the module's docstring)."""
    return not isinstance(reviewer, OfflineReviewer)


def over_budget_reason(settings: Settings) -> str:
    return f"MAX_AI_REVIEWS {settings.max_ai_reviews} reached"


def within_budget(
    batch: list[Candidate], reviewer: Reviewer, settings: Settings
) -> tuple[list[Candidate], list[Candidate]]:
    """``batch`` (oldest first) split into what one run or pass may admit now and what waits
    for MAX_AI_REVIEWS: each candidate a model must review spends one; one the pipeline's
    review stage judged already, and every one the offline rules judge, spends none."""
    budget = settings.max_ai_reviews
    if not calls_a_model(reviewer):
        return batch, []
    taken: list[Candidate] = []
    over: list[Candidate] = []
    for candidate in batch:
        if candidate.reviewed:
            taken.append(candidate)
        elif budget > 0:
            budget -= 1
            taken.append(candidate)
        else:
            over.append(candidate)
    return taken, over


# --- written meanwhile? -----------------------------------------------------------------------
async def written_among(db: Database, urls: list[str]) -> set[str]:
    """Those of ``urls`` written already — another shard, or a holder whose lease ran out, may
    have written one since it was looked up: the review lock only says nobody is reviewing it
    *now*. The inline run asks for its batch, the pipeline's review stage for its candidate."""
    if not urls:
        return set()
    return set(await db.fetch_values(str, SQL["written_among"], {"urls": urls}))


async def is_written(db: Database, url: str) -> bool:
    """Whether ``url`` is written already (the pipeline's review stage, per candidate)."""
    return url in await written_among(db, [url])


# --- the translation backlog (both engines) -----------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Untranslated:
    """An accepted review whose summary has no translation yet (``translation_backlog``)."""

    article_id: int
    summary: str


async def translation_backlog(db: Database, shard: str, settings: Settings) -> list[Untranslated]:
    """Accepted reviews of ``shard`` whose summary still has no translation, oldest first, at
    most MAX_AI_REVIEWS (each is a model call)."""
    return await db.fetch_as(
        Untranslated,
        SQL["translation_backlog"],
        {"shard": shard, "limit": settings.max_ai_reviews},
    )


async def translate_backlog(
    db: Database,
    reviewer: Reviewer,
    backlog: list[Untranslated],
    *,
    still_held: Callable[[], Awaitable[bool]] | None = None,
    spend: Spend | None = None,
) -> int:
    """Each summary of ``backlog`` translated and saved; one the model fails stays in the
    backlog for the next run (or pass). ``still_held``, asked before each translation, keeps a
    short lease alive and stops the work when it answers False (the lease was lost: someone
    else may be translating now). How many were translated; the tokens go to ``spend``."""
    translated = 0
    scope = CallScope(spend=spend if spend is not None else Spend())
    for review in backlog:
        if still_held is not None and not await still_held():
            warning("worker.translation_lease_lost", article_id=review.article_id)
            break
        try:
            text = await reviewer.translate(review.summary, TRANSLATION_LANGUAGE, scope)
        except ReviewError as exc:
            warning("worker.translation_failed", article_id=review.article_id, error=str(exc))
            continue
        if text:
            await db.execute(
                SQL["set_translation"], {"article_id": review.article_id, "translation": text}
            )
            translated += 1
    return translated
