"""The node-agent's imperative shell: inventory out, device-plugin in.

``--source`` picks where devices come from on a real node (agent.py): ``auto`` (the
default: NVML where the driver is, else ``npu-smi`` where it is on the PATH, else no
devices: one log line and the agent stays up serving nothing), ``nvml``, ``ascend``
(``npu-smi``), or ``file:INVENTORY[#NODE]`` (one node of an
inventory file, served through the device plugin like a real one: for trying the kubelet
side without a GPU). ``--simulate INVENTORY`` instead plays every node of an inventory
file at once, with no kubelet (demos, benchmarks; see simulate.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
from pathlib import Path

from services.node_agent.agent import Agent, consumer_name
from services.node_agent.ascend import AscendSource
from services.node_agent.inventory import FileSource, InventorySource, NoDevices
from services.node_agent.nvml import NvmlSource
from services.node_agent.simulate import Simulator, load_inventory
from shared import events as ev
from shared import kube
from shared.config import Config
from shared.core.model import NodeName
from shared.runtime import Runtime, Service, handles

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's options: ``--simulate``, or a real node's ``--source`` and ``--node``."""
    parser.add_argument(
        "--simulate",
        metavar="INVENTORY",
        help="play every node of this inventory file (no kubelet, no device plugin)",
    )
    source_arguments(parser)


def source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--source`` and ``--node``: which node's devices, read from where (the agent's and
    the MPS supervisor's, services/node_agent/mps/supervisor.py)."""
    parser.add_argument(
        "--source",
        default="auto",
        help="devices of this node: auto, nvml, ascend, or file:INVENTORY[#NODE] "
        "(default auto: NVML, else npu-smi, else none)",
    )
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME", socket.gethostname()),
        help="this node's name (default $NODE_NAME, else the host name)",
    )


def open_source(cfg: Config, spec: str, node: NodeName) -> InventorySource:
    """The inventory source ``--source`` names; a clear exit when a named one cannot be
    opened (``auto`` never exits: a node with neither NVML nor npu-smi serves nothing)."""
    if spec == "auto":
        try:
            return NvmlSource(cfg)
        except Exception as exc:  # no driver or no GPU here
            nvml = f"{type(exc).__name__}: {exc}"
        if shutil.which("npu-smi"):
            return AscendSource(cfg)
        why = f"no NVML ({nvml}) and no npu-smi on the PATH"
        log.warning("node %s: %s: this node serves no devices; the agent stays up", node, why)
        return NoDevices(why)
    if spec == "nvml":
        try:
            return NvmlSource(cfg)
        except Exception as exc:  # no driver, no GPU: say so, do not trace back
            raise SystemExit(f"tessera node-agent: NVML is not available here ({exc})") from None
    if spec == "ascend":
        return AscendSource(cfg)
    if spec.startswith("file:"):
        path, _, name = spec.removeprefix("file:").partition("#")
        source = FileSource(Path(path), name or node)
        source.read()  # a missing node or a bad file stops the agent now, with the reason
        return source
    raise SystemExit(f"tessera node-agent: unknown --source {spec!r} (nvml, ascend, file:...)")


class NodeAgent(Service):
    """One node's agent (or, with ``--simulate``, many simulated nodes'): owns the
    node's inventory and its kubelet device plugin."""

    NAME = "node-agent"
    LEADER = False  # one per node, alone with its node's consumer

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        self.simulate: str | None = getattr(rt.args, "simulate", None)
        self.node = NodeName(getattr(rt.args, "node", None) or socket.gethostname())
        self.agent: Agent | None = None

    def durable(self) -> str:
        """Its own node's consumer (agent.py :func:`consumer_name`)."""
        return consumer_name(self.node)

    def subjects(self) -> list[str]:
        """Its own node's binds and releases; none when it only simulates nodes."""
        if self.simulate:
            return []
        return sorted(t.filter_subject(self.node) for t in self.handled())

    async def start(self) -> None:
        """With ``--simulate``, start the simulated nodes and their heartbeat; else open
        ``--source``, start the node's agent (services/node_agent/agent.py) and its health and
        heartbeat loops."""
        if self.simulate:
            simulator = Simulator(self.rt, self.api, load_inventory(self.simulate))
            await simulator.start()
            self.rt.spawn(simulator.heartbeat(), "heartbeat")
            return
        source = open_source(self.rt.cfg, self.rt.args.source, self.node)
        self.rt.on_stop(lambda: _close(source))
        self.agent = Agent(self.rt, self.node, source)
        await self.agent.start(self.api)
        self.rt.spawn(self.agent.health_loop(), "health")
        self.rt.spawn(self.agent.heartbeat(), "heartbeat")

    @handles(ev.AllocationBound)
    async def on_allocation_bound(self, event: ev.AllocationBound) -> None:
        """A pod was bound to this node: its Allocate calls will get its grant."""
        if self.agent is not None and event.node == self.node:
            await self.agent.bound(event)

    @handles(ev.AllocationReleased)
    async def on_allocation_released(self, event: ev.AllocationReleased) -> None:
        """A pod of this node is gone: forget its grant."""
        if self.agent is not None and event.node == self.node:
            self.agent.released(event)


async def _close(source: InventorySource) -> None:
    source.close()
