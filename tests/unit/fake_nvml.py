# ruff: noqa: N801, N802, N815, N818 (the names are pynvml's)
"""A stand-in for pynvml that replays a recorded inventory (tests never touch a real
card, and never change one's MIG mode).

A recording is JSON: per GPU its UUID, NVML name, memory (bytes), SM count, PCI bus id,
MIG mode and the MIG devices it runs (UUID, GPU-instance id, placement start, compute
slices, memory). ``FakeNvml`` answers the NVML calls the node agent makes from it, and
can create and destroy MIG instances on the recorded cards for the dynamic-MIG logic.

Topology, when recorded: per GPU ``nvlink`` (peer index → NVLinks to it) and ``nvswitch``
(links to NVSwitches), which become its active links in that order (the rest of its
``NVML_NVLINK_MAX_LINKS`` are disabled; a GPU with neither key answers NotSupported, as
a PCIe card does); and ``ancestors``, the n x n matrix of NVML's common-ancestor levels
(``NVML_TOPOLOGY_*``; absent: NotSupported).
"""

from __future__ import annotations

import json
import queue
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data"


class NVMLError(Exception):
    value = 999  # NVML_ERROR_UNKNOWN


class NVMLError_NotSupported(NVMLError):
    value = 3


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


@dataclass
class Mig:
    uuid: str
    gi: int
    start: int
    slices: int
    memory: int


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    memory: int
    sms: int
    bus: str
    mig: int
    migs: list[Mig] = field(default_factory=list)
    links: list[int | None] | None = None
    """Each active NVLink's far end: a peer's index, or None for an NVSwitch; None: no
    NVLink on this card (NotSupported)."""


def _links(g: dict[str, Any]) -> list[int | None] | None:
    if "nvlink" not in g and "nvswitch" not in g:
        return None
    links: list[int | None] = []
    for peer, n in g.get("nvlink", {}).items():
        links += [int(peer)] * n
    return links + [None] * g.get("nvswitch", 0)


class FakeNvml:
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FEATURE_ENABLED = 1
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    SWITCH_BUS = "00000000:C5:00.0"
    nvmlEventTypeXidCriticalError = 8
    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout

    def __init__(self, recording: dict[str, Any]) -> None:
        self.gpus = [
            Gpu(
                index=i,
                uuid=g["uuid"],
                name=g["name"],
                memory=g["memory"],
                sms=g["sms"],
                bus=g["bus"],
                mig=g.get("mig", 0),
                migs=[Mig(**m) for m in g.get("migs", [])],
                links=_links(g),
            )
            for i, g in enumerate(recording["gpus"])
        ]
        self.ancestors: list[list[int]] | None = recording.get("ancestors")
        self.calls: dict[str, int] = {}
        """Topology calls made, by name (the agent reads the topology once)."""
        self.xids: queue.Queue[tuple[int, int]] = queue.Queue()
        self.initialised = False

    @classmethod
    def load(cls, name: str) -> FakeNvml:
        return cls(json.loads((DATA / name).read_text()))

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Gpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: Gpu | Mig) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: Gpu) -> bytes:
        return h.name.encode()  # older pynvml answers bytes

    def nvmlDeviceGetMigMode(self, h: Gpu) -> tuple[int, int]:
        return h.mig, h.mig

    def nvmlDeviceGetMemoryInfo(self, h: Gpu | Mig) -> SimpleNamespace:
        return SimpleNamespace(total=h.memory)

    def nvmlDeviceGetAttributes(self, h: Gpu | Mig) -> SimpleNamespace:
        if isinstance(h, Mig):
            return SimpleNamespace(
                multiprocessorCount=h.slices * 14, gpuInstanceSliceCount=h.slices
            )
        return SimpleNamespace(multiprocessorCount=h.sms, gpuInstanceSliceCount=0)

    def nvmlDeviceGetPciInfo(self, h: Gpu) -> SimpleNamespace:
        return SimpleNamespace(busId=h.bus.encode())

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Gpu) -> int:
        return 7 if h.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Gpu, j: int) -> Mig:
        if j >= len(h.migs):
            raise NVMLError_NotFound
        return h.migs[j]

    def nvmlDeviceGetGpuInstanceId(self, h: Mig) -> int:
        return h.gi

    def nvmlDeviceGetGpuInstanceById(self, h: Gpu, gi: int) -> Mig:
        return next(m for m in h.migs if m.gi == gi)

    def nvmlGpuInstanceGetInfo(self, gi: Mig) -> SimpleNamespace:
        return SimpleNamespace(placement=SimpleNamespace(start=gi.start, size=gi.slices))

    # topology
    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Gpu, b: Gpu) -> int:
        self._count("ancestor")
        if self.ancestors is None:
            raise NVMLError_NotSupported
        return self.ancestors[a.index][b.index]

    def nvmlDeviceGetNvLinkState(self, h: Gpu, link: int) -> int:
        self._count("state")
        if h.links is None:
            raise NVMLError_NotSupported
        return 1 if link < len(h.links) else 0

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h: Gpu, link: int) -> SimpleNamespace:
        assert h.links is not None
        assert link < len(h.links), "a disabled link has no far end"
        peer = h.links[link]
        bus = self.SWITCH_BUS if peer is None else self.gpus[peer].bus
        return SimpleNamespace(busId=bus[4:].lower().encode())  # as busIdLegacy spells it

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Gpu, link: int) -> int:
        assert h.links is not None
        assert link < len(h.links)
        return self.NVML_NVLINK_DEVICE_TYPE_GPU if h.links[link] is not None else 2

    # events
    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: Gpu, kind: int, events: object) -> None:
        return None

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> SimpleNamespace:
        try:
            index, xid = self.xids.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout from None
        return SimpleNamespace(device=self.gpus[index], eventData=xid)

    def nvmlEventSetFree(self, events: object) -> None:
        return None
