"""The node-agent's imperative shell: inventory out, device-plugin in.

``--simulate inventory.yaml`` plays the nodes of an inventory file (see simulate.py).
Without it the agent reads the real devices of the node it runs on; that source (NVML,
Ascend DCMI) and the kubelet device-plugin API arrive with the node-agent issue.
"""

from __future__ import annotations

import argparse
import logging

from services.node_agent.simulate import Simulator, load_inventory
from shared import kube
from shared.runtime import Runtime

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulate",
        metavar="INVENTORY",
        help="play the nodes of this inventory file instead of real devices",
    )


async def main(rt: Runtime) -> None:
    path = getattr(rt.args, "simulate", None)
    if not path:
        raise SystemExit(
            "tessera node-agent: reading real devices (NVML, Ascend DCMI) is not built yet; "
            "run with --simulate INVENTORY"
        )
    inventory = load_inventory(path)
    api = await kube.connect(rt.cfg.kubernetes)
    rt.on_stop(api.close)
    simulator = Simulator(rt, api, inventory)
    await simulator.start()
    rt.spawn(simulator.heartbeat(), "heartbeat")
