"""Simulated nodes: an inventory file stands in for NVML / DCMI (demos, tests, benchmarks).

One agent process may play many nodes. For each it creates or updates the Node object
with the capacity a device-plugin registration would advertise (every configured count,
memory and core resource), marks it Ready, and publishes its inventory with the config
hash to the bus and the inventory KV; the KV entry is refreshed every ``heartbeat_s``.

Inventory file::

    nodes:
      - name: a100-{i}          # {i} numbers the replicas
        replicas: 2
        labels: {gpu: a100}
        taints: [{key: dedicated, value: gpu, effect: NoSchedule}]
        allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
        devices:
          - {vendor: nvidia, model: NVIDIA-A100-SXM4-80GB, memory: 81920, count: 8, numa: 2,
             nvlink: {islands: 2, links: 4}}   # cards 0-3 and 4-7 linked, 4 NVLinks a pair
          - {vendor: ascend, model: Ascend910B3, chip: 910B3, memory: 65536, count: 8}

``nvlink`` gives a group's cards the link scores an agent reads with NVML
(``DeviceInfo.links``): ``islands`` equal runs of consecutive cards, each pair within one
linked by ``links`` NVLinks (one island: an NVSwitch box); every pair's PCIe path is one
CPU's when the two share a NUMA node, else across CPUs. Without it: no links reported.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from kubernetes_asyncio.client import ApiException

from services.node_agent.mps import mps_cards
from services.node_agent.mps.reader import MpsReport, with_state
from services.node_agent.resources import capacity
from shared import events as ev
from shared import kube
from shared.config import Config, ConfigError, read_yaml
from shared.core.model import DeviceInfo, DeviceUUID, MpsState, NodeName, SharingMode, Vendor
from shared.core.topology import CROSS_NUMA, SAME_NUMA, pair_score
from shared.runtime import Runtime

log = logging.getLogger(__name__)

MAX_REPLICAS = 100_000
"""The most replicas one node of an inventory file may have."""
MAX_COUNT = 64
"""The most devices of one kind a simulated node may have."""


class _Inv(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    pass


class SimNvlink(_Inv, frozen=True, kw_only=True):
    """NVLinks among a group's cards (see the module docstring)."""

    islands: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)] = 1
    """Equal runs of consecutive cards, all pairs of each linked (1: an NVSwitch box)."""
    links: Annotated[int, msgspec.Meta(ge=1, le=18)] = 1
    """NVLinks between two cards of one island (NVSwitch: each card's links to it)."""


class SimDevices(_Inv, frozen=True, kw_only=True):
    """Identical devices of a simulated node."""

    vendor: Vendor = "nvidia"
    model: str
    memory: Annotated[int, msgspec.Meta(ge=1)]
    """MiB per device."""
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)] = 1
    mode: SharingMode = "hami-core"
    numa: Annotated[int, msgspec.Meta(ge=1)] = 1
    """NUMA nodes the devices are spread over."""
    chip: str | None = None
    cores: Annotated[int, msgspec.Meta(ge=1)] = 100
    sm_count: Annotated[int, msgspec.Meta(ge=0)] = 0
    unhealthy: list[int] = msgspec.field(default_factory=list)
    """Indexes of devices to report unhealthy."""
    nvlink: SimNvlink | None = None
    """The cards' NVLink islands; None: no links reported (PCIe cards, other vendors)."""


class SimTaint(_Inv, frozen=True, kw_only=True):
    """A taint of a simulated node."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class SimNode(_Inv, frozen=True, kw_only=True):
    """A simulated node (``replicas`` of it): labels, taints, allocatable, devices."""

    name: str
    replicas: Annotated[int, msgspec.Meta(ge=1, le=MAX_REPLICAS)] = 1
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    taints: list[SimTaint] = msgspec.field(default_factory=list)
    allocatable: dict[str, str] = msgspec.field(default_factory=dict)
    """cpu, memory, pods and other resources, over the defaults (64 cpu, 512Gi, 250 pods)."""
    unschedulable: bool = False
    devices: list[SimDevices] = msgspec.field(default_factory=list)


class Inventory(_Inv, frozen=True, kw_only=True):
    """An inventory file: the simulated nodes."""

    nodes: list[SimNode]


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file. Anything wrong with it stops the agent
    (SystemExit) with the reason, naming the key: a file that cannot be read or is not
    UTF-8 YAML, a bad value, a node name with braces other than ``{i}``, or two nodes
    of one name."""
    try:
        data = read_yaml(Path(path), "inventory")
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    try:
        inventory = msgspec.convert(data, Inventory)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"inventory {path}: {exc}") from None
    first: dict[str, int] = {}
    for i, node in enumerate(inventory.nodes):
        where = f"inventory {path}: `$.nodes[{i}].name`"
        if "{" in node.name.replace("{i}", "") or "}" in node.name.replace("{i}", ""):
            raise SystemExit(
                f"{where} {node.name!r} has braces: the only placeholder is {{i}}, the "
                "replica's number"
            )
        for replica in range(node.replicas):
            name = node.name.replace("{i}", str(replica))
            if name in first:
                raise SystemExit(
                    f"{where}: node {name!r} is named twice (first by `$.nodes[{first[name]}]`);"
                    " give each node its own name ({i} numbers the replicas)"
                )
            first[name] = i
    return inventory


def _uuid(node: str, vendor: str, index: int) -> DeviceUUID:
    digest = hashlib.sha1(f"{node}/{vendor}/{index}".encode()).hexdigest()
    prefix = "GPU" if vendor == "nvidia" else vendor.upper()
    return DeviceUUID(f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:28]}")


def _links(group: SimDevices, n: int, base: int) -> dict[int, int]:
    """Card ``n`` of ``group``: its link score to each other card of the group (index
    ``base + m``), as NVML would give it (shared/core/topology.py)."""
    if group.nvlink is None:
        return {}
    islands, links = group.nvlink.islands, group.nvlink.links

    def island(m: int) -> int:
        return m * islands // group.count

    def numa(m: int) -> int:
        return m * group.numa // group.count

    return {
        base + m: pair_score(
            SAME_NUMA if numa(m) == numa(n) else CROSS_NUMA,
            links if island(m) == island(n) else 0,
        )
        for m in range(group.count)
        if m != n
    }


def expand(inventory: Inventory) -> dict[NodeName, tuple[SimNode, tuple[DeviceInfo, ...]]]:
    """Every simulated node with its devices (UUIDs stable across restarts)."""
    out: dict[NodeName, tuple[SimNode, tuple[DeviceInfo, ...]]] = {}
    for spec in inventory.nodes:
        for i in range(spec.replicas):
            name = NodeName(spec.name.replace("{i}", str(i)))
            devices: list[DeviceInfo] = []
            per_vendor: dict[str, int] = {}
            for group in spec.devices:
                for n in range(group.count):
                    index = per_vendor.get(group.vendor, 0)
                    per_vendor[group.vendor] = index + 1
                    devices.append(
                        DeviceInfo(
                            uuid=_uuid(name, group.vendor, index),
                            index=index,
                            vendor=group.vendor,
                            model=group.model,
                            memory_mib=group.memory,
                            cores=group.cores,
                            sm_count=group.sm_count,
                            numa=n * group.numa // group.count,
                            mode=group.mode,
                            healthy=n not in group.unhealthy,
                            chip=group.chip,
                            links=_links(group, n, index - n),
                        )
                    )
            out[name] = (spec, tuple(devices))
    return out


def _mps_running(
    cfg: Config, node: NodeName, devices: tuple[DeviceInfo, ...]
) -> tuple[DeviceInfo, ...]:
    """A simulated node's cards in ``mps`` mode report their MPS daemon ``running``, as a real
    agent does once the card's daemon answers (services/node_agent/mps/reader.py): no
    process runs on a simulated card, so there is no daemon to ask."""
    running: dict[DeviceUUID, MpsState] = dict.fromkeys(mps_cards(cfg, node, devices), "running")
    return with_state(devices, MpsReport(states=running)) if running else devices


class Simulator:
    """Plays every node of an inventory: their Node objects and their inventories on the bus."""

    def __init__(self, rt: Runtime, api: kube.Client, inventory: Inventory) -> None:
        self.rt = rt
        self.api = api
        self.nodes = {
            name: (spec, _mps_running(rt.cfg, name, devices))
            for name, (spec, devices) in expand(inventory).items()
        }
        self.seq = 0
        self.agent = f"{socket.gethostname()}/simulated"

    async def register(
        self, name: NodeName, spec: SimNode, devices: tuple[DeviceInfo, ...]
    ) -> None:
        """Create the node's Node object (an existing one is kept) and set its labels, taints,
        capacity and allocatable, and a ``Ready`` condition, as its kubelet would."""
        labels = {"kubernetes.io/hostname": name, "tessera.io/simulated": "true", **spec.labels}
        if any(d.vendor == "nvidia" for d in devices):
            labels.setdefault("volcano.sh/vgpu.enabled", "true")
        node_spec = {
            "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in spec.taints],
            "unschedulable": spec.unschedulable,
        }
        try:
            await kube.request(
                self.api,
                "POST",
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        # Labels and taints as configured: this also lifts the not-ready taint the API
        # server puts on a new Node, as the node lifecycle controller would once Ready.
        await kube.request(
            self.api,
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"metadata": {"labels": labels}, "spec": node_spec},
            content_type="application/merge-patch+json",
        )
        resources: dict[str, str] = {"cpu": "64", "memory": "512Gi", "pods": "250"}
        resources.update(spec.allocatable)
        resources.update(capacity(self.rt.cfg, name, devices))
        now = kube.now_rfc3339()
        status: dict[str, Any] = {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "simulated by tessera node-agent",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        }
        await kube.request(
            self.api,
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            status,
            content_type="application/strategic-merge-patch+json",
        )

    def inventory(self, name: NodeName, devices: tuple[DeviceInfo, ...]) -> ev.NodeInventory:
        """The node's inventory as published, numbered by one ``seq`` shared by every simulated
        node."""
        self.seq += 1
        return ev.NodeInventory(
            node=name,
            devices=devices,
            config_hash=self.rt.config_hash,
            agent=self.agent,
            seq=self.seq,
        )

    async def start(self) -> None:
        """Register every node and publish its inventory (event and KV), 32 at a time."""
        semaphore = asyncio.Semaphore(32)

        async def one(name: NodeName, spec: SimNode, devices: tuple[DeviceInfo, ...]) -> None:
            async with semaphore:
                await self.register(name, spec, devices)
                report = self.inventory(name, devices)
                await self.rt.bus.put_inventory(report)
                await self.rt.bus.publish(report)

        await asyncio.gather(*(one(n, s, d) for n, (s, d) in self.nodes.items()))
        log.info(
            "simulating %d nodes with %d devices",
            len(self.nodes),
            sum(len(d) for _, d in self.nodes.values()),
        )

    async def heartbeat(self) -> None:
        """Re-put every simulated node's inventory in the KV every ``scheduler.heartbeatS``."""
        while True:
            await asyncio.sleep(self.rt.cfg.scheduler.heartbeat_s)
            for name, (_, devices) in self.nodes.items():
                await self.rt.bus.put_inventory(self.inventory(name, devices))
