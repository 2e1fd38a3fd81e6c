"""The memory of each queue's past use, sampled and kept across restarts.

The core (shared/core/usage.py) integrates what each queue's bound pods hold; this
module samples it every ``scheduler.usage.sampleS`` on the wall clock (so stored times
mean the same to the next replica) and stores each queue's memory in the
``tessera-usage`` KV bucket: under ``q.`` and its name in unpadded URL-safe base64 (a
PodGroup may name any string as its queue, and a KV key allows few characters), the
capacity's under ``capacity``. The active replica loads the bucket when it starts; the
time it was not sampled counts at what each queue held at the last stored sample, as
if the pods had gone on running (they usually did: the coordinator does not stop them).
The first sample is taken a ``sampleS`` after the start, once the bound pods are known
again.
"""

from __future__ import annotations

import asyncio
import base64
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

CAPACITY_KEY = "capacity"
QUEUE_PREFIX = "q."
_decode = msgspec.json.Decoder(Stored).decode


def key_of(name: str) -> str:
    """The KV key a queue's memory (or the capacity's) is stored under."""
    if name == CAPACITY:
        return CAPACITY_KEY
    return QUEUE_PREFIX + base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def name_of(key: str) -> str | None:
    """The queue (or :data:`~shared.core.usage.CAPACITY`) a KV key stores; None for a key
    this module did not write."""
    if key == CAPACITY_KEY:
        return CAPACITY
    if not key.startswith(QUEUE_PREFIX):
        return None
    coded = key[len(QUEUE_PREFIX) :]
    try:
        return base64.urlsafe_b64decode(coded + "=" * (-len(coded) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


async def load(gangs: Gangs, kv: KeyValue) -> int:
    """Take back every stored memory into ``gangs.usage``; how many were stored. An entry
    that does not decode is dropped with a warning (its queue starts afresh)."""
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        keys = []
    stored: dict[str, Stored] = {}
    for key in keys:
        name = name_of(key)
        if name is None:
            log.warning("usage memory: key %s is not one of ours; left alone", key)
            continue
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            entry = await kv.get(key)
            try:
                stored[name] = _decode(entry.value or b"")
            except msgspec.DecodeError as exc:
                log.warning("usage memory of %s dropped: it does not decode (%s)", key, exc)
    gangs.usage.restore(stored)
    return len(stored)


async def keep(gangs: Gangs, kv: KeyValue, sample_s: float) -> None:
    """Every ``sample_s``: count what each queue holds, then store what changed."""
    while True:
        await asyncio.sleep(sample_s)
        gangs.sample_usage(time.time())
        changed = gangs.usage.stored(sorted(gangs.usage.dirty))
        for name, entry in changed.items():
            await _store(kv, key_of(name), entry)


async def _store(kv: KeyValue, key: str, entry: Stored | None) -> None:
    """Put one queue's memory, or delete it (None)."""
    if entry is None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await through_failover(f"usage {key}", lambda: kv.delete(key))
        return
    data = msgspec.json.encode(entry)
    await through_failover(f"usage {key}", lambda: kv.put(key, data))
