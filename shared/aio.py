"""Small asyncio helpers the I/O layers share."""

from __future__ import annotations

import asyncio
import contextlib
import signal


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that a library turned into a timeout.

    On Python 3.11, a cancel that races a timeout inside ``asyncio.wait_for`` (nats-py's
    fetch) or aiohttp's timers can surface as ``TimeoutError``; a loop that treats
    timeouts as "nothing yet" would then never stop. The task still counts the request
    (``Task.cancelling()``), so loops call this after every timeout they absorb.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (a process's own loop only: a platform or a
    thread without signal handlers leaves it to be set by hand)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop
