"""AI review and summary translation, behind one interface with two implementations.

* ``ChatReviewer`` (``model_reviewer.py``) — any chat-completions API (hosted, Ollama, vLLM,
  llama.cpp) through the official ``openai`` SDK; the model answers a typed JSON verdict.
* ``OfflineReviewer`` — the default, and honest about what it is: named rules (missing title,
  too short, duplicate title, blocked terms), no model, and translation reported disabled.

Every call takes a ``CallScope``: the ``Spend`` its tokens are added to (the run's, the pass's,
the stage message's), and ``ready``, asked once the call has its slot and just before the
request — a lost lease or a stopping worker raises there, so no model is asked without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from nightcrew.config import Settings
from nightcrew.errors import NightcrewError
from nightcrew.jsonable import Jsonable

if TYPE_CHECKING:
    from nightcrew.adapters.model_calls import ModelCalls

MIN_TEXT_CHARS = 40
# One model call, its retries and their waits included, ends within this long (cut there): what
# a stopping pipeline worker's grace waits for (``worker.STOP_GRACE_SECONDS``).
CALL_SECONDS = 65.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Article:
    url: str
    title: str
    summary: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict(Jsonable):
    """A review's verdict; its JSON is what a candidate keeps until it is written."""

    accepted: bool
    reasons: list[str] = field(default_factory=list)
    summary: str | None = None
    reviewer: str = ""


@dataclass(slots=True)
class Spend:
    """Tokens the model's answers used, summed for one run, pass or stage message (what
    MAX_AI_REVIEWS protects, in the unit a provider bills)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def take(self, other: Spend) -> None:
        self.add(other.prompt_tokens, other.completion_tokens)


def _ready() -> None:
    return None


@dataclass(frozen=True, slots=True)
class CallScope:
    """What one model call is made for: the ``spend`` its tokens add to, and ``ready``, asked
    once the call has its slot (NEWS_AI_CONCURRENCY), just before the request; it raises to
    stop the call (a lease lost, a worker stopping while the call waited)."""

    spend: Spend = field(default_factory=Spend)
    ready: Callable[[], None] = _ready


class ReviewError(NightcrewError):
    """The reviewer could not give a verdict; ``transient`` says whether to try again."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status  # the model server's HTTP status, when it answered one


class Reviewer(Protocol):
    name: str
    translation_enabled: bool

    async def aclose(self) -> None: ...

    async def review(self, article: Article, scope: CallScope | None = None) -> Verdict: ...

    async def translate(
        self, text: str, language: str, scope: CallScope | None = None
    ) -> str | None: ...


class OfflineReviewer:
    name = "offline-rules"
    translation_enabled = False

    async def aclose(self) -> None:
        return None

    def __init__(self, *, blocked_terms: frozenset[str] = frozenset()) -> None:
        self._blocked = frozenset(t.lower() for t in blocked_terms)
        self._titles: set[str] = set()

    async def review(self, article: Article, scope: CallScope | None = None) -> Verdict:
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

    async def translate(
        self, text: str, language: str, scope: CallScope | None = None
    ) -> str | None:
        return None  # no model, no translation: reported as disabled, never faked


def make_reviewer(settings: Settings, calls: ModelCalls) -> Reviewer:
    """The chat-completions reviewer when NEWS_AI_BASE_URL and NEWS_AI_MODEL are set, its calls
    held to ``calls``; else the offline rules."""
    if settings.news_ai_base_url and settings.news_ai_model:
        from nightcrew.adapters.model_reviewer import ChatReviewer  # the SDK, only when used

        return ChatReviewer.from_settings(settings, calls)
    return OfflineReviewer()
