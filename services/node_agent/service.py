"""The node-agent's imperative shell: inventory out, device-plugin in.

``--source`` picks where devices come from on a real node (agent.py): ``nvml``
(default), ``ascend`` (``npu-smi``), or ``file:INVENTORY[#NODE]`` (one node of an
inventory file, served through the device plugin like a real one: for trying the kubelet
side without a GPU). ``--simulate INVENTORY`` instead plays every node of an inventory
file at once, with no kubelet (demos, benchmarks; see simulate.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

from services.node_agent.agent import Agent
from services.node_agent.inventory import (
    AscendSource,
    FileSource,
    InventorySource,
    NvmlSource,
)
from services.node_agent.simulate import Simulator, load_inventory
from shared import kube
from shared.config import Config
from shared.core.model import NodeName
from shared.runtime import Runtime

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulate",
        metavar="INVENTORY",
        help="play every node of this inventory file (no kubelet, no device plugin)",
    )
    parser.add_argument(
        "--source",
        default="nvml",
        help="devices of this node: nvml, ascend, or file:INVENTORY[#NODE] (default nvml)",
    )
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME", socket.gethostname()),
        help="this node's name (default $NODE_NAME, else the host name)",
    )


def open_source(cfg: Config, spec: str, node: NodeName) -> InventorySource:
    """The inventory source ``--source`` names; a clear exit when it cannot be opened."""
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


async def main(rt: Runtime) -> None:
    path = getattr(rt.args, "simulate", None)
    if path:
        inventory = load_inventory(path)
        api = await kube.connect(rt.cfg.kubernetes)
        rt.on_stop(api.close)
        simulator = Simulator(rt, api, inventory)
        await simulator.start()
        rt.spawn(simulator.heartbeat(), "heartbeat")
        return
    node = NodeName(rt.args.node)
    source = open_source(rt.cfg, rt.args.source, node)
    rt.on_stop(lambda: _close(source))
    api = await kube.connect(rt.cfg.kubernetes)
    rt.on_stop(api.close)
    agent = Agent(rt, node, source)
    await agent.start(api)
    rt.spawn(agent.health_loop(), "health")
    rt.spawn(agent.heartbeat(), "heartbeat")


async def _close(source: InventorySource) -> None:
    source.close()
