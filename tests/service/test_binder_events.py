"""The binder's queue of ``Scheduled`` Events (services/binder/scheduled.py):
written in order, one at a time, the oldest dropped past the backlog, and flushed at
shutdown for a bounded time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.binder import scheduled as binder
from shared.core.model import PodRef, PodUID
from shared.metrics import Metrics


class _Binder:
    """What the queue uses of the binder: its metrics and its Event writer."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.rt: Any = type("Rt", (), {"metrics": Metrics("test")})()
        self.told: list[str] = []
        self.in_flight = 0
        self.most = 0
        self.delay_s = delay_s

    async def scheduled(self, pod: PodRef, message: str) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        self.told.append(message)


def _pod(i: int) -> PodRef:
    return PodRef(namespace="ns", name=f"p{i}", uid=PodUID(f"u{i}"))


def _metric(fake: _Binder, name: str) -> float:
    for line in fake.rt.metrics.text().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def test_events_are_written_in_order_one_at_a_time() -> None:
    fake = _Binder(delay_s=0.001)
    queue = binder.ScheduledEvents(fake.rt.metrics, fake.scheduled)
    runner = asyncio.create_task(queue.run())
    for i in range(20):
        queue.put(_pod(i), f"m{i}")
    assert _metric(fake, "tessera_scheduled_events_queued") == 20
    for _ in range(500):
        if len(fake.told) == 20:
            break
        await asyncio.sleep(0.002)
    runner.cancel()
    assert fake.told == [f"m{i}" for i in range(20)]
    assert fake.most == 1


async def test_past_the_backlog_the_oldest_is_dropped_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(binder, "SCHEDULED_BACKLOG", 3)
    fake = _Binder()
    queue = binder.ScheduledEvents(fake.rt.metrics, fake.scheduled)
    for i in range(5):
        queue.put(_pod(i), f"m{i}")
    await queue.flush()
    assert fake.told == ["m2", "m3", "m4"]
    assert _metric(fake, "tessera_scheduled_events_dropped_total") == 2


async def test_the_shutdown_flush_gives_up_after_its_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(binder, "FLUSH_S", 0.05)
    fake = _Binder(delay_s=0.02)
    queue = binder.ScheduledEvents(fake.rt.metrics, fake.scheduled)
    for i in range(50):
        queue.put(_pod(i), f"m{i}")
    await queue.flush()
    assert 1 <= len(fake.told) < 50
    assert fake.told == [f"m{i}" for i in range(len(fake.told))]
