"""AI review and summary translation, behind one interface with two implementations.

* ``OpenAICompatibleReviewer`` — any chat-completions API (hosted, Ollama, vLLM, llama.cpp):
  ``POST {NEWS_AI_BASE_URL}/chat/completions``; the model answers a small JSON verdict.
* ``OfflineReviewer`` — the default, and honest about what it is: named rules (missing title,
  too short, duplicate title, blocked terms), no model, and translation reported disabled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from nightcrew.config import Settings, reveal
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error

MIN_TEXT_CHARS = 40
TIMEOUT = httpx.Timeout(60.0, connect=5.0)
SYSTEM_PROMPT = (
    "You review news items for a public news site. Answer with one JSON object only: "
    '{"accept": true|false, "reason": "<one short sentence>", "summary": "<two sentences>"}. '
    "Reject spam, adverts, duplicates, and items with no news value."
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Article:
    url: str
    title: str
    summary: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    summary: str | None = None
    reviewer: str = ""


class ReviewError(NightcrewError):
    """The reviewer could not give a verdict; ``transient`` says whether to try again."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class Reviewer(Protocol):
    name: str
    translation_enabled: bool

    async def review(self, article: Article) -> Verdict: ...

    async def translate(self, text: str, language: str) -> str | None: ...


class OfflineReviewer:
    name = "offline-rules"
    translation_enabled = False

    def __init__(self, *, blocked_terms: frozenset[str] = frozenset()) -> None:
        self._blocked = frozenset(t.lower() for t in blocked_terms)
        self._titles: set[str] = set()

    async def review(self, article: Article) -> Verdict:
        reasons = []
        title = " ".join(article.title.split()).lower()
        if not title:
            reasons.append("missing title")
        if len(article.title) + len(article.summary) < MIN_TEXT_CHARS:
            reasons.append("too short")
        if title and title in self._titles:
            reasons.append("duplicate title")
        if self._blocked:
            text = f"{article.title} {article.summary}".lower()
            hits = sorted(t for t in self._blocked if t in text)
            if hits:
                reasons.append("blocked terms: " + ", ".join(hits))
        if title:
            self._titles.add(title)
        return Verdict(accepted=not reasons, reasons=reasons, reviewer=self.name)

    async def translate(self, text: str, language: str) -> str | None:
        return None  # no model, no translation: reported as disabled, never faked


class OpenAICompatibleReviewer:
    translation_enabled = True

    def __init__(
        self, client: httpx.AsyncClient, *, base_url: str, model: str, api_key: str | None = None
    ) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.name = f"chat:{model}"

    async def _chat(self, system: str, user: str) -> str:
        try:
            response = await self._client.post(
                self._url,
                headers=self._headers,
                timeout=TIMEOUT,
                json={
                    "model": self._model,
                    "temperature": 0,
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": user},
                    ],
                },
            )
        except httpx.HTTPError as exc:
            raise ReviewError(describe_error(exc), transient=True) from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise ReviewError(f"the model answered {response.status_code}", transient=True)
        if response.status_code != 200:
            raise ReviewError(f"the model answered {response.status_code}", transient=False)
        try:
            return str(response.json()["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ReviewError(
                "the model's answer is not a chat completion", transient=False
            ) from exc

    async def review(self, article: Article) -> Verdict:
        content = await self._chat(
            SYSTEM_PROMPT, f"Title: {article.title}\nURL: {article.url}\n\n{article.summary}"
        )
        try:
            start, end = content.index("{"), content.rindex("}") + 1
            verdict = json.loads(content[start:end])
            accepted = bool(verdict["accept"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ReviewError(
                f"the model's verdict is not the JSON asked for: {content[:120]!r}", transient=False
            ) from exc
        reason = str(verdict.get("reason") or "")
        return Verdict(
            accepted=accepted,
            reasons=[reason] if reason else [],
            summary=str(verdict.get("summary") or "") or None,
            reviewer=self.name,
        )

    async def translate(self, text: str, language: str) -> str | None:
        answer = await self._chat(
            f"Translate the user's text into {language}. Answer with the translation only.", text
        )
        return answer.strip() or None


def make_reviewer(settings: Settings, client: httpx.AsyncClient) -> Reviewer:
    """The chat-completions reviewer when NEWS_AI_BASE_URL and NEWS_AI_MODEL are set; else the
    offline rules."""
    if settings.news_ai_base_url and settings.news_ai_model:
        key = settings.news_ai_api_key
        return OpenAICompatibleReviewer(
            client,
            base_url=settings.news_ai_base_url,
            model=settings.news_ai_model,
            api_key=reveal(key),
        )
    return OfflineReviewer()
