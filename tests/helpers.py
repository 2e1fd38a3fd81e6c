"""Waiting for a real server to reach a state, with a deadline and a clear failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns a truthy value; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")
