"""NEWS_STAGE_PREFETCH: each stage's prefetch, read once and refused with the bad entry named."""

from __future__ import annotations

import pytest

from nightcrew.config import load_settings
from nightcrew.setting_parsers import parse_stage_prefetch


def test_named_stages_get_their_prefetch_and_the_rest_are_left_to_concurrency() -> None:
    assert parse_stage_prefetch("fetch=8, enrich=8,review=2,write=16") == {
        "fetch": 8,
        "enrich": 8,
        "review": 2,
        "write": 16,
    }
    assert parse_stage_prefetch("review=1") == {"review": 1}
    assert parse_stage_prefetch("") == {} and parse_stage_prefetch(" , ") == {}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("review=0", "'review=0'"),
        ("review=two", "'review=two'"),
        ("review=1001", "'review=1001'"),
        ("translate=4", "'translate=4'"),
        ("review", "'review'"),
        ("review=2,review=3", "'review=3': review is given twice"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(value: str, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("'", ".")):
        parse_stage_prefetch(value)


def test_the_setting_is_validated_at_startup_with_the_variable_and_the_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nightcrew.errors import ConfigError

    monkeypatch.setenv("NEWS_STAGE_PREFETCH", "fetch=8,review=-1")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid configuration: NEWS_STAGE_PREFETCH: cannot read")
    assert "'review=-1'" in message and "1..1000" in message
    monkeypatch.setenv("NEWS_STAGE_PREFETCH", "fetch=8,review=2")
    assert load_settings().news_stage_prefetch == "fetch=8,review=2"
