"""A bus that survives a lost server: three nats-servers in a JetStream cluster, the
stream and buckets kept three times; one server is killed for good mid-stream and no
event is lost, no publisher or consumer stops (tools/localcluster.py, shared/bus.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgspec
import pytest

from shared import busauth
from shared import events as ev
from shared.bus import Bus, Delivery
from tests.helpers import eventually
from tools.localcluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(with_kube=False, nats_servers=3) as c:
        yield c


def _released(i: int) -> ev.AllocationReleased:
    return ev.AllocationReleased(
        pod=ev.PodRef(namespace="ns", name=f"p{i}", uid=f"u{i}"), node="n1", reason="test"
    )


async def test_losing_one_server_loses_no_event(cluster: LocalCluster) -> None:
    allocator = msgspec.structs.replace(cluster.nats_config(), user="device-allocator")
    assert allocator.replicas == 3
    got: set[str] = set()

    async def record(event: ev.AnyEvent, _: Delivery) -> None:
        assert isinstance(event, ev.AllocationReleased)
        got.add(event.pod.uid)

    coordinator = msgspec.structs.replace(allocator, user="gang-coordinator")
    async with (
        Bus(allocator, name="device-allocator") as publisher,
        Bus(coordinator, name="gang-coordinator") as consumer,
    ):
        info = await publisher.js.stream_info(allocator.stream)
        assert info.config.num_replicas == 3
        lease = await publisher.bucket(busauth.LEASE_BUCKET, ttl_s=5)
        assert (await lease.status()).stream_info.config.num_replicas == 3
        consumer.consume("gang-coordinator", ["tessera.v1.allocation.released.>"], record)
        for i in range(100):
            await publisher.publish(_released(i))
        # Kill the server each client is on (the first URL) for good, mid-stream.
        cluster.stop_nats(0)
        for i in range(100, 200):
            for _ in range(50):  # the publish in flight when the server died is retried
                try:
                    await publisher.publish(_released(i))
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            else:
                pytest.fail(f"publish {i} never succeeded on the two servers left")

        async def everything() -> bool:
            return len(got) == 200

        await eventually(everything, timeout_s=60, what="all 200 events consumed")
    assert got == {f"u{i}" for i in range(200)}
