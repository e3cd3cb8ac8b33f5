"""A reviewer the news engines treat as a model — its reviews spend MAX_AI_REVIEWS, unlike the
offline rules' — that judges by the offline rules in-process and counts the reviews it was
asked for: for inline tests of the cost bound without an HTTP model stand-in."""

from __future__ import annotations

from collections import Counter

from nightcrew.adapters.reviewer import Article, CallScope, OfflineReviewer, Verdict


class RulesModel:
    """Not an ``OfflineReviewer`` (so ``review.calls_a_model`` says yes); no translation."""

    name = "chat:rules-stand-in"
    translation_enabled = False

    def __init__(self) -> None:
        self._rules = OfflineReviewer()
        self.reviews: Counter[str] = Counter()

    async def aclose(self) -> None:
        return None

    async def review(self, article: Article, scope: CallScope | None = None) -> Verdict:
        self.reviews[article.url] += 1
        verdict = await self._rules.review(article)
        return Verdict(accepted=verdict.accepted, reasons=verdict.reasons, reviewer=self.name)

    async def translate(
        self, text: str, language: str, scope: CallScope | None = None
    ) -> str | None:
        return None
