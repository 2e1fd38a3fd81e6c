"""The memory of each queue's past use, sampled and kept across restarts.

The core (shared/core/usage.py) integrates what each queue's bound pods hold; this
module samples it every ``scheduler.usage.sampleS`` on the wall clock (so stored times
mean the same to the next replica) and stores each queue's memory under its name in the
``tessera-usage`` KV bucket (the capacity's under ``_capacity``: Kubernetes names have
no underscore). The active replica loads the bucket when it starts; the time it was not
sampled counts at what each queue held at the last stored sample, as if the pods had
gone on running (they usually did: the coordinator does not stop them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
import nats.js.errors
from nats.js.kv import KeyValue

from shared.bus import through_failover
from shared.core.gangs import Gangs
from shared.core.usage import CAPACITY, Stored

log = logging.getLogger(__name__)

CAPACITY_KEY = "_capacity"
_decode = msgspec.json.Decoder(Stored).decode


def key_of(name: str) -> str:
    """The KV key a queue's memory (or the capacity's) is stored under."""
    return name or CAPACITY_KEY


def name_of(key: str) -> str:
    """The queue (or :data:`~shared.core.usage.CAPACITY`) a KV key stores."""
    return CAPACITY if key == CAPACITY_KEY else key


async def load(gangs: Gangs, kv: KeyValue) -> int:
    """Take back every stored memory into ``gangs.usage``; how many were stored. An entry
    that does not decode is dropped with a warning (its queue starts afresh)."""
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        keys = []
    stored: dict[str, Stored] = {}
    for key in keys:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            entry = await kv.get(key)
            try:
                stored[name_of(key)] = _decode(entry.value or b"")
            except msgspec.DecodeError as exc:
                log.warning("usage memory of %s dropped: it does not decode (%s)", key, exc)
    gangs.usage.restore(stored)
    return len(stored)


async def keep(gangs: Gangs, kv: KeyValue, sample_s: float) -> None:
    """Every ``sample_s``: count what each queue holds, then store what changed."""
    while True:
        gangs.sample_usage(time.time())
        changed = gangs.usage.stored(sorted(gangs.usage.dirty))
        for name, entry in changed.items():
            await _store(kv, key_of(name), entry)
        await asyncio.sleep(sample_s)


async def _store(kv: KeyValue, key: str, entry: Stored | None) -> None:
    """Put one queue's memory, or delete it (None)."""
    if entry is None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await through_failover(f"usage {key}", lambda: kv.delete(key))
        return
    data = msgspec.json.encode(entry)
    await through_failover(f"usage {key}", lambda: kv.put(key, data))
