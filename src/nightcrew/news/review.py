"""Review: the model's verdict on an article (and, for an accepted one, its summary
translated), under a per-article lock so two runs never pay for the same article at once.

Both engines review through ``review_item`` and lock by ``review_lock_name`` — the inline run
in batches under its shard lease, the pipeline's review stage one candidate per message — so
the two never review the same article at once while an operator switches modes. A transient
failure (429, 5xx, network) is tried again later, up to MAX_REVIEW_ATTEMPTS; after that, or on
a permanent failure, the article is written unreviewed. The translation backlog (summaries
whose translation failed) is worked through by the inline run only today (issue 23 gives it
to the pipeline, with the cost bound MAX_AI_REVIEWS).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from nightcrew.adapters.reviewer import Article, Reviewer, ReviewError, Verdict
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.log import warning
from nightcrew.news.candidates import Candidate
from nightcrew.news.fetch import FeedItem

SQL = load_queries(__file__)

MAX_REVIEW_ATTEMPTS = 5
TRANSLATION_LANGUAGE = "English"


def review_lock_name(url: str) -> str:
    """One article's review lock: the inline run's and the pipeline's review stage's alike, so
    the two never review the same article at once (while an operator switches modes)."""
    return "news:review:" + hashlib.sha256(url.encode()).hexdigest()[:32]


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
    reviewer: Reviewer, item: FeedItem
) -> tuple[Verdict | None, str | None, bool]:
    """(verdict, translation of an accepted one's summary, transient failure). A permanent
    failure means the article is written unreviewed; a transient one (429, 5xx, network)
    means try again later."""
    try:
        verdict = await reviewer.review(
            Article(url=item.url, title=item.title, summary=item.summary)
        )
    except ReviewError as exc:
        warning("worker.ai_review_failed", url=item.url, error=str(exc), transient=exc.transient)
        return None, None, exc.transient
    translation = None
    if verdict.accepted and reviewer.translation_enabled and verdict.summary:
        try:
            translation = await reviewer.translate(verdict.summary, TRANSLATION_LANGUAGE)
        except ReviewError as exc:
            warning("worker.translation_failed", url=item.url, error=str(exc))
    return verdict, translation, False


# --- written meanwhile? Each engine asks its own way (to be unified, issue 23) ------------------
async def written_among(db: Database, urls: list[str]) -> set[str]:
    """Those of ``urls`` written already (inline run: a batch about to be reviewed — another
    shard, or a run whose lease ran out, may have written one since the look-up; the review
    lock only says nobody is reviewing it *now*)."""
    if not urls:
        return set()
    return {r["url"] for r in await db.fetch(SQL["written_among"], {"urls": urls})}


async def is_written(db: Database, url: str) -> bool:
    """Whether ``url`` is written already (the pipeline's review stage, per candidate)."""
    return await db.fetch_one(SQL["is_written"], {"url": url}) is not None


# --- the translation backlog (inline run) -------------------------------------------------------
async def translation_backlog(db: Database, shard: str, limit: int) -> list[dict[str, Any]]:
    """Accepted reviews of ``shard`` whose summary still has no translation, oldest first."""
    return await db.fetch(SQL["translation_backlog"], {"shard": shard, "limit": limit})


async def translate_backlog(db: Database, reviewer: Reviewer, backlog: list[dict[str, Any]]) -> int:
    """Each summary of ``backlog`` translated and saved; one the model fails stays in the
    backlog for the next run. How many were translated."""
    translated = 0
    for row in backlog:
        try:
            text = await reviewer.translate(row["summary"], TRANSLATION_LANGUAGE)
        except ReviewError as exc:
            warning("worker.translation_failed", article_id=row["article_id"], error=str(exc))
            continue
        if text:
            await db.execute(
                SQL["set_translation"], {"article_id": row["article_id"], "translation": text}
            )
            translated += 1
    return translated
