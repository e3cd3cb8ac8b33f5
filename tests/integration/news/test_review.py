"""The reviewers: the offline rules, and a loopback server speaking the OpenAI chat API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from werkzeug import Request

from nightcrew.adapters.reviewer import (
    Article,
    OfflineReviewer,
    OpenAICompatibleReviewer,
    ReviewError,
)
from tests.support.servers import RecordingServer

STORY = Article(
    url="https://news.example/a",
    title="Council approves the new bridge",
    summary="After two years of debate the city council voted 9 to 2 for it.",
)


@pytest.fixture
async def model_http() -> AsyncIterator[httpx.AsyncClient]:
    """The reviewer's own client, as production gives it: the model's address is the
    operator's, so the news client's address policy does not apply."""
    async with httpx.AsyncClient() as client:
        yield client


async def test_offline_rules_are_named() -> None:
    reviewer = OfflineReviewer(blocked_terms=frozenset({"casino"}))
    assert (await reviewer.review(STORY)).accepted
    again = await reviewer.review(STORY)
    assert not again.accepted and again.reasons == ["duplicate title"]
    short = await reviewer.review(Article(url="u", title="", summary="hi"))
    assert short.reasons == ["missing title", "too short"]
    spam = await reviewer.review(
        Article(
            url="u",
            title="Best CASINO bonus of the year",
            summary="Sign up now and win a lot of money today.",
        )
    )
    assert spam.reasons == ["blocked terms: casino"]
    assert reviewer.translation_enabled is False
    assert await reviewer.translate("hello", "de") is None


def chat(content: str) -> Any:
    def respond(request: Request) -> tuple[int, dict[str, Any]]:
        return 200, {
            "id": "c1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        }

    return respond


async def test_chat_reviewer_sends_the_article_and_reads_the_verdict(
    stripe_server: RecordingServer, model_http: httpx.AsyncClient
) -> None:
    llm = stripe_server  # any loopback recorder will do; this one plays the LLM
    llm.responder = chat('Sure: {"accept": false, "reason": "advert", "summary": "An ad."}')
    reviewer = OpenAICompatibleReviewer(
        model_http, base_url=llm.url + "/v1", model="llama3", api_key="sk-local"
    )
    verdict = await reviewer.review(STORY)
    assert not verdict.accepted and verdict.reasons == ["advert"]
    assert verdict.summary == "An ad." and verdict.reviewer == "chat:llama3"
    [call] = llm.requests
    assert call.path == "/v1/chat/completions"
    assert call.headers["Authorization"] == "Bearer sk-local"
    body = call.json()
    assert body["model"] == "llama3" and "Council approves" in body["messages"][1]["content"]

    llm.reset()
    llm.responder = chat("Die Brücke wurde genehmigt.")
    assert await reviewer.translate("The bridge was approved.", "German") == (
        "Die Brücke wurde genehmigt."
    )


@pytest.mark.parametrize(
    ("status", "content", "transient"),
    [(500, None, True), (429, None, True), (400, None, False), (200, "I think it is fine", False)],
)
async def test_chat_failures_say_whether_to_retry(
    stripe_server: RecordingServer,
    model_http: httpx.AsyncClient,
    status: int,
    content: str | None,
    transient: bool,
) -> None:
    if content is None:
        stripe_server.status = status
    else:
        stripe_server.responder = chat(content)
    reviewer = OpenAICompatibleReviewer(model_http, base_url=stripe_server.url, model="m")
    with pytest.raises(ReviewError) as caught:
        await reviewer.review(STORY)
    assert caught.value.transient is transient
    assert json.loads(stripe_server.requests[0].body)["model"] == "m"


def test_the_reviewer_follows_the_configuration() -> None:
    from nightcrew.adapters.reviewer import make_reviewer
    from nightcrew.config import Settings

    client = httpx.AsyncClient()
    offline = make_reviewer(Settings.model_validate({}), client)
    chat_reviewer = make_reviewer(
        Settings.model_validate(
            {"NEWS_AI_BASE_URL": "http://127.0.0.1:11434/v1", "NEWS_AI_MODEL": "llama3"}
        ),
        client,
    )
    assert offline.name == "offline-rules" and chat_reviewer.name == "chat:llama3"
