"""Where a node's devices come from: one Protocol, and the sources that need no driver.

- ``NvmlSource`` (nvml.py): NVIDIA GPUs through NVML, with each card pair's link and
  health from NVML's critical XID events.
- ``AscendSource`` (ascend.py): Huawei Ascend NPUs from ``npu-smi info``.
- ``FileSource``: one node of an inventory file (simulate.py's format), read again at
  each read: a kubelet-side trial without a GPU, where editing the file (``unhealthy``)
  plays a failing card.
- ``NoDevices``: a node with neither, served empty.

Every source returns devices before node overrides; the ledger applies those, and the
device plugin leaves out what ``filterDevices`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from services.node_agent.simulate import expand, load_inventory
from shared.core.model import DeviceInfo, NodeName

MIB = 1024 * 1024
"""Bytes in a MiB (NVML counts memory in bytes, the inventory in MiB)."""


class InventorySource(Protocol):
    """Where a node's devices are read from (NVML, npu-smi, a file)."""

    def read(self) -> tuple[DeviceInfo, ...]:
        """Every device of the node as it is now (blocking; call it off the event loop)."""
        ...

    def usage(self) -> dict[str, tuple[int, float]]:
        """UUID → (memory in use, bytes; utilisation, percent), for the metrics."""
        ...

    def close(self) -> None:
        """Release what reading holds (NVML and its XID watch); called at the agent's stop."""
        ...


@dataclass
class FileSource:
    """One node of an inventory file, re-read at each health check (edit it: a failing card)."""

    path: Path
    node: str

    def read(self) -> tuple[DeviceInfo, ...]:
        """The file's devices of ``node``, read again each time; a node the file does not list stops
        the agent (``SystemExit``)."""
        nodes = expand(load_inventory(self.path))
        if self.node not in nodes:
            raise SystemExit(f"tessera node-agent: {self.path} has no node {self.node}")
        return nodes[NodeName(self.node)][1]

    def usage(self) -> dict[str, tuple[int, float]]:
        """No usage to report: a file has no live devices."""
        return {}

    def close(self) -> None:
        """Nothing held open."""
        return None


@dataclass
class NoDevices:
    """A node with neither NVML nor npu-smi: the agent stays up and serves nothing
    (a DaemonSet on a node without accelerators must not crash-loop)."""

    why: str

    def read(self) -> tuple[DeviceInfo, ...]:
        """No device."""
        return ()

    def usage(self) -> dict[str, tuple[int, float]]:
        """No usage to report."""
        return {}

    def close(self) -> None:
        """Nothing held open."""
        return None
