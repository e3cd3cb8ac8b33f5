"""The news pipeline's per-source watermark: what a re-fetch hands on without a lookup."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nightcrew.news.fetch import FeedItem
from nightcrew.news.items import new_watermark, past_watermark

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def item(url: str, minutes_ago: int | None) -> FeedItem:
    published = None if minutes_ago is None else NOW - timedelta(minutes=minutes_ago)
    return FeedItem(url=url, title="t", summary="s", published=published, image_url=None)


def test_without_a_watermark_everything_passes_and_the_newest_date_is_kept() -> None:
    items = [item("a", 10), item("b", 5), item("c", None)]
    assert past_watermark(items, None, [], NOW) == items
    assert new_watermark(items, None, [], NOW) == (NOW - timedelta(minutes=5), ["b"])


def test_older_and_already_handed_on_items_are_skipped_undated_ones_pass() -> None:
    mark = NOW - timedelta(minutes=5)
    items = [item("a", 10), item("b", 5), item("b2", 5), item("new", 1), item("undated", None)]
    kept = past_watermark(items, mark, ["b"], NOW)
    assert [i.url for i in kept] == ["b2", "new", "undated"]
    assert new_watermark(items, mark, ["b"], NOW) == (NOW - timedelta(minutes=1), ["new"])


def test_urls_at_the_same_instant_accumulate() -> None:
    mark = NOW - timedelta(minutes=5)
    assert new_watermark([item("b2", 5)], mark, ["b"], NOW) == (mark, ["b", "b2"])


def test_a_date_far_in_the_future_neither_moves_the_watermark_nor_is_trusted() -> None:
    mark = NOW - timedelta(minutes=5)
    future = FeedItem(
        url="f", title="t", summary="s", published=NOW + timedelta(days=400), image_url=None
    )
    assert new_watermark([future], mark, ["b"], NOW) == (mark, ["b"])
    assert past_watermark([future], mark, ["b"], NOW) == [future]  # de-duplicated by URL


def test_a_feed_that_went_back_in_time_keeps_the_watermark() -> None:
    mark = NOW - timedelta(minutes=5)
    assert new_watermark([item("old", 60)], mark, ["b"], NOW) == (mark, ["b"])
