"""A memory of past use (``scheduler.usage``) on the real API server, with the services as
processes: the coordinator shows each queue's decayed use, keeps it across its own
restart (the ``tessera-usage`` bucket), and a queue that held the whole cluster lately
gets none of the surplus when another queue asks at the same time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from shared import busauth
from shared.bus import ask, connect
from shared.config import NatsConfig
from shared.views import VIEW_QUEUES_SUBJECT, QueuesView, QueueView
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, start_pipeline
from tests.integration.test_batch import member, podgroup, queue

pytestmark = pytest.mark.integration
WHOLE = {"nvidia.com/gpu": 1}
INVENTORY = {
    "nodes": [
        {
            "name": f"um-{n}",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        }
        for n in ("a", "b")
    ]
}
MEMORY = "nvidia.memory"
"""The dimension whole cards fill (a card is 10 slots of ``nvidia.count``)."""


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    # A half-life of 10 s, so that what a queue used a few seconds ago still counts and
    # what it used a minute ago hardly; weight 4, so that a queue that used over 5/8 of
    # the cluster weighs nothing in the surplus (shared/core/queues.py weigh).
    usage = {"weight": 4.0, "halfLifeS": 10.0, "windowS": 600.0, "sampleS": 0.5}
    p = await start_pipeline(
        tmp_path_factory.mktemp("usage-memory"),
        kubeconfig,
        nats_admin,
        INVENTORY,
        {"starvationGuardS": 0, "preemption": False, "usage": usage},
    )
    yield p
    await p.close()


async def viewed(p: Pipeline, name: str) -> QueueView | None:
    reader = msgspec.structs.replace(p.nats_admin, user=busauth.READER)
    nc = await connect(reader, busauth.READER)
    try:
        view = await ask(nc, VIEW_QUEUES_SUBJECT, None, QueuesView, service="gang-coordinator")
    finally:
        await nc.close()
    return next((q for q in view.queues if q.name == name), None)


async def test_a_queue_that_used_the_cluster_lately_gets_none_of_the_surplus(
    pipeline: Pipeline, ns: str
) -> None:
    hog, calm = f"hog-{ns}", f"calm-{ns}"
    await queue(pipeline, hog)
    await queue(pipeline, calm)
    hogs = [f"hog-{i}" for i in range(3)]
    for n, q in [*((n, hog) for n in hogs), ("early", calm)]:  # the whole cluster
        await podgroup(pipeline, ns, n, 1, queue=q)
        await pipeline.create(ns, member(n, n, WHOLE))
    for n in [*hogs, "early"]:
        await pipeline.bound(ns, n)

    async def used(name: str, least: float) -> QueueView | None:
        try:
            q = await viewed(pipeline, name)
        except Exception:  # the coordinator not answering (yet)
            return None
        return q if q is not None and q.usage.get(MEMORY, 0.0) > least else None

    await eventually(lambda: used(hog, 0.7), timeout_s=60, what="the hog's past use shown")
    await eventually(lambda: used(calm, 0.15), timeout_s=60, what="the calm queue's too")

    # The calm queue's pod goes; the coordinator crashes (its keeper starts it again):
    # what the calm queue used is remembered, though it holds nothing now.
    await pipeline.delete(ns, "early")
    pipeline.kill("gang-coordinator")
    await eventually(lambda: used(calm, 0.05), timeout_s=60, what="the calm queue remembered")

    # Both queues ask for the whole cluster while the hog holds three cards; then the
    # hogs go. Without the memory each queue would end with two cards; with it, the hog's
    # weight in the surplus is 0 and the calm queue gets all four.
    fresh = [f"calm-{i}" for i in range(4)]
    hungry = [f"more-{i}" for i in range(4)]
    for name, q in [*((n, calm) for n in fresh), *((n, hog) for n in hungry)]:
        await podgroup(pipeline, ns, name, 1, queue=q)
        await pipeline.create(ns, member(name, name, WHOLE))
    await pipeline.bound(ns, fresh[0])  # the card left free
    for n in hogs:
        await pipeline.delete(ns, n)
    for name in fresh:
        await pipeline.bound(ns, name)
    for name in hungry:
        assert not (await pipeline.get(ns, name))["spec"].get("nodeName"), name
