"""NVIDIA GPUs through NVML (pynvml): the ``NvmlSource`` of inventory.py.

Per card: UUID, index, model, memory, SM count, NUMA node (from the PCI bus address in
sysfs), MIG mode and the instances the card runs, each card pair's link (NVLinks,
NVSwitch, PCIe path: ``read_links``), and health from NVML's critical XID events,
watched in a thread.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from services.node_agent.inventory import MIB
from shared.config import Config
from shared.core.model import DeviceInfo, DeviceUUID, MigInstance
from shared.core.topology import pair_score

log = logging.getLogger(__name__)

IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Application errors NVML reports as critical XIDs: the card itself is fine (the same
list NVIDIA's device plugin ignores)."""


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


_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
}
"""NVML's ``NVML_DEVICE_ARCH_*`` numbers and the names people call them by."""


def _architecture(nvml: Any, handle: Any) -> str:
    return _ARCHITECTURES.get(int(nvml.nvmlDeviceGetArchitecture(handle)), "")


def _capability(nvml: Any, handle: Any) -> str:
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return f"{major}.{minor}"


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
        """Every card as NVML shows it now, healthy unless an XID took it out."""
        nvml = self.nvml
        out = []
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = tuple(_text(nvml.nvmlDeviceGetUUID(h)) for h in handles)
        if self._links is None or self._links[0] != uuids:
            self._links = (uuids, read_links(nvml, handles))
        links = self._links[1]
        driver = self._optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()).strip())
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
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
            out.append(
                DeviceInfo(
                    uuid=DeviceUUID(uuid),
                    index=i,
                    vendor="nvidia",
                    model=model,
                    memory_mib=nvml.nvmlDeviceGetMemoryInfo(h).total // MIB,
                    sm_count=self._sm_count(h),
                    numa=numa_of(bus_id, self.sysfs),
                    mode="mig" if mig_on else "hami-core",
                    healthy=uuid not in self.unhealthy,
                    mig_geometry=geometry,
                    links=links.get(i, {}),
                    pci_bus_id=_bus(bus_id),
                    architecture=self._optional(partial(_architecture, nvml, h)),
                    compute_capability=self._optional(partial(_capability, nvml, h)),
                    driver_version=driver,
                )
            )
        return tuple(out)

    def _optional(self, read: Callable[[], str]) -> str:
        """What ``read`` returns, or empty where this NVML (or its stand-in) has no answer:
        these are descriptive attributes (DRA's), never worth failing a read for."""
        try:
            return read()
        except (AttributeError, TypeError, ValueError, self.nvml.NVMLError):
            return ""

    def usage(self) -> dict[str, tuple[int, float]]:
        """Each card's memory in use and utilisation (0 in MIG mode: NVML has none)."""
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
        """Stop the XID watch and shut NVML down."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
        self.nvml.nvmlShutdown()
