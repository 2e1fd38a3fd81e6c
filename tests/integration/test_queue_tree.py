"""Hierarchical queues (``scheduler.queuePlugin: capacity``) on the real API server, with
the five services as processes: a refused subtree waits alone and its Queue is told why,
reclaim on a full cluster takes only what is missing, a parent's deserved share
bounds its children's reclaim (Volcano #4679, #4817, #4408, #5107), and reclaim stops at
a queue's deserved, the rest of its fair share coming as pods end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, podgroup, start_pipeline
from tests.integration.test_batch import member, queue

pytestmark = pytest.mark.integration
WHOLE = {"nvidia.com/gpu": 1}
INVENTORY = {
    "nodes": [
        {
            "name": f"qt-{n}",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        }
        for n in ("a", "b")
    ]
}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("queue-tree"),
        kubeconfig,
        nats_admin,
        INVENTORY,
        {"queuePlugin": "capacity", "starvationGuardS": 0},
    )
    yield p
    await p.close()


async def lone(p: Pipeline, ns: str, name: str, in_queue: str) -> None:
    """A pod of one whole card, in its own PodGroup of one in ``in_queue``."""
    await podgroup(p, ns, name, 1, queue=in_queue)
    await p.create(ns, member(name, name, WHOLE))


async def exists(p: Pipeline, ns: str, name: str) -> bool:
    try:
        await p.get(ns, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def failed(p: Pipeline, ns: str, name: str) -> str | None:
    found = [e["message"] for e in await p.events(ns, name) if e["reason"] == "FailedScheduling"]
    return found[-1] if found else None


async def test_a_broken_subtree_waits_alone_and_its_queue_is_told_why(
    pipeline: Pipeline, ns: str
) -> None:
    lost, below, org, team = (f"{n}-{ns}" for n in ("lost", "below", "org", "team"))
    await queue(pipeline, lost, parent=f"gone-{ns}")
    await queue(pipeline, below, parent=lost)
    await queue(pipeline, org)
    await queue(pipeline, team, parent=org)
    await lone(pipeline, ns, "orphan", below)
    await lone(pipeline, ns, "parent", org)
    await lone(pipeline, ns, "fine", team)
    await pipeline.bound(ns, "fine")  # the rest of the cluster keeps scheduling

    async def said(name: str) -> str | None:
        return await failed(pipeline, ns, name)

    orphan = await eventually(lambda: said("orphan"), what="the orphan told why")
    assert f'its ancestor "{lost}" is refused' in orphan
    assert f'its parent "gone-{ns}" does not exist' in orphan
    parent = await eventually(lambda: said("parent"), what="the parent queue's pod told why")
    assert f'queue "{org}" has child queues ({team}): only leaf queues take pods' in parent

    async def queue_told() -> list[str]:
        found = await kube.request(
            pipeline.api,
            "GET",
            "/api/v1/namespaces/default/events",
            query={"fieldSelector": f"involvedObject.name={lost},involvedObject.kind=Queue"},
        )
        return [e["message"] for e in found["items"] if e["reason"] == "QueueRefused"]

    [message] = await eventually(queue_told, what="a QueueRefused Event on the Queue")
    assert f'queue "{lost}": its parent "gone-{ns}" does not exist' in message


async def test_reclaim_on_a_full_cluster_takes_only_what_is_missing(
    pipeline: Pipeline, ns: str
) -> None:
    top, a1, a2 = (f"{n}-{ns}" for n in ("top", "a1", "a2"))
    await queue(pipeline, top, deserved={"nvidia.com/gpu": 4})
    await queue(pipeline, a1, parent=top, deserved={"nvidia.com/gpu": 2}, reclaimable=True)
    await queue(pipeline, a2, parent=top, deserved={"nvidia.com/gpu": 2})
    hogs = [f"hog-{i}" for i in range(4)]
    for n in hogs:  # a1 borrows a2's idle share: the whole cluster
        await lone(pipeline, ns, n, a1)
    for n in hogs:
        await pipeline.bound(ns, n)

    async def left() -> list[str]:
        return [n for n in hogs if await exists(pipeline, ns, n)]

    # The cluster is full; a2, under its deserved, still gets its pod placed (the
    # enqueue check against the root blocked this in Volcano: #4679, #4817) ...
    await lone(pipeline, ns, "mine-0", a2)
    await pipeline.bound(ns, "mine-0", timeout_s=60)
    # ... by evicting one of a1's pods, not more (#4408).
    assert len(await left()) == 3
    await lone(pipeline, ns, "mine-1", a2)
    await pipeline.bound(ns, "mine-1", timeout_s=60)
    assert len(await left()) == 2
    # At its deserved share, a2 takes nothing more from a1, which is at its own.
    await lone(pipeline, ns, "mine-2", a2)
    await eventually(lambda: failed(pipeline, ns, "mine-2"), what="mine-2 told it waits")
    await asyncio.sleep(3.0)
    assert len(await left()) == 2
    assert not (await pipeline.get(ns, "mine-2"))["spec"].get("nodeName")


async def test_a_parents_deserved_share_bounds_its_childrens_reclaim(
    pipeline: Pipeline, ns: str
) -> None:
    # t1 deserves 3 cards: c1 (1) holds 2, c2 (2) holds 1; t2 deserves 2 and holds 1.
    # c1 is over its own share, but t1 is within its own: t2 may not take c1's pods
    # (Volcano #5107; there ancestorReclaimLevel 0 lets it).
    t1, c1, c2, t2 = (f"{n}-{ns}" for n in ("t1", "c1", "c2", "t2"))
    await queue(pipeline, t1, deserved={"nvidia.com/gpu": 3})
    await queue(pipeline, c1, parent=t1, deserved={"nvidia.com/gpu": 1})
    await queue(pipeline, c2, parent=t1, deserved={"nvidia.com/gpu": 2})
    await queue(pipeline, t2, deserved={"nvidia.com/gpu": 2})
    held = {"c1-0": c1, "c1-1": c1, "c2-0": c2, "t2-0": t2}
    for n, q in held.items():
        await lone(pipeline, ns, n, q)
    for n in held:
        await pipeline.bound(ns, n)
    await lone(pipeline, ns, "t2-1", t2)
    await eventually(lambda: failed(pipeline, ns, "t2-1"), what="t2-1 told it waits")
    await asyncio.sleep(3.0)
    assert all([await exists(pipeline, ns, n) for n in held]), "nothing was reclaimed"
    assert not (await pipeline.get(ns, "t2-1"))["spec"].get("nodeName")


async def test_reclaim_stops_at_deserved_and_the_rest_comes_as_pods_end(
    pipeline: Pipeline, ns: str
) -> None:
    # top deserves the 4 cards: a and b 1 each, c 2 and asks nothing. a holds 1, b 3,
    # and a asks one more: a's fair share is 2 (half of what c leaves), b's 2. b is over
    # its fair share, but a is at its deserved: it reclaims nothing (Volcano's rule; the
    # fair share alone let it evict one of b's pods). When one of b's pods ends, a's pod
    # takes the card: b, over its fair share, does not borrow it while a waits.
    # (shares in cores, 100 a card: the cluster's nvidia.com/gpu counts each card's
    # deviceSplitCount slots, so on it no queue here would be over its fair share)
    top, a, b, c = (f"{n}-{ns}" for n in ("top", "a", "b", "c"))
    await queue(pipeline, top, deserved={"nvidia.com/gpucores": 400})
    for name, cards in ((a, 1), (b, 1), (c, 2)):
        await queue(pipeline, name, parent=top, deserved={"nvidia.com/gpucores": 100 * cards})
    held = {"a-0": a, "b-0": b, "b-1": b, "b-2": b}
    for n, q in held.items():
        await lone(pipeline, ns, n, q)
    for n in held:
        await pipeline.bound(ns, n)
    await lone(pipeline, ns, "a-1", a)
    await eventually(lambda: failed(pipeline, ns, "a-1"), what="a-1 told it waits")
    await asyncio.sleep(5.0)  # retried after 1, 2 and 4 s: what it may reclaim is offered
    assert all([await exists(pipeline, ns, n) for n in held]), "nothing was reclaimed"
    await lone(pipeline, ns, "b-3", b)  # b asks too: it waits while a does
    await pipeline.delete(ns, "b-0")
    await pipeline.bound(ns, "a-1", timeout_s=60)
    assert not (await pipeline.get(ns, "b-3"))["spec"].get("nodeName")


async def test_min_resources_enter_the_enqueue_check(pipeline: Pipeline, ns: str) -> None:
    # A queue of two cards at most. A PodGroup whose minResources ask three waits and
    # is told why, though its one pod asks a single card; one asking two goes, and
    # then one asking two more waits (the queue has no room), untold.
    small = f"small-{ns}"
    await queue(pipeline, small, capability={"nvidia.com/gpu": 2})
    await podgroup(pipeline, ns, "greedy", 1, queue=small, min_resources={"nvidia.com/gpu": 3})
    await pipeline.create(ns, member("greedy", "greedy", WHOLE))
    await podgroup(pipeline, ns, "modest", 1, queue=small, min_resources={"nvidia.com/gpu": 2})
    await pipeline.create(ns, member("modest", "modest", WHOLE))
    await pipeline.bound(ns, "modest")
    told = await eventually(lambda: failed(pipeline, ns, "greedy"), what="greedy told why")
    assert f'minResources exceed what queue "{small}" may ever hold' in told
    assert not (await pipeline.get(ns, "greedy"))["spec"].get("nodeName")
    await podgroup(pipeline, ns, "later", 1, queue=small, min_resources={"nvidia.com/gpu": 2})
    await pipeline.create(ns, member("later", "later", WHOLE))
    await asyncio.sleep(3.0)
    assert not (await pipeline.get(ns, "later"))["spec"].get("nodeName")
