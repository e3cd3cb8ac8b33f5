from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nightcrew.adapters.queues import MemoryQueueProducer
from nightcrew.clock import FrozenClock
from nightcrew.errors import QueueError

T0 = datetime(2026, 11, 29, tzinfo=UTC)


async def test_memory_producer_records_and_delays() -> None:
    q = MemoryQueueProducer(FrozenClock(T0))
    await q.send("podcast-imports", {"import_id": "i"}, delay_seconds=30)
    assert q.sent[0].body == {"import_id": "i"}
    assert q.sent[0].visible_at == T0 + timedelta(seconds=30)


async def test_memory_producer_refuses_bad_messages_and_can_fail() -> None:
    q = MemoryQueueProducer(FrozenClock(T0), failing_queues=frozenset({"down"}))
    with pytest.raises(QueueError, match="not JSON"):
        await q.send("x", {"when": object()})
    with pytest.raises(QueueError, match=">= 0"):
        await q.send("x", {}, delay_seconds=-1)
    with pytest.raises(QueueError, match="refusing"):
        await q.send("down", {})
    assert q.sent == []
