"""Where a node's devices come from: one Protocol, three sources.

- ``NvmlSource``: NVIDIA GPUs through NVML (pynvml): UUID, index, model, memory, SM
  count, NUMA node (from the PCI bus address in sysfs), MIG mode and the instances the
  card runs, each card pair's link (NVLinks, NVSwitch, PCIe path: ``read_links``), and
  health from NVML's critical XID events.
- ``AscendSource``: Huawei Ascend NPUs from ``npu-smi info`` (chip, HBM or DDR memory,
  health); AI cores and templates come from the config's ``vnpus`` entry for the chip.
- ``FileSource``: one node of an inventory file (simulate.py's format), read again at
  each read: a kubelet-side trial without a GPU, where editing the file (``unhealthy``)
  plays a failing card.

Every source returns devices before node overrides; the ledger applies those, and the
device plugin leaves out what ``filterDevices`` names.
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from services.node_agent.simulate import expand, load_inventory
from shared.config import Config
from shared.core.hosts import go_int64
from shared.core.model import DeviceInfo, DeviceUUID, MigInstance, NodeName
from shared.core.topology import pair_score

log = logging.getLogger(__name__)

MIB = 1024 * 1024
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Application errors NVML reports as critical XIDs: the card itself is fine (the same
list NVIDIA's device plugin ignores)."""


class InventorySource(Protocol):
    """Where a node's devices are read from (NVML, npu-smi, a file)."""

    def read(self) -> tuple[DeviceInfo, ...]:
        """Every device of the node as it is now (blocking; call it off the event loop)."""
        ...

    def usage(self) -> dict[str, tuple[int, float]]:
        """UUID → (memory in use, bytes; utilisation, percent), for the metrics."""
        ...

    def close(self) -> None: ...


@dataclass
class FileSource:
    """One node of an inventory file, re-read at each health check (edit it: a failing card)."""

    path: Path
    node: str

    def read(self) -> tuple[DeviceInfo, ...]:
        nodes = expand(load_inventory(self.path))
        if self.node not in nodes:
            raise SystemExit(f"tessera node-agent: {self.path} has no node {self.node}")
        return nodes[NodeName(self.node)][1]

    def usage(self) -> dict[str, tuple[int, float]]:
        return {}

    def close(self) -> None:
        return None


# --- NVIDIA ----------------------------------------------------------------------------


def nvidia_model(name: str) -> str:
    """NVML's name as users match it with use-gputype: ``NVIDIA A100-SXM4-80GB`` →
    ``NVIDIA-A100-SXM4-80GB`` (HAMi's ``NVIDIA-`` prefix, no spaces)."""
    return "NVIDIA-" + name.removeprefix("NVIDIA").strip().replace(" ", "-")


def numa_of(bus_id: str, sysfs: Path) -> int:
    """The NUMA node of a PCI device (``00000000:3B:00.0`` as NVML writes it); 0 when the
    platform does not say (``-1``) or the file is missing."""
    domain, rest = bus_id.lower().split(":", 1)
    try:
        node = int((sysfs / f"{domain[-4:]}:{rest}" / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return 0
    return max(node, 0)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bus(bus_id: str | bytes) -> str:
    """A PCI address as one spelling: NVML writes the domain with 8 digits in ``busId``
    and with 4 in ``busIdLegacy`` (``00000000:3B:00.0``, ``0000:3b:00.0``)."""
    text = _text(bus_id).strip().lower()
    domain, _, rest = text.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def _not_supported(nvml: Any, exc: Exception) -> bool:
    return getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)


def _nvlinks(nvml: Any, h: Any, peers: dict[str, int]) -> tuple[Counter[int], int]:
    """One card's active NVLinks: per peer card (by index, ``peers`` maps bus addresses)
    how many reach it directly, and how many reach an NVSwitch. A card without NVLink
    (NVML's NotSupported) has none; a link NVML cannot read is left out."""
    direct: Counter[int] = Counter()
    switch = 0
    remote_pci = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None)
    if remote_pci is None:  # nvidia-ml-py 12+: the plain name calls the _v2 function
        remote_pci = nvml.nvmlDeviceGetNvLinkRemotePciInfo
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError as exc:
            if _not_supported(nvml, exc):
                break  # no NVLink on this card
            continue  # past the card's links (InvalidArgument), or unreadable
        if state != nvml.NVML_FEATURE_ENABLED:
            continue
        try:
            peer = peers.get(_bus(remote_pci(h, link).busId))
            if peer is not None:
                direct[peer] += 1
            elif nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == (
                nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            ):
                switch += 1
        except nvml.NVMLError:
            continue
    return direct, switch


def read_links(nvml: Any, handles: Sequence[Any]) -> dict[int, dict[int, int]]:
    """Per card (its index in ``handles``), the score of its link to each other card, as
    HAMi's device plugin reads them (``pkg/device/nvidia/links.go``; shared/core/topology.py
    for the scale): the PCIe level the pair shares (``nvmlDeviceGetTopologyCommonAncestor``)
    plus 100 per NVLink, counted on each active link (``nvmlDeviceGetNvLinkState``) whose
    far end (``nvmlDeviceGetNvLinkRemotePciInfo_v2``) is the peer; two cards with no direct
    link that both reach NVSwitches (``nvmlDeviceGetNvLinkRemoteDeviceType``) count the
    fewer of their switch links. A pair whose two cards count different direct links
    scores 0, as HAMi scores it, with a warning. A pair NVML says nothing of (PCIe cards,
    NotSupported everywhere) is left out: 0."""
    peers = {_bus(nvml.nvmlDeviceGetPciInfo(h).busId): i for i, h in enumerate(handles)}
    reach = [_nvlinks(nvml, h, peers) for h in handles]
    out: dict[int, dict[int, int]] = {}
    for i, a in enumerate(handles):
        for j in range(i + 1, len(handles)):
            try:
                level: int | None = int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, handles[j]))
            except nvml.NVMLError:
                level = None
            there, back = reach[i][0][j], reach[j][0][i]
            if there != back:
                log.warning(
                    "GPU %d counts %d NVLinks to GPU %d, which counts %d back: the pair "
                    "scores 0 (HAMi's AsymmetricGPUP2PLink)",
                    i,
                    there,
                    j,
                    back,
                )
                continue
            score = pair_score(level, there or min(reach[i][1], reach[j][1]))
            if score:
                out.setdefault(i, {})[j] = score
                out.setdefault(j, {})[i] = score
    return out


@dataclass
class NoDevices:
    """A node with neither NVML nor npu-smi: the agent stays up and serves nothing
    (a DaemonSet on a node without accelerators must not crash-loop)."""

    why: str

    def read(self) -> tuple[DeviceInfo, ...]:
        return ()

    def usage(self) -> dict[str, tuple[int, float]]:
        return {}

    def close(self) -> None:
        return None


class NvmlSource:
    """NVIDIA GPUs through NVML. ``nvml`` is the pynvml module (or a recorded stand-in)."""

    def __init__(self, cfg: Config, nvml: Any = None, sysfs: Path | None = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.cfg = cfg
        self.nvml = nvml
        self.sysfs = sysfs or Path("/sys/bus/pci/devices")
        self.unhealthy: dict[str, str] = {}
        """UUID → why (the XID), from the event watcher."""
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._links: tuple[tuple[str, ...], dict[int, dict[int, int]]] | None = None
        """(the cards' UUIDs, their links) as last read: links change with the cards."""
        nvml.nvmlInit()

    def read(self) -> tuple[DeviceInfo, ...]:
        nvml = self.nvml
        out = []
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = tuple(_text(nvml.nvmlDeviceGetUUID(h)) for h in handles)
        if self._links is None or self._links[0] != uuids:
            self._links = (uuids, read_links(nvml, handles))
        links = self._links[1]
        for i, h in enumerate(handles):
            uuid = uuids[i]
            model = nvidia_model(_text(nvml.nvmlDeviceGetName(h)))
            mig_on = False
            geometry: tuple[MigInstance, ...] = ()
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(h)
                mig_on = current == nvml.NVML_DEVICE_MIG_ENABLE
            except nvml.NVMLError:
                pass  # not MIG-capable
            if mig_on:
                geometry = self._instances(h, model)
            out.append(
                DeviceInfo(
                    uuid=DeviceUUID(uuid),
                    index=i,
                    vendor="nvidia",
                    model=model,
                    memory_mib=nvml.nvmlDeviceGetMemoryInfo(h).total // MIB,
                    sm_count=self._sm_count(h),
                    numa=numa_of(_text(nvml.nvmlDeviceGetPciInfo(h).busId), self.sysfs),
                    mode="mig" if mig_on else "hami-core",
                    healthy=uuid not in self.unhealthy,
                    mig_geometry=geometry,
                    links=links.get(i, {}),
                )
            )
        return tuple(out)

    def usage(self) -> dict[str, tuple[int, float]]:
        nvml = self.nvml
        out = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except nvml.NVMLError:
                util = 0.0  # MIG mode: NVML has no whole-card utilisation
            used = int(nvml.nvmlDeviceGetMemoryInfo(h).used)
            out[_text(nvml.nvmlDeviceGetUUID(h))] = (used, util)
        return out

    def _sm_count(self, h: Any) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetAttributes(h).multiprocessorCount)
        except self.nvml.NVMLError:
            return 0

    def _instances(self, h: Any, model: str) -> tuple[MigInstance, ...]:
        """The MIG instances the card runs, in placement order (the geometry's slots)."""
        nvml = self.nvml
        found = []
        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except nvml.NVMLError:
                continue  # an empty slot
            attributes = nvml.nvmlDeviceGetAttributes(mig)
            gi = nvml.nvmlDeviceGetGpuInstanceById(h, nvml.nvmlDeviceGetGpuInstanceId(mig))
            start = nvml.nvmlGpuInstanceGetInfo(gi).placement.start
            memory = nvml.nvmlDeviceGetMemoryInfo(mig).total // MIB
            profile = self._profile(model, attributes.gpuInstanceSliceCount, memory)
            found.append((start, profile, memory, _text(nvml.nvmlDeviceGetUUID(mig))))
        found.sort()
        return tuple(
            MigInstance(profile=p, memory_mib=m, placement=n, uuid=u)
            for n, (_, p, m, u) in enumerate(found)
        )

    def _profile(self, model: str, slices: int, memory: int) -> str:
        """The configured profile name (``knownMigGeometries``) of an instance with this
        many compute slices and about this much memory."""
        best: tuple[int, str] | None = None
        for known in self.cfg.devices.nvidia.known_mig_geometries:
            if not any(m.lower() in model.lower() for m in known.models):
                continue
            for geometry in known.allowed_geometries:
                for p in geometry.geometries:
                    if p.name.startswith(f"{slices}g."):
                        distance = abs(p.memory - memory)
                        if best is None or distance < best[0]:
                            best = (distance, p.name)
        return best[1] if best else f"{slices}g.{round(memory / 1000)}gb"

    # --- health -----------------------------------------------------------------------

    def watch_health(self, on_change: Callable[[], None]) -> None:
        """Watch critical XID events in a thread; ``on_change`` runs (in that thread)
        when a device turns unhealthy."""
        self._watcher = threading.Thread(
            target=self._watch, args=(on_change,), name="nvml-xid", daemon=True
        )
        self._watcher.start()

    def _watch(self, on_change: Callable[[], None]) -> None:
        nvml = self.nvml
        events = nvml.nvmlEventSetCreate()
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError as exc:
                log.warning("no XID events from GPU %d (%s): health from reads only", i, exc)
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(events, 1000)
            except nvml.NVMLError_Timeout:
                continue
            xid = int(data.eventData)
            if xid in IGNORED_XIDS:
                continue
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            log.error("GPU %s reported XID %d: unhealthy, out of new placements", uuid, xid)
            self.unhealthy[uuid] = f"XID {xid}"
            on_change()
        nvml.nvmlEventSetFree(events)

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
        self.nvml.nvmlShutdown()


# --- Ascend ----------------------------------------------------------------------------


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
        return None


def npu_uuid(c: NpuChip) -> DeviceUUID:
    """npu-smi shows no UUID: the chip's model, PCI address and chip number name it."""
    return DeviceUUID(f"Ascend{c.name}-{c.bus_id}-{c.chip}")
