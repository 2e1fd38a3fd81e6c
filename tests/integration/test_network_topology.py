"""Network topology for gangs on the real API server (shared/core/network.py): Volcano
HyperNodes over simulated nodes in two racks of two 4-card nodes under one spine, and
PodGroups with ``networkTopology``. A hard gang is placed inside one rack when one has
room (where a topology-blind binpack would start on the tightest node, in the other
rack), waits with the tier and what is missing when none has, while a soft gang of the
same size is placed across the racks; a soft gang that one rack can hold goes there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from shared.core.request import GROUP_NAME
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline

pytestmark = pytest.mark.integration
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
HYPERNODES = "/apis/topology.volcano.sh/v1alpha1/hypernodes"
CARD = {"nvidia.com/gpu": 1}
RACK_OF = {"tp-a0": "rack-a", "tp-a1": "rack-a", "tp-b0": "rack-b", "tp-b1": "rack-b"}
INVENTORY = {
    "nodes": [
        {
            "name": name,
            "labels": {"example.com/rack": rack},
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 4}
            ],
        }
        for name, rack in RACK_OF.items()
    ]
}
HYPERNODE_SPECS = {
    # one rack by its nodes' label, the other by a pattern of their names, the spine by a
    # pattern of HyperNode names: the three selectors
    "rack-a": {
        "tier": 1,
        "tierName": "rack",
        "members": [
            {
                "type": "Node",
                "selector": {"labelMatch": {"matchLabels": {"example.com/rack": "rack-a"}}},
            }
        ],
    },
    "rack-b": {
        "tier": 1,
        "tierName": "rack",
        "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": "^tp-b"}}}],
    },
    "spine-0": {
        "tier": 2,
        "tierName": "spine",
        "members": [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-a"}}},
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-b"}}},
        ],
    },
}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("topology"), kubeconfig, nats_admin, INVENTORY)
    for name, spec in HYPERNODE_SPECS.items():
        body = {
            "apiVersion": "topology.volcano.sh/v1alpha1",
            "kind": "HyperNode",
            "metadata": {"name": name},
            "spec": spec,
        }
        await kube.request(p.api, "POST", HYPERNODES, body)
    await asyncio.sleep(2.0)  # the watcher's HyperNode events reach the allocator
    yield p
    for name in HYPERNODE_SPECS:
        await kube.request(p.api, "DELETE", f"{HYPERNODES}/{name}")
    await p.close()


async def gang(p: Pipeline, ns: str, name: str, size: int, topology: dict[str, Any]) -> list[str]:
    """A PodGroup of ``size`` one-card pods with ``topology``, and its pods."""
    await podgroup(p, ns, name, size, networkTopology=topology)
    names = [f"{name}-{i}" for i in range(size)]
    for member in names:
        await p.create(ns, pod(member, CARD, annotations={GROUP_NAME: name}))
    return names


async def filler(p: Pipeline, ns: str, node: str) -> None:
    """One card taken on ``node`` (a lone pod pinned there), bound before going on."""
    made = pod(f"fill-{node}", CARD)
    made["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    await p.create(ns, made)
    assert await p.node_of(ns, f"fill-{node}") == node


async def racks(p: Pipeline, ns: str, names: list[str]) -> set[str]:
    """The racks the pods are bound in (waiting until every one is bound)."""
    return {RACK_OF[await p.node_of(ns, n)] for n in names}


async def cleared(p: Pipeline, ns: str) -> None:
    """Every pod of ``ns`` deleted and gone, and its cards released."""
    found = await kube.request(p.api, "GET", f"/api/v1/namespaces/{ns}/pods")
    names = [item["metadata"]["name"] for item in found["items"]]
    for name in names:
        await p.delete(ns, name)

    async def gone() -> bool:
        for name in names:
            try:
                await p.get(ns, name)
                return False
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return True

    await eventually(gone, what="the test's pods deleted")
    await asyncio.sleep(1.0)  # the allocator hears of it


async def test_a_hard_gang_is_placed_inside_the_rack_that_has_room(
    pipeline: Pipeline, ns: str
) -> None:
    """rack-a keeps 7 free cards, rack-b 8: the gang of 8 goes to rack-b whole (a blind
    binpack starts on tp-a0, the tightest node)."""
    await filler(pipeline, ns, "tp-a0")
    names = await gang(pipeline, ns, "hard8", 8, {"mode": "hard", "highestTierAllowed": 1})
    assert await racks(pipeline, ns, names) == {"rack-b"}
    await cleared(pipeline, ns)


async def test_a_hard_gang_no_rack_holds_waits_and_a_soft_one_goes_across(
    pipeline: Pipeline, ns: str
) -> None:
    """7 free cards in each rack: a hard gang of 8 (by tier name) waits, told which tier
    and how close the best rack comes; a soft gang of 8 is placed across both racks."""
    await filler(pipeline, ns, "tp-a0")
    await filler(pipeline, ns, "tp-b0")
    hard = await gang(pipeline, ns, "hard", 8, {"mode": "hard", "highestTierName": "rack"})
    message = await pipeline.refused(ns, hard[0])
    assert (
        "no tier-1 HyperNode (rack) or below has room for all 8 pods of the gang: "
        "the best, rack-a, fits 7" in message
    ), message
    soft = await gang(pipeline, ns, "soft", 8, {"mode": "soft"})
    assert await racks(pipeline, ns, soft) == {"rack-a", "rack-b"}
    for name in hard:
        assert not (await pipeline.get(ns, name))["spec"].get("nodeName")
    await cleared(pipeline, ns)


async def test_a_soft_gang_one_rack_holds_is_placed_there(pipeline: Pipeline, ns: str) -> None:
    """rack-b keeps 7 free cards, rack-a 8: the soft gang of 8 goes to rack-a (a blind
    binpack starts on tp-b0)."""
    await filler(pipeline, ns, "tp-b0")
    names = await gang(pipeline, ns, "soft8", 8, {"mode": "soft"})
    assert await racks(pipeline, ns, names) == {"rack-a"}
    await cleared(pipeline, ns)
