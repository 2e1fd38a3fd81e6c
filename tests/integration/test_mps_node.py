"""A real node in ``mps`` mode, end to end: the MPS supervisor and the node agent as
separate processes (as their two DaemonSets run them), the agent in a PID namespace of its
own as in its container, the whole pipeline placing an MPS pod, the played kubelet's
Allocate, and a client of the card's daemon (tests/fakes/nvidia-cuda-mps-control).

When the agent's namespace ends (an agent restart or upgrade: its container's first
process dies and the kernel ends every process of that namespace), the daemon and its
client go on: they were never the agent's. The next agent reads them again and publishes
the card running with its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import events as ev
from shared import kube
from shared.bus import connect
from shared.config import NatsConfig
from shared.core import annotations as ann
from shared.core.model import NodeName
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, register_node, start_pipeline
from tests.kubelet import Kubelet, allocate
from tests.mpsfake import FAKE, FakeClient, daemon_up, need_unshare, starts

pytestmark = pytest.mark.integration

NODE = NodeName("mps-node")
INVENTORY = {
    "nodes": [
        {
            "name": NODE,
            "devices": [
                {"model": "NVIDIA-H100-80GB-HBM3", "memory": 81559, "count": 2, "mode": "mps"}
            ],
        }
    ]
}
SLICE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000, "nvidia.com/gpucores": 30}


class Node:
    """The node's two processes: the MPS supervisor, and the agent in its own PID namespace."""

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.source = ["--node", NODE, "--source", f"file:{p.workdir / NODE}.yaml"]
        self.supervisor: asyncio.subprocess.Process | None = None
        self.agent: asyncio.subprocess.Process | None = None
        """``unshare``, whose one child is the agent: PID 1 of its namespace."""

    async def _spawn(self, name: str, *argv: str) -> asyncio.subprocess.Process:
        log = (self.p.workdir / f"{name}.log").open("ab")
        try:
            return await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=asyncio.subprocess.STDOUT
            )
        finally:
            log.close()

    async def start_supervisor(self) -> None:
        python = [sys.executable, "-m", "services.node_agent", "mps-control"]
        self.supervisor = await self._spawn(
            "mps-control", *python, "--config", str(self.p.config), *self.source
        )

    async def start_agent(self) -> None:
        namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--"]
        agent = [sys.executable, "-m", "services.node_agent", "--config", str(self.p.config)]
        self.agent = await self._spawn(
            "node-agent", *namespace, *agent, "--http-port=0", *self.source
        )

    def agent_pid_1(self) -> int:
        """The agent's PID (seen from here): PID 1 of its namespace."""
        assert self.agent is not None
        children = Path(f"/proc/{self.agent.pid}/task/{self.agent.pid}/children").read_text()
        (pid,) = children.split()
        return int(pid)

    async def stop(self) -> None:
        """SIGTERM to each (``unshare`` passes no signal on: the agent itself gets it)."""
        if self.agent is not None and self.agent.returncode is None:
            os.kill(self.agent_pid_1(), signal.SIGTERM)
        for proc in (self.agent, self.supervisor):
            if proc is not None and proc.returncode is None:
                if proc is self.supervisor:
                    proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):
                    await proc.wait()


async def stored(p: Pipeline) -> ev.NodeInventory | None:
    """The node's inventory in the KV (None: none yet)."""
    nc = await connect(p.nats_admin, "admin")
    try:
        kv = await nc.jetstream().key_value("tessera-inventory")
        with contextlib.suppress(Exception):
            entry = await kv.get(NODE)
            if entry.value:
                found = ev.decode(entry.value)
                assert isinstance(found, ev.NodeInventory)
                return found
        return None
    finally:
        await nc.close()


async def forget(p: Pipeline) -> None:
    """Drop the node's inventory from the KV, so the next one read is a new agent's."""
    nc = await connect(p.nats_admin, "admin")
    try:
        kv = await nc.jetstream().key_value("tessera-inventory")
        await kv.purge(NODE)
    finally:
        await nc.close()


async def published(p: Pipeline, clients: dict[str, int]) -> ev.NodeInventory:
    """Wait for the node's inventory to carry both cards running with these clients."""

    async def probe() -> ev.NodeInventory | None:
        found = await stored(p)
        if found is None or len(found.devices) != 2:
            return None
        seen = {d.uuid: (d.mps, d.mps_clients) for d in found.devices}
        wanted = {u: ("running", clients.get(u, 0)) for u in seen}
        return found if seen == wanted else None

    return await eventually(probe, timeout_s=30, what=f"inventory running with {clients}")


@pytest.fixture
async def node(
    kubeconfig: Path,
    nats_admin: NatsConfig,
    tmp_path_factory: pytest.TempPathFactory,
    kubelet: Kubelet,
) -> AsyncIterator[Node]:
    need_unshare()
    workdir = tmp_path_factory.mktemp("mps-node")
    (workdir / f"{NODE}.yaml").write_text(yaml.safe_dump(INVENTORY))
    host_dir = workdir / "mps"
    p = await start_pipeline(
        workdir,
        kubeconfig,
        nats_admin,
        {"nodes": []},  # no simulated nodes: mps-node is the cluster
        config={
            "nodeAgent": {
                "devicePluginDir": str(kubelet.directory),
                "healthIntervalS": 1.0,
                "isolation": {
                    "libraryHostPath": str(workdir / "vgpu/libvgpu.so"),
                    "preloadHostPath": str(workdir / "vgpu/ld.so.preload"),
                    "cacheHostDir": str(workdir / "vgpu/containers"),
                    "lockDir": str(workdir / "vgpulock"),
                },
                "mps": {
                    "controlCommand": str(FAKE),
                    "hostDir": str(host_dir),
                    "checkIntervalS": 0.2,
                },
            },
            "telemetry": {"logLevel": "DEBUG", "metricsPort": 0},
        },
    )
    await register_node(p.api, NODE)
    n = Node(p)
    try:
        yield n
    finally:
        await n.stop()
        shutil.rmtree(host_dir, ignore_errors=True)  # ends the fake daemons and clients
        await kube.request(p.api, "DELETE", f"/api/v1/nodes/{NODE}")
        await p.close()


async def registered(kubelet: Kubelet) -> str:
    async def gpu() -> str | None:
        while not kubelet.registered.empty():
            r = kubelet.registered.get_nowait()
            if r.resource_name == "nvidia.com/gpu":
                return r.endpoint
        return None

    return await eventually(gpu, timeout_s=30, what="nvidia.com/gpu registered")


def mps_pod(name: str, user: int) -> dict[str, Any]:
    obj = pod(name, SLICE, annotations={"nvidia.com/vgpu-mode": "mps"})
    obj["spec"]["securityContext"] = {"runAsUser": user}
    return obj


async def test_the_daemon_and_its_client_outlive_the_agents_pid_namespace(
    node: Node, kubelet: Kubelet
) -> None:
    p = node.p
    await node.start_supervisor()
    await node.start_agent()
    endpoint = await registered(kubelet)
    await published(p, {})
    ns = await p.namespace()
    await p.create(ns, mps_pod("first", 1000))
    obj = await p.bound(ns, "first")
    grants = ann.read_grants(obj["metadata"]["annotations"])
    assert grants is not None
    card = grants[0].devices[0].uuid
    channel = kubelet.channel(endpoint)
    try:
        (handed,) = (await allocate(channel, 1)).container_responses
    finally:
        await channel.close()
    # The container gets its own card's daemon: pipes, shared memory, limits on device 0.
    envs = dict(handed.envs)
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8000M"
    mounts = {m.container_path: m.host_path for m in handed.mounts}
    pipe, shm = Path(mounts["/tmp/nvidia-mps"]), Path(mounts["/dev/shm"])
    assert (pipe.parent.name, pipe.name, shm.parent, shm.name) == (card, "pipe", pipe.parent, "shm")
    (daemon,) = starts(pipe)
    assert daemon["env"]["CUDA_VISIBLE_DEVICES"] == card
    seen = os.stat(shm)
    assert daemon["shm"] == [seen.st_dev, seen.st_ino]  # the daemon's /dev/shm is the client's

    client = await FakeClient.start(pipe, 1000)
    try:
        await client.reaches("ready")
        await published(p, {card: 1})
        # The agent restarts: its namespace's first process dies, and every process of
        # the namespace with it.
        os.kill(node.agent_pid_1(), signal.SIGKILL)
        assert node.agent is not None
        await node.agent.wait()
        await asyncio.sleep(1.0)  # a client that lost its server says so within 50 ms
        assert client.state == "ready"
        assert client.proc.returncode is None
        assert daemon_up(pipe)
        assert len(starts(pipe)) == 1
        # A new agent reads the same daemons: the card runs, with its client.
        await forget(p)
        await node.start_agent()
        await published(p, {card: 1})
        assert len(starts(pipe)) == 1
    finally:
        await client.stop()
        await p.delete(ns, "first")  # a later agent of this node would wait for its Allocate
