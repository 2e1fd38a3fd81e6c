"""The ``Scheduled`` Events of bound pods, queued beside the binds and written one at a
time, in order (services/binder/service.py puts them): under a burst the API server
spends itself on Bindings first, and the Events follow as it has room. Bounded like
kube-scheduler's event broadcaster: past :data:`SCHEDULED_BACKLOG` the oldest is
dropped and counted; at shutdown what is queued is written for up to :data:`FLUSH_S`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from shared.core.model import PodRef
from shared.metrics import Metrics

log = logging.getLogger(__name__)

SCHEDULED_BACKLOG = 10_000
"""``Scheduled`` Events queued at most (then the oldest is dropped)."""
FLUSH_S = 2.0
"""At shutdown, how long the queued ``Scheduled`` Events may take to be written."""

Tell = Callable[[PodRef, str], Awaitable[None]]
"""Write a ``Scheduled`` Event on a pod: (pod, message)."""


class ScheduledEvents:
    """The ``Scheduled`` Events of bound pods, written in order, one at a time."""

    def __init__(self, metrics: Metrics, tell: Tell) -> None:
        self.tell = tell
        self.queue: deque[tuple[PodRef, str]] = deque()
        self.wake = asyncio.Event()
        self.dropped = metrics.counter(
            "tessera_scheduled_events_dropped",
            "Scheduled Events dropped because too many were waiting to be written.",
        )
        metrics.gauge(
            "tessera_scheduled_events_queued",
            "Scheduled Events waiting to be written.",
            lambda: [(float(len(self.queue)), {})],
        )

    def put(self, pod: PodRef, message: str) -> None:
        """Queue ``pod``'s Event (the oldest dropped past the backlog)."""
        if len(self.queue) >= SCHEDULED_BACKLOG:
            lost, _ = self.queue.popleft()
            self.dropped.add(1)
            log.warning("too many Events waiting: the Scheduled Event of %s is dropped", lost)
        self.queue.append((pod, message))
        self.wake.set()

    async def run(self) -> None:
        """Write what is queued, as it comes (the binder's task)."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            await self._drain()

    async def _drain(self) -> None:
        while self.queue:
            pod, message = self.queue.popleft()
            await self.tell(pod, message)

    async def flush(self) -> None:
        """At shutdown: write what is queued, for up to :data:`FLUSH_S`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain(), FLUSH_S)
        if self.queue:
            log.warning("%d Scheduled Events not written at shutdown", len(self.queue))
