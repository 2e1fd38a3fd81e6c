"""The controller's timers: a policy's delayed action, a sync retried, a finished Job's
``ttlSecondsAfterFinished``, each a callback run on one task when its time comes."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable, Callable


class Timers:
    """Callbacks due at a time of the event loop's clock, run one at a time."""

    def __init__(self) -> None:
        self.due: list[tuple[float, int, Callable[[], Awaitable[None]]]] = []
        self.order = itertools.count()
        self.wake = asyncio.Event()

    def at(self, delay_s: float, then: Callable[[], Awaitable[None]]) -> None:
        """Call ``then`` in ``delay_s`` seconds (on the :meth:`run` task)."""
        due = asyncio.get_running_loop().time() + delay_s
        heapq.heappush(self.due, (due, next(self.order), then))
        self.wake.set()

    async def run(self) -> None:
        """Run each callback once it is due, for ever."""
        loop = asyncio.get_running_loop()
        while True:
            self.wake.clear()
            now = loop.time()
            while self.due and self.due[0][0] <= now:
                _, _, then = heapq.heappop(self.due)
                await then()
            wait = self.due[0][0] - loop.time() if self.due else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=wait)
