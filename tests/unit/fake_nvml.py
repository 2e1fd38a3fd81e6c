# ruff: noqa: N801, N802, N815, N818 (the names are pynvml's)
"""A stand-in for pynvml that replays a recorded inventory (tests never touch a real
card, and never change one's MIG mode).

A recording is JSON: per GPU its UUID, NVML name, memory (bytes), SM count, PCI bus id,
MIG mode and the MIG devices it runs (UUID, GPU-instance id, placement start, compute
slices, memory). ``FakeNvml`` answers the NVML calls the node agent makes from it, and
can create and destroy MIG instances on the recorded cards for the dynamic-MIG logic.
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
    pass


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


class FakeNvml:
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlEventTypeXidCriticalError = 8
    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
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
            )
            for i, g in enumerate(recording["gpus"])
        ]
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
