"""The allocator's reservations on a real nats-server: group-committed batches, what a
restarted allocator reads back, and entries of older releases."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import nats.js.errors
import pytest
from nats.js.kv import KeyValue

from services.device_allocator.reservations import (
    BATCH_PREFIX,
    ENTRY_BYTES,
    Reservation,
    Reservations,
)
from shared import events as ev
from shared.bus import Bus
from shared.config import NatsConfig
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import NodeName, PodRef, PodUID
from shared.core.spec import DeviceSpecs


def grant(i: int, node: str = "node-a") -> PodGrant:
    pod = PodRef(namespace="default", name=f"pod-{i}", uid=PodUID(f"uid-{i}"))
    return PodGrant(pod=pod, node=NodeName(node), containers=())


@pytest.fixture
async def kv(nats_cfg: NatsConfig) -> AsyncIterator[KeyValue]:
    async with Bus(nats_cfg, name="admin") as bus:
        yield await bus.bucket(f"test-reservations-{uuid.uuid4().hex[:8]}")


async def keys(kv: KeyValue) -> list[str]:
    try:
        return sorted(await kv.keys())
    except nats.js.errors.NoKeysError:
        return []


async def reloaded(kv: KeyValue, bound: tuple[int, ...] = ()) -> tuple[Reservations, Ledger]:
    """What a restarted allocator reads: a fresh ledger holding the ``bound`` pods."""
    ledger = Ledger(DeviceSpecs())
    for i in bound:
        ledger.grant(grant(i))
    fresh = Reservations(kv)
    await fresh.load(ledger, lambda node: node == "node-a")
    return fresh, ledger


async def test_reservations_made_together_are_one_kv_write_and_all_come_back(
    kv: KeyValue,
) -> None:
    reserved = Reservations(kv)
    await asyncio.gather(*(reserved.put(grant(i), 1) for i in range(32)))
    # The first put goes out alone; the 31 asked for while it was on its way, together.
    assert reserved.writes <= 2
    assert all(k.startswith(BATCH_PREFIX) for k in await keys(kv))
    fresh, ledger = await reloaded(kv)
    assert sorted(fresh.open) == sorted(PodUID(f"uid-{i}") for i in range(32))
    assert set(ledger.pods) == set(fresh.open)


async def test_dropped_reservations_are_rewritten_out_and_the_last_deletes_the_entry(
    kv: KeyValue,
) -> None:
    reserved = Reservations(kv)
    await asyncio.gather(*(reserved.put(grant(i), 1) for i in range(10)))
    written = reserved.writes
    await asyncio.gather(*(reserved.forget(PodUID(f"uid-{i}")) for i in range(4)))
    assert reserved.writes - written <= 2
    fresh, _ = await reloaded(kv)
    assert sorted(fresh.open) == sorted(PodUID(f"uid-{i}") for i in range(4, 10))
    await asyncio.gather(*(reserved.forget(PodUID(f"uid-{i}")) for i in range(4, 10)))
    assert await keys(kv) == []


async def test_a_reservation_dropped_before_its_write_is_never_read_back(kv: KeyValue) -> None:
    reserved = Reservations(kv)
    put = asyncio.ensure_future(reserved.put(grant(1), 1))
    await asyncio.sleep(0)  # on its way
    await asyncio.gather(reserved.put(grant(2), 1), reserved.forget(PodUID("uid-2")))
    await put
    fresh, _ = await reloaded(kv)
    assert list(fresh.open) == [PodUID("uid-1")]


async def test_a_restart_skips_bound_pods_and_deletes_entries_with_nothing_open(
    kv: KeyValue,
) -> None:
    reserved = Reservations(kv)
    await asyncio.gather(*(reserved.put(grant(i), 1) for i in range(3)))
    fresh, _ = await reloaded(kv, bound=(0, 1, 2))
    assert fresh.open == {}
    assert await keys(kv) == []


async def test_a_pod_reserved_again_keeps_its_latest_reservation(kv: KeyValue) -> None:
    first = Reservations(kv)
    await first.put(grant(1, "node-a"), 1)
    await first.put(grant(2), 1)  # keeps the first entry alive
    second = Reservations(kv)  # e.g. written by the previous leader
    await second.put(grant(1, "node-a"), 2)
    fresh, ledger = await reloaded(kv)
    assert fresh.open[PodUID("uid-1")].attempt == 2
    assert ledger.pods[PodUID("uid-1")].node == "node-a"


async def test_an_entry_of_an_older_release_is_read_and_another_shards_left_alone(
    kv: KeyValue,
) -> None:
    old = Reservation(grant=grant(7), attempt=1, at=time.time())
    await kv.put("uid-7", msgspec.json.encode(old))
    other = Reservations(kv)
    await other.put(grant(8, node="node-b"), 1)  # node-b is another shard's
    fresh, _ = await reloaded(kv)
    assert list(fresh.open) == [PodUID("uid-7")]
    await fresh.forget(PodUID("uid-7"))
    remaining = await keys(kv)
    assert "uid-7" not in remaining
    assert len(remaining) == 1
    assert remaining[0].startswith(BATCH_PREFIX)


async def test_a_record_of_a_pod_bound_before_a_restart_never_comes_back(kv: KeyValue) -> None:
    reserved = Reservations(kv)
    await asyncio.gather(reserved.put(grant(1), 1), reserved.put(grant(2), 1))
    # Restart 1: pod 1 is bound (the API server says so), pod 2 still waits.
    first, _ = await reloaded(kv, bound=(1,))
    assert list(first.open) == [PodUID("uid-2")]
    # Pod 1 is deleted meanwhile; restart 2 must not reserve its devices again.
    second, ledger = await reloaded(kv)
    assert list(second.open) == [PodUID("uid-2")]
    assert PodUID("uid-1") not in ledger.pods


async def test_a_burst_too_big_for_one_message_is_written_in_several_entries(
    kv: KeyValue,
) -> None:
    reserved = Reservations(kv)
    await asyncio.gather(*(reserved.put(grant(i), 1) for i in range(2000)))
    stored = await keys(kv)
    assert len(stored) >= 2
    for key in stored:  # NATS takes 1 MiB at most
        assert len((await kv.get(key)).value or b"") <= ENTRY_BYTES
    fresh, _ = await reloaded(kv)
    assert len(fresh.open) == 2000


async def test_the_claims_allocated_with_a_reservation_come_back_with_it(kv: KeyValue) -> None:
    claim = ev.ClaimAllocation(
        namespace="ns", name="c", uid="u", allocation={"devices": {"results": []}}
    )
    reserved = Reservations(kv)
    await reserved.put(grant(0), 1, (claim,))
    await reserved.put(grant(1), 1)
    fresh, _ = await reloaded(kv)
    assert fresh.open[PodUID("uid-0")].claims == (claim,)
    assert fresh.open[PodUID("uid-1")].claims == ()
