"""Huawei Ascend NPUs from ``npu-smi info`` (the tool every Ascend driver installs): the
``AscendSource`` of inventory.py.

Per chip: its logical id, chip name, HBM or DDR memory and health, read from the tool's
table (910B/910A: one chip per NPU; 310P: one or two chips per card); AI cores and
templates come from the config's ``vnpus`` entry for the chip.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from services.node_agent.inventory import MIB
from shared.config import Config
from shared.core.hosts import go_int64
from shared.core.model import DeviceInfo, DeviceUUID

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NpuChip:
    """One chip row of ``npu-smi info``."""

    npu: int
    chip: int
    logic_id: int
    name: str
    health: str
    bus_id: str
    memory_mib: int
    memory_used_mib: int = 0
    aicore_percent: float = 0.0


_TOP = re.compile(r"^\|\s*([0-9]+)\s+(\S+)\s*\|\s*(\S+)\s*\|")
_CHIP = re.compile(
    r"^\|\s*([0-9]+)(?:\s+([0-9]+))?\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f:.]+)\s*\|(.*)\|"
)
_USAGE = re.compile(r"([0-9]+)\s*/\s*([0-9]+)")
_PERCENT = re.compile(r"[0-9]{1,3}(?:\.[0-9]+)?")
"""Numbers of ``npu-smi info``: ASCII digits only (``str.isdigit`` takes ``²``, which
float() refuses), read by go_int64 (None past int64, where int() would raise)."""
HEALTHY_NPU = ("OK", "Warning")
UNREADABLE = "Unreadable"
"""The health of a chip whose memory npu-smi shows no number for: out of placements."""


def parse_npu_smi(text: str) -> list[NpuChip]:
    """The chips of ``npu-smi info`` output (910B/910A: one chip per NPU, HBM; 310P:
    one or two chips per card, each with its logical device id, DDR memory). Never
    raises: an NPU or chip whose number cannot be read is left out, and a chip whose
    memory cannot be read is reported with the health :data:`UNREADABLE`, each with a
    log line."""
    chips: list[NpuChip] = []
    npu: tuple[int, str, str] | None = None
    for line in text.splitlines():
        if line.startswith("| NPU") or "Process" in line:
            if "Process id" in line:
                break  # the process table follows the device table
            continue
        top = _TOP.match(line)
        if top and not _CHIP.match(line):
            number = go_int64(top.group(1))
            npu = None if number is None else (number, top.group(2), top.group(3))
            if npu is None:
                log.warning("npu-smi: unreadable NPU number, its chips left out: %.80r", line)
            continue
        row = _CHIP.match(line)
        if row and npu is not None:
            number, name, health = npu
            rest = row.group(4)
            chip = go_int64(row.group(1))
            logic = go_int64(row.group(2)) if row.group(2) is not None else number
            if chip is None or logic is None:
                log.warning(
                    "npu-smi: NPU %d: unreadable chip number, left out: %.80r", number, line
                )
                continue
            usages = _USAGE.findall(rest)
            used, memory = (
                (go_int64(usages[-1][0]), go_int64(usages[-1][1])) if usages else (None, None)
            )
            if used is None or memory is None:
                log.warning(
                    "npu-smi: NPU %d chip %d: unreadable memory, reported unhealthy: %.80r",
                    number,
                    chip,
                    line,
                )
                used, memory, health = 0, 0, UNREADABLE
            core = rest.split()[0] if rest.split() else "NA"  # AICore(%), or NA
            chips.append(
                NpuChip(
                    number,
                    chip,
                    logic,
                    name,
                    health,
                    row.group(3),
                    memory,  # HBM when shown, else DDR
                    used,
                    min(float(core), 100.0) if _PERCENT.fullmatch(core) else 0.0,
                )
            )
    return chips


class AscendSource:
    """Ascend NPUs from ``npu-smi info`` (the tool every Ascend driver installs)."""

    def __init__(self, cfg: Config, run: Callable[[], str] | None = None) -> None:
        self.cfg = cfg
        self.chips: list[NpuChip] = []
        self.run = run or (
            lambda: (
                subprocess.run(
                    ["npu-smi", "info"], check=True, capture_output=True, text=True, timeout=30
                ).stdout
            )
        )

    def read(self) -> tuple[DeviceInfo, ...]:
        """Every chip ``npu-smi info`` shows now, healthy when it says OK or Warning."""
        out = []
        self.chips = parse_npu_smi(self.run())
        for c in self.chips:
            spec = next((v for v in self.cfg.devices.vnpus if v.chip_name == c.name), None)
            out.append(
                DeviceInfo(
                    uuid=npu_uuid(c),
                    index=c.logic_id,
                    vendor="ascend",
                    model=f"Ascend{c.name}",
                    memory_mib=c.memory_mib,
                    chip=c.name,
                    ai_cores=spec.ai_core if spec else 0,
                    ai_cpus=spec.ai_cpu if spec else 0,
                    healthy=c.health in HEALTHY_NPU,
                )
            )
        return tuple(out)

    def usage(self) -> dict[str, tuple[int, float]]:
        """From the last ``read`` (npu-smi is slow to run; health is re-read anyway)."""
        return {npu_uuid(c): (c.memory_used_mib * MIB, c.aicore_percent) for c in self.chips}

    def close(self) -> None:
        """Nothing to release: each read runs the tool afresh."""
        return None


def npu_uuid(c: NpuChip) -> DeviceUUID:
    """npu-smi shows no UUID: the chip's model, PCI address and chip number name it."""
    return DeviceUUID(f"Ascend{c.name}-{c.bus_id}-{c.chip}")
