"""Small asyncio helpers the I/O layers share."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


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


class GroupCommit(Generic[T]):
    """Writes made together: what callers ask for while a write is on its way goes out
    as the next one, in the order asked, through ``write`` (which gets every item of
    that turn). Each caller returns once the write holding its items is done, or raises
    what that write raised; a write that fails does not stop the next.

    For a service whose handlers run at once and each wait for their own write (the
    allocator's reservations, every publish on the bus): one write per turn of the
    event loop, not a round trip per handler."""

    def __init__(self, write: Callable[[list[T]], Awaitable[None]], name: str) -> None:
        self._write = write
        self._name = name
        self._asked: list[tuple[list[T], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def __call__(self, items: list[T]) -> None:
        """Have ``items`` written; returns once they are."""
        done = asyncio.get_running_loop().create_future()
        self._asked.append((items, done))
        if self._writer is None or self._writer.done():
            # In a context of its own: not the first caller's (its trace would become
            # that of every write after it).
            self._writer = asyncio.create_task(
                self._run(), name=self._name, context=contextvars.Context()
            )
        await done

    async def _run(self) -> None:
        while self._asked:
            asked, self._asked = self._asked, []
            try:
                await self._write([item for items, _ in asked for item in items])
            except asyncio.CancelledError:
                for _, done in asked:
                    done.cancel()
                raise
            except Exception as exc:
                for _, done in asked:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _, done in asked:
                if not done.done():
                    done.set_result(None)


class Acting:
    """Whether a lease holder may act now: from a renewal until a whole lease after that
    renewal was *sent* (:meth:`renew`), and not while it is paused or lost (:meth:`clear`);
    shared/bus.py ``Lease`` keeps it.

    Time-aware, so that a process whose loop stalled past its lease (a long computation,
    the machine starved) does not act on a lease it may have lost before its renewal
    loop has run again. What a holder's process writes waits in :meth:`wait`: the bus
    (``Bus.fence``) and the API server (``kube.Client.fence``)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.until = 0.0
        """``time.monotonic()`` at which the last renewal lapses."""

    def is_set(self) -> bool:
        """Whether the holder may act now: renewed, not cleared, and its last renewal not lapsed."""
        return self._event.is_set() and time.monotonic() < self.until

    def renew(self, until: float) -> None:
        """A renewal sent: the holder may act until ``until`` (``time.monotonic()``)."""
        self.until = until
        self._event.set()

    def clear(self) -> None:
        """Paused or lost: nothing waiting in :meth:`wait` proceeds until the next renewal."""
        self._event.clear()

    async def wait(self) -> None:
        """Return once the holder may act (at once while it may); a lapsed renewal waits for the
        next."""
        while not self.is_set():
            self._event.clear()  # lapsed: set again by the next renewal
            await self._event.wait()
