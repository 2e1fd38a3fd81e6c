"""The node's metrics on ``telemetry.metricsPort`` (9394): Prometheus text, produced by
OpenTelemetry instruments through its Prometheus reader.

Names are those users' dashboards already query (docs/compat.md, section 6; HAMi's device monitor),
plus Tessera's own:

- ``hami_host_gpu_memory_used_bytes``, ``hami_host_gpu_utilization_ratio`` (percent, as
  HAMi reports it) per device, from NVML;
- ``hami_vgpu_memory_limit_bytes``, ``hami_vgpu_memory_used_bytes``,
  ``hami_container_device_memory_bytes``, ``hami_container_device_utilization_ratio``
  per container and device, from the isolation library's shared accounting file of each
  container (``nodeAgent.isolation.cacheHostDir/<pod uid>_<container>/``);
- ``tessera_node_devices`` (by vendor, model, health), ``tessera_allocate_total`` (by
  resource and result) and ``tessera_admissions_waiting``;
- ``tessera_mps_daemon_up`` (1 or 0) and ``tessera_mps_clients`` per device, for the cards
  in ``mps`` mode only (each card's own daemon, services/node_agent/mps/reader.py, as the
  inventory carries it).

The accounting file is HAMi-core's ``shared_region_t`` (layout version 1.2, x86-64): a
header with the device UUIDs and limits, then 1,024 process slots with each process's
memory use and SM utilisation per device. A file of another layout is skipped, with one
warning, rather than misread.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from shared.core.model import DeviceInfo, PodRef, PodUID
from shared.metrics import Metrics, Reading

log = logging.getLogger(__name__)

# --- the accounting file -----------------------------------------------------------------

MAX_DEVICES = 16
MAX_PROCS = 1024
MAGIC = 19920718
VERSION = (1, 2)
_HEADER = struct.Struct("<iIIiQ32sQ")  # flag, major, minor, sm flag, owner, sem, device_num
UUIDS_AT = _HEADER.size  # 64
LIMITS_AT = UUIDS_AT + MAX_DEVICES * 96
SM_LIMITS_AT = LIMITS_AT + MAX_DEVICES * 8
PROCS_AT = SM_LIMITS_AT + MAX_DEVICES * 8
SLOT_SIZE = 8 + MAX_DEVICES * 64 + MAX_DEVICES * 8 + MAX_DEVICES * 48 + 8 + 8 + 16
"""pid and hostpid; ``device_memory_t used[16]`` (8 x u64 each); ``monitorused[16]``;
``device_util_t[16]`` (6 x u64 each); status (padded to 8); seqlock; 2 unused u64."""
USED_AT = 8
UTIL_AT = USED_AT + MAX_DEVICES * 64 + MAX_DEVICES * 8
REGION_SIZE = PROCS_AT + MAX_PROCS * SLOT_SIZE


@dataclass(frozen=True)
class DeviceAccount:
    """One container's use of one device, from the isolation library's accounting file."""

    uuid: str
    limit_bytes: int
    used_bytes: int
    sm_util: int


def read_accounting(data: bytes) -> list[DeviceAccount] | None:
    """The devices of one container's accounting region, or None when it is not a
    (complete, initialised, version 1.2) region."""
    if len(data) < PROCS_AT:
        return None
    flag, major, minor, _sm, _owner, _sem, count = _HEADER.unpack_from(data, 0)
    if flag != MAGIC or (major, minor) != VERSION or count > MAX_DEVICES:
        return None
    out = []
    for dev in range(count):
        raw = data[UUIDS_AT + dev * 96 : UUIDS_AT + (dev + 1) * 96]
        uuid = raw.split(b"\0", 1)[0].decode(errors="replace")
        (limit,) = struct.unpack_from("<Q", data, LIMITS_AT + dev * 8)
        used = util = 0
        for slot in range(MAX_PROCS):
            base = PROCS_AT + slot * SLOT_SIZE
            if base + SLOT_SIZE > len(data):
                break
            (pid,) = struct.unpack_from("<i", data, base)
            if pid == 0:
                continue
            # device_memory_t: context, module, data, offset, total, unused x3
            (total,) = struct.unpack_from("<Q", data, base + USED_AT + dev * 64 + 32)
            (sm,) = struct.unpack_from("<Q", data, base + UTIL_AT + dev * 48 + 16)
            used += total
            util += sm
        out.append(DeviceAccount(uuid, limit, used, util))
    return out


# --- the exporter ------------------------------------------------------------------------

DeviceUsage = Callable[[], Mapping[str, tuple[int, float]]]
"""UUID → (memory used in bytes, utilisation percent), read now."""


@dataclass(eq=False)
class NodeMetrics:
    """The node agent's metrics: device and per-container gauges read at each scrape."""

    metrics: Metrics
    """The process's registry (shared/metrics.py), scraped off the loop: it reads files."""
    node: str
    devices: Callable[[], tuple[DeviceInfo, ...]]
    usage: DeviceUsage
    cache_dir: Path
    pods: Callable[[], Mapping[PodUID, PodRef]]
    waiting: Callable[[], int]
    """Pods bound here whose kubelet has not taken their devices yet."""

    def __post_init__(self) -> None:
        m = self.metrics
        m.blocking = True
        gauges: list[tuple[str, str, Reading]] = [
            ("hami_host_gpu_memory_used_bytes", "Device memory in use (NVML).", self._host(0)),
            (
                "hami_host_gpu_utilization_ratio",
                "Device core utilisation in percent (NVML).",
                self._host(1),
            ),
            (
                "hami_vgpu_memory_limit_bytes",
                "A container's memory limit on a device.",
                self._limits,
            ),
            (
                "hami_vgpu_memory_used_bytes",
                "A container's memory use on a device (isolation library).",
                self._used,
            ),
            (
                "hami_container_device_memory_bytes",
                "A container's memory use on a device (isolation library).",
                self._used,
            ),
            (
                "hami_container_device_utilization_ratio",
                "A container's SM utilisation on a device, percent (isolation library).",
                self._util,
            ),
            ("tessera_node_devices", "Devices of this node.", self._inventory),
            (
                "tessera_mps_daemon_up",
                "The MPS control daemon of a card in mps mode answers (1) or not (0).",
                self._mps_up,
            ),
            (
                "tessera_mps_clients",
                "MPS client processes on a card in mps mode.",
                self._mps_clients,
            ),
            (
                "tessera_admissions_waiting",
                "Pods bound here whose kubelet has not taken their devices yet.",
                lambda: [(self.waiting(), {"node": self.node})],
            ),
        ]
        for name, text, read in gauges:
            m.gauge(name, text, read)
        self.allocations = m.counter(
            "tessera_allocate", "Allocate calls answered, by resource and result."
        )
        self._bad: set[Path] = set()
        self._usage: Mapping[str, tuple[int, float]] = {}
        self._containers: list[tuple[dict[str, str], DeviceAccount]] = []
        """One scrape's reading, shared by every instrument (``_read``): each read them
        again before, NVML twice and each file four times per scrape."""
        m.prepare.append(self._read)

    def _read(self) -> None:
        self._usage, self._containers = self.usage(), self.containers()

    # --- collection -------------------------------------------------------------------

    def _device_labels(self, d: DeviceInfo) -> dict[str, str]:
        return {
            "node": self.node,
            "deviceuuid": d.uuid,
            "deviceidx": str(d.index),
            "devicetype": d.model,
        }

    def _host(self, field: int) -> Reading:
        """A gauge of one field of NVML's reading (0: memory used, 1: utilisation)."""

        def observe() -> list[tuple[float, dict[str, str]]]:
            now = self._usage
            return [
                (now[d.uuid][field], self._device_labels(d))
                for d in self.devices()
                if d.uuid in now
            ]

        return observe

    def _inventory(self) -> list[tuple[float, dict[str, str]]]:
        counts: dict[tuple[str, str, bool], int] = {}
        for d in self.devices():
            key = (d.vendor, d.model, d.healthy)
            counts[key] = counts.get(key, 0) + 1
        return [
            (n, {"node": self.node, "vendor": v, "model": m, "healthy": str(h).lower()})
            for (v, m, h), n in sorted(counts.items())
        ]

    def _mps_up(self) -> list[tuple[float, dict[str, str]]]:
        return [(int(d.mps == "running"), self._device_labels(d)) for d in self.devices() if d.mps]

    def _mps_clients(self) -> list[tuple[float, dict[str, str]]]:
        return [(d.mps_clients, self._device_labels(d)) for d in self.devices() if d.mps]

    def containers(self) -> list[tuple[dict[str, str], DeviceAccount]]:
        """Every container's accounting on this node, with its labels."""
        out = []
        known = self.pods()
        for path in sorted(self.cache_dir.glob("*/*.cache")):
            uid, _, container = path.parent.name.partition("_")
            try:
                accounts = read_accounting(path.read_bytes())
            except OSError:
                continue
            if accounts is None:
                if path not in self._bad:
                    self._bad.add(path)
                    log.warning("%s is not an accounting region this agent reads", path)
                continue
            pod = known.get(PodUID(uid))
            for i, a in enumerate(accounts):
                labels = {
                    "node": self.node,
                    "podnamespace": pod.namespace if pod else "",
                    "podname": pod.name if pod else "",
                    "poduid": uid,
                    "ctrname": container,
                    "vdeviceid": str(i),
                    "deviceuuid": a.uuid,
                }
                out.append((labels, a))
        return out

    def _limits(self) -> list[tuple[float, dict[str, str]]]:
        return [(a.limit_bytes, labels) for labels, a in self._containers]

    def _used(self) -> list[tuple[float, dict[str, str]]]:
        return [(a.used_bytes, labels) for labels, a in self._containers]

    def _util(self) -> list[tuple[float, dict[str, str]]]:
        return [(a.sm_util, labels) for labels, a in self._containers]
