"""The node side against the real thing: the pinned kubelet calls the node agent's
device plugin, containerd and runc start the containers, and each container prints what
it got. Nothing here plays the kubelet (tests/kubelet.py is the unit-level stand-in).

The agent reads its devices from a file (no GPU on this machine); everything after that
is real: registration with the kubelet, the Node's allocatable, the kubelet's admission
order and its Allocate calls, its checkpoint, its restart, the runtime's mounts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from services.node_agent.admission import KUBELET_CHECKPOINT, admitted_in_checkpoint
from shared import kube
from shared.core import annotations as ann
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline
from tests.integration.realnode import handed, node_pipeline_factory, phase, printing_pod
from tools import realnode

pytestmark = pytest.mark.integration
_ = node_pipeline_factory  # the fixture, imported for this module

Factory = Callable[..., Awaitable[Pipeline]]
A100 = [{"model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 8}]
CACHE = "/usr/local/vgpu/cache"


async def allocatable(p: Pipeline, node: str) -> dict[str, str]:
    obj = await kube.request(p.api, "GET", f"/api/v1/nodes/{node}")
    return dict(obj["status"].get("allocatable", {}))


async def registered(p: Pipeline, node: str, resource: str, amount: str) -> None:
    async def shown() -> bool:
        return (await allocatable(p, node)).get(resource) == amount

    await eventually(shown, timeout_s=60, what=f"{node} allocatable {resource}={amount}")


def grants_of(obj: dict[str, Any]) -> dict[str, Any]:
    grants = ann.read_grants(obj["metadata"]["annotations"])
    assert grants is not None, obj["metadata"]["name"]
    return {g.container: g for g in grants}


def assert_own_grant(obj: dict[str, Any], container: str, got: Any) -> None:
    """The container got exactly its own grant: its cards, its memory on each, its
    cores, its own accounting file and directory, the isolation library's mounts."""
    grant = grants_of(obj)[container]
    uid = obj["metadata"]["uid"]
    env = got.env
    where = f"{obj['metadata']['name']}/{container}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in grant.devices), where
    limits = [env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}") for i in range(len(grant.devices))]
    assert limits == [f"{d.memory_mib}m" for d in grant.devices], where
    assert f"CUDA_DEVICE_MEMORY_LIMIT_{len(grant.devices)}" not in env, where
    assert env["CUDA_DEVICE_SM_LIMIT"] == str(max(d.cores for d in grant.devices)), where
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"{CACHE}/{uid}_{container}.cache", where
    assert {CACHE, "/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"} <= got.mount_points, where


SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    # one card, its own memory and cores
    "one": lambda i: {
        "containers": [
            (
                "main",
                {
                    "nvidia.com/gpu": 1,
                    "nvidia.com/gpumem": 1000 + 37 * i,
                    "nvidia.com/gpucores": 10 + i,
                },
            )
        ]
    },
    # two cards
    "two": lambda i: {
        "containers": [("main", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1200 + 41 * i})]
    },
    # an init container with a card, then the main container with another size
    "init": lambda i: {
        "init": [("setup", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 900 + 13 * i})],
        "containers": [("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500 + 29 * i})],
    },
    # two containers with devices
    "pair": lambda i: {
        "containers": [
            ("a", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 800 + 11 * i}),
            ("b", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 700 + 17 * i}),
        ]
    },
}


async def test_a_burst_of_pods_of_four_shapes_each_container_gets_its_own_grant(
    node_pipeline_factory: Factory,
) -> None:
    """The concurrency case: 24 pods of 4 shapes (1 and 2 cards, init containers, two
    containers with devices), every pod its own sizes, created at once on one node: the
    real kubelet admits them in its own order and every container prints its own limits."""
    p = await node_pipeline_factory(A100)
    node = "real-0"
    await registered(p, node, "nvidia.com/gpu", "80")
    ns = await p.namespace()
    pods = {}
    for shape, make in SHAPES.items():
        for i in range(6):
            parts = make(i)
            name = f"{shape}-{i}"
            pods[name] = parts
    await asyncio.gather(
        *(
            p.create(ns, printing_pod(name, parts["containers"], init=parts.get("init")))
            for name, parts in pods.items()
        )
    )
    for name in pods:
        await phase(p, ns, name, "Running", timeout_s=120)
    for name, parts in pods.items():
        obj = await p.get(ns, name)
        assert obj["spec"]["nodeName"] == node
        for cname, _ in parts.get("init", []) + parts["containers"]:
            assert_own_grant(obj, cname, await handed(ns, name, cname))
    calls = p.log(f"node-agent@{node}").count("Allocate nvidia.com/gpu")
    containers = sum(len(v.get("init", [])) + len(v["containers"]) for v in pods.values())
    assert calls == containers
    # The kubelet's own checkpoint names every pod it gave devices to.
    text = (realnode.DEVICE_PLUGIN_DIR / KUBELET_CHECKPOINT).read_text()
    admitted = admitted_in_checkpoint(text)
    assert admitted is not None
    uids = {(await p.get(ns, name))["metadata"]["uid"] for name in pods}
    assert uids <= admitted


async def test_an_allocate_the_agent_cannot_match_is_refused_on_the_pod(
    node_pipeline_factory: Factory,
) -> None:
    """A pod bound to the node by someone else (no grant of Tessera's): the agent waits
    for its grant, then refuses; the kubelet fails the pod with the agent's reason and
    its container never starts."""
    p = await node_pipeline_factory(A100)
    node = "real-0"
    await registered(p, node, "nvidia.com/gpu", "80")
    ns = await p.namespace()
    await p.create(ns, printing_pod("stray", [("main", {"nvidia.com/gpu": 1})], node=node))
    obj = await phase(p, ns, "stray", "Failed", timeout_s=60)
    assert obj["status"]["reason"] == "UnexpectedAdmissionError"
    assert "nvidia.com/gpu" in obj["status"]["message"]
    assert realnode.pod_logs(ns, "stray", "main") == ""
