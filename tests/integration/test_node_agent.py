"""A real node's agent in the whole pipeline: the kubelet's Allocate gets each pod's own
grant while pods bind to the node concurrently.

The test plays the kubelet of node ``gpu-0`` as the real one behaves: it serves
``Registration`` on ``kubelet.sock``, watches the pods bound to its node and admits them
one at a time, calling ``Allocate`` on each registered plugin (``nvidia.com/gpu``,
Volcano's ``volcano.sh/gpu-memory``) once per container that names it, with as many
device IDs as the container asks of it. Admitting takes a while (as a real kubelet's
does), so binds to the node pile up meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.node_agent.deviceplugin import api_pb2 as pb
from shared import kube
from shared.config import NatsConfig
from shared.core import annotations as ann
from shared.core.quantity import parse_whole
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, register_node, start_pipeline
from tests.kubelet import Kubelet, allocate

pytestmark = pytest.mark.integration

NODE = "gpu-0"
GPU_NODE = {
    "nodes": [
        {
            "name": NODE,
            "devices": [{"model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 8}],
        }
    ]
}
SHARE_NODE = {
    "nodes": [
        {
            "name": NODE,
            "devices": [{"model": "Tesla-V100-SXM2-16GB", "memory": 16384, "count": 2}],
        }
    ]
}
"""A node whose gpu-share IDs (one per MiB) fit in what the kubelet reads of a list."""
ADMIT_S = 0.3
"""How long this kubelet takes to admit a pod."""


@pytest.fixture
def node_inventory() -> dict[str, Any]:
    """The devices of ``NODE`` (a test parametrizes another)."""
    return GPU_NODE


@pytest.fixture
async def pipeline(
    kubeconfig: Path,
    nats_admin: NatsConfig,
    tmp_path_factory: pytest.TempPathFactory,
    kubelet: Kubelet,
    node_inventory: dict[str, Any],
) -> AsyncIterator[Pipeline]:
    workdir = tmp_path_factory.mktemp("agent")
    (workdir / f"{NODE}.yaml").write_text(yaml.safe_dump(node_inventory))
    p = await start_pipeline(
        workdir,
        kubeconfig,
        nats_admin,
        {"nodes": []},  # no simulated nodes: gpu-0 is the cluster
        config={
            "nodeAgent": {
                "devicePluginDir": str(kubelet.directory),
                "healthIntervalS": 1.0,
                "isolation": {  # the host side in the test's folder, not the machine's
                    "libraryHostPath": str(workdir / "vgpu/libvgpu.so"),
                    "preloadHostPath": str(workdir / "vgpu/ld.so.preload"),
                    "cacheHostDir": str(workdir / "vgpu/containers"),
                    "lockDir": str(workdir / "vgpulock"),
                },
            },
            "telemetry": {"logLevel": "DEBUG", "metricsPort": 0},
        },
    )
    await register_node(p.api, NODE)  # what the kubelet and the node controller do
    await p.start(f"node-agent@{NODE}")
    yield p
    # Nothing this test made may outlive it: the next test's agent would find its pods
    # bound to the node waiting for an Allocate (no kubelet here starts them), and a pod
    # left pending would take the next test's cards.
    for ns in p.namespaces:
        left, _ = await kube.list_all(p.api, f"/api/v1/namespaces/{ns}/pods")
        for obj in left:
            await kube.delete_pod(p.api, ns, obj["metadata"]["name"], grace_s=0)
    await kube.request(p.api, "DELETE", f"/api/v1/nodes/{NODE}")
    await p.close()


class PlayedKubelet:
    """Admits the pods bound to ``NODE`` one at a time, in the order it sees them: each
    container's calls to the plugins of ``endpoints`` (resource name: socket) it names."""

    def __init__(self, p: Pipeline, k: Kubelet, ns: str, endpoints: dict[str, str]) -> None:
        self.p = p
        self.channels = {name: k.channel(endpoint) for name, endpoint in endpoints.items()}
        self.ns = ns
        self.handed: dict[str, pb.ContainerAllocateResponse] = {}
        """Per pod, the answer to its last call."""
        self.by_container: dict[tuple[str, str], dict[str, str]] = {}
        """Per (pod, container), the environment its calls handed, merged as the
        kubelet merges them."""
        self.in_flight_max = 0
        self.seen: set[str] = set()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def watch(self) -> None:
        async def on_event(kind: str, obj: dict[str, Any]) -> None:
            if kind != "DELETED" and obj["spec"].get("nodeName") == NODE:
                name = obj["metadata"]["name"]
                if name not in self.seen:
                    self.seen.add(name)
                    await self.queue.put(obj)

        async def on_relist(items: list[dict[str, Any]]) -> None:
            for obj in items:
                await on_event("ADDED", obj)

        await kube.list_watch(
            self.p.api, f"/api/v1/namespaces/{self.ns}/pods", on_event, on_relist=on_relist
        )

    async def admit(self) -> None:
        while True:
            obj = await self.queue.get()
            # Bound and not admitted yet, right now (this pod included).
            self.in_flight_max = max(self.in_flight_max, self.queue.qsize() + 1)
            await asyncio.sleep(ADMIT_S)
            name = obj["metadata"]["name"]
            for container in obj["spec"]["containers"]:
                for resource, value in container["resources"]["limits"].items():
                    if resource not in self.channels:
                        continue
                    channel = self.channels[resource]
                    # The API server writes 1000 as "1k"; the kubelet reads the quantity.
                    ids = parse_whole(value)
                    (handed,) = (await allocate(channel, ids)).container_responses
                    self.handed[name] = handed
                    merged = self.by_container.setdefault((name, container["name"]), {})
                    for key, env in handed.envs.items():
                        assert merged.setdefault(key, env) == env, (name, key)

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()


async def test_twenty_pods_bound_at_once_each_get_their_own_limits(
    pipeline: Pipeline, kubelet: Kubelet
) -> None:
    registered: dict[str, str] = {}

    async def gpu_registered() -> bool:
        while not kubelet.registered.empty():
            r = kubelet.registered.get_nowait()
            registered[r.resource_name] = r.endpoint
        return "nvidia.com/gpu" in registered

    await eventually(gpu_registered, timeout_s=30, what="nvidia.com/gpu registered")
    ns = await pipeline.namespace()
    played = PlayedKubelet(pipeline, kubelet, ns, {"nvidia.com/gpu": registered["nvidia.com/gpu"]})
    tasks = [asyncio.create_task(played.watch()), asyncio.create_task(played.admit())]
    try:
        # Four shapes (1-4 devices), five pods each, every pod its own memory size.
        pods = {
            f"p{i}": (1 + i % 4, 1000 + 100 * i)  # name -> (devices, MiB per device)
            for i in range(20)
        }
        await asyncio.gather(
            *(
                pipeline.create(ns, pod(name, {"nvidia.com/gpu": n, "nvidia.com/gpumem": memory}))
                for name, (n, memory) in pods.items()
            )
        )

        async def all_admitted() -> bool:
            return len(played.handed) == len(pods)

        await eventually(all_admitted, timeout_s=90, what="all 20 pods admitted")
    finally:
        for t in tasks:
            t.cancel()
        await played.close()

    for name, (n, memory) in pods.items():
        obj = await pipeline.get(ns, name)
        grants = ann.read_grants(obj["metadata"]["annotations"])
        assert grants is not None
        (grant,) = grants
        envs = dict(played.handed[name].envs)
        # Its own devices and its own limit on each, never another pod's.
        assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in grant.devices)
        assert [envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(n)] == [f"{memory}m"] * n
        assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].endswith(
            f"{obj['metadata']['uid']}_main.cache"
        )
        # Its accounting directory and the lock directory exist on the host, open to
        # whatever user the container runs as.
        mounts = {m.container_path: m.host_path for m in played.handed[name].mounts}
        for where in ("/usr/local/vgpu/cache", str(pipeline.workdir / "vgpulock")):
            assert Path(mounts[where]).stat().st_mode & 0o777 == 0o777, where  # noqa: ASYNC240
        assert mounts["/usr/local/vgpu/cache"].endswith(f"{obj['metadata']['uid']}_main")
    # Binds went on while the kubelet admitted: pods of other shapes were in flight to
    # the node together (up to one per shape, never two one Allocate could mean).
    assert 2 <= played.in_flight_max <= 4
    admitted = pipeline.log(f"node-agent@{NODE}").count("Allocate nvidia.com/gpu")
    assert admitted == len(pods)
    # The agent prepared the host side: the preload file names the library.
    assert (pipeline.workdir / "vgpu/ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"


@pytest.mark.parametrize("node_inventory", [SHARE_NODE])
async def test_gpu_share_pods_bound_at_once_each_get_their_own_limits(
    pipeline: Pipeline, kubelet: Kubelet
) -> None:
    registered: dict[str, pb.RegisterRequest] = {}
    wanted = ("nvidia.com/gpu", "volcano.sh/gpu-memory")

    async def both_registered() -> bool:
        while not kubelet.registered.empty():
            r = kubelet.registered.get_nowait()
            registered[r.resource_name] = r
        return all(name in registered for name in wanted)

    await eventually(both_registered, timeout_s=30, what="both resources registered")
    share = registered["volcano.sh/gpu-memory"]
    assert not share.options.get_preferred_allocation_available
    ns = await pipeline.namespace()
    played = PlayedKubelet(pipeline, kubelet, ns, {n: registered[n].endpoint for n in wanted})
    tasks = [asyncio.create_task(played.watch()), asyncio.create_task(played.admit())]
    # Volcano gpu-share pods of several sizes, two of one size, and a pod whose first
    # container asks a count and whose second a gpu-share slice: bound at once.
    sizes = {"s1": 1000, "s2": 2000, "s3": 3000, "s4": 1500, "twin": 2000}
    mixed = pod("mixed", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 700})
    mixed["spec"]["containers"].append(
        {
            "name": "side",
            "image": "busybox",
            "resources": {"limits": {"volcano.sh/gpu-memory": 300}},
        }
    )
    try:
        await asyncio.gather(
            pipeline.create(ns, mixed),
            *(
                pipeline.create(ns, pod(name, {"volcano.sh/gpu-memory": units}))
                for name, units in sizes.items()
            ),
        )

        async def all_admitted() -> bool:
            return len(played.handed) == len(sizes) + 1

        await eventually(all_admitted, timeout_s=90, what="all gpu-share pods admitted")
    finally:
        for t in tasks:
            t.cancel()
        await played.close()

    for name, units in {**sizes, "mixed": 0}.items():
        obj = await pipeline.get(ns, name)
        grants = ann.read_grants(obj["metadata"]["annotations"])
        assert grants is not None
        for grant in grants:
            envs = played.by_container[(name, grant.container)]
            (device,) = grant.devices
            assert envs["NVIDIA_VISIBLE_DEVICES"] == device.uuid
            assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{device.memory_mib}m"
            assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].endswith(
                f"{obj['metadata']['uid']}_{grant.container}.cache"
            )
        if units:
            assert grants[0].devices[0].memory_mib == units
    assert played.by_container[("mixed", "side")]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "300m"
    log = pipeline.log(f"node-agent@{NODE}")
    assert log.count("Allocate volcano.sh/gpu-memory") == len(sizes) + 1
    # The two pods of 2000 MiB were never in flight together (one Allocate could mean
    # either): the second waited, told why, until the first was admitted.
    told = [
        e["message"]
        for name in ("s2", "twin")
        for e in await pipeline.events(ns, name)
        if e["reason"] == "FailedScheduling"
    ]
    assert any("another pod asking 2000 gpu-share device(s)" in m for m in told), told


async def test_a_restarted_agent_still_hands_over_a_grant_bound_before_it(
    pipeline: Pipeline, kubelet: Kubelet
) -> None:
    async def registered() -> str | None:
        while not kubelet.registered.empty():
            r = kubelet.registered.get_nowait()
            if r.resource_name == "nvidia.com/gpu":
                return r.endpoint
        return None

    await eventually(registered, timeout_s=30, what="nvidia.com/gpu registered")
    ns = await pipeline.namespace()
    await pipeline.create(ns, pod("early", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}))
    await pipeline.bound(ns, "early")

    async def seen() -> bool:  # the agent took the bind (and acked its event)
        return "got tessera.v1.allocation.bound" in pipeline.log(f"node-agent@{NODE}")

    await eventually(seen, timeout_s=30, what="the agent saw the bind")
    # The agent restarts before the kubelet admits the pod: its event is gone.
    await pipeline.stop(f"node-agent@{NODE}")
    await pipeline.start(f"node-agent@{NODE}")
    endpoint = await eventually(registered, timeout_s=30, what="registered again")
    channel = kubelet.channel(endpoint)
    try:
        (handed,) = (await allocate(channel, 1)).container_responses
    finally:
        await channel.close()
    assert handed.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert "recovered 1 pods bound here, 1 waiting" in pipeline.log(f"node-agent@{NODE}")


async def test_a_card_turning_unhealthy_is_out_of_new_placements_within_seconds(
    pipeline: Pipeline, kubelet: Kubelet
) -> None:
    async def serving() -> bool:
        return "node agent for gpu-0: 8 devices" in pipeline.log(f"node-agent@{NODE}")

    await eventually(serving, timeout_s=30, what="the agent serving its 8 healthy cards")
    ns = await pipeline.namespace()
    # Every card but one fails (the file plays the node's devices; the agent re-reads it
    # every healthIntervalS, 1 s here).
    sick = {**GPU_NODE["nodes"][0]}
    sick["devices"] = [{**GPU_NODE["nodes"][0]["devices"][0], "unhealthy": list(range(1, 8))}]
    (pipeline.workdir / f"{NODE}.yaml").write_text(yaml.safe_dump({"nodes": [sick]}))

    async def out_of_service() -> bool:
        return "inventory of gpu-0 changed (unhealthy:" in pipeline.log(f"node-agent@{NODE}")

    await eventually(out_of_service, timeout_s=15, what="the agent to report the cards")
    # Two whole cards no longer fit; one does, on the one healthy card.
    await pipeline.create(
        ns, pod("two", {"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 100})
    )
    await pipeline.create(
        ns, pod("one", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100})
    )
    placed = await pipeline.bound(ns, "one")
    (grant,) = ann.read_grants(placed["metadata"]["annotations"]) or ()
    assert [d.index for d in grant.devices] == [0]

    async def told() -> bool:
        events = await pipeline.events(ns, "two")
        return any(e["reason"] == "FailedScheduling" for e in events)

    await eventually(told, timeout_s=15, what="a FailedScheduling event on the 2-card pod")
    assert not (await pipeline.get(ns, "two"))["spec"].get("nodeName")
