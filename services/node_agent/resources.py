"""The extended resources a node advertises for its devices, and which the kubelet asks
the device plugin about.

``capacity`` is what the Node shows (a simulated node patches it into its status; a real
node gets the registered resources from the device plugin's registration, and the
memory and core resources stay scheduler-only: the kubelet ignores a resource no node
advertises). ``count_resources`` lists, per kubelet resource, the devices behind it and
how many device IDs each offers: ``deviceSplitCount`` slots for a sliced card's count
names, one for a whole-count name, and for the resources counted in units (the channels
of shared/core/admission.py) one per unit, as Volcano's and MindCluster's device plugins
offer them: Volcano's gpu-share name one per ``gpuMemoryFactor`` MiB of the card's
memory (scaled as the ledger scales it), MindCluster's ``npu-core`` one per AI core.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import Config
from shared.core.admission import UNIT_CHANNELS, Channel
from shared.core.model import DeviceInfo, Vendor
from shared.core.spec import VnpuChip, names


@dataclass(frozen=True)
class CountResource:
    """One resource the device plugin registers with the kubelet."""

    name: str
    vendor: Vendor
    devices: tuple[tuple[DeviceInfo, int], ...]
    """Each device and its slots (device IDs)."""
    units: bool = False
    """The IDs count units (memory, AI cores), not devices."""

    @property
    def channel(self) -> Channel:
        """Which admission channel an Allocate of this resource comes through."""
        return UNIT_CHANNELS[self.vendor] if self.units else self.vendor


def ascend_chip(cfg: Config, device: DeviceInfo) -> VnpuChip | None:
    """The configured vNPU chip (``devices.vnpus``) of an Ascend card, by its chip name; None when
    none is configured."""
    return next((c for c in cfg.devices.vnpus if c.chip_name == device.chip), None)


def ascend_slots(chip: VnpuChip) -> int:
    """vNPUs one card can hold: its AI cores over the smallest template's."""
    smallest = min((t.ai_core for t in chip.templates if t.ai_core), default=chip.ai_core)
    return max(1, chip.ai_core // smallest)


def count_resources(cfg: Config, node: str, devices: tuple[DeviceInfo, ...]) -> list[CountResource]:
    """Every count resource of ``node``'s devices, in a stable order."""
    override = cfg.node_override(node)
    specs = cfg.devices
    found: dict[str, tuple[Vendor, bool, list[tuple[DeviceInfo, int]]]] = {}

    def add(resource: str, d: DeviceInfo, slots: int, units: bool = False) -> None:
        found.setdefault(resource, (d.vendor, units, []))[2].append((d, slots))

    for d in devices:
        if override is not None and override.filter_devices.excludes(d.uuid, d.index):
            continue  # filterDevices: never offered
        if d.vendor == "ascend":
            chip = ascend_chip(cfg, d)
            if chip is not None:
                add(chip.resource_name, d, ascend_slots(chip))
            if specs.mindcluster.enabled and d.chip == specs.mindcluster.chip_name:
                add(specs.mindcluster.resource_name, d, chip.ai_core if chip else 8, units=True)
            continue
        spec = specs.vendor(d.vendor)
        if spec is None or not spec.enabled:
            continue
        split = (override.device_split_count if override else None) or spec.device_split_count
        for name in names(spec.resource_count_name):
            add(name, d, split)
        for name in names(spec.resource_whole_count_name):
            add(name, d, 1)
        if d.vendor == "nvidia":
            scaling = (
                override.device_memory_scaling if override else None
            ) or spec.device_memory_scaling
            share = int(d.memory_mib * scaling) // spec.gpu_memory_factor
            for name in names(specs.nvidia.gpu_share_memory_name):
                add(name, d, share, units=True)
    return [
        CountResource(name, vendor, tuple(devs), units)
        for name, (vendor, units, devs) in sorted(found.items())
    ]


def capacity(cfg: Config, node: str, devices: tuple[DeviceInfo, ...]) -> dict[str, str]:
    """Every extended resource ``node`` advertises for these devices: the device IDs of
    each registered resource, and the memory and cores of the scheduler-only names."""
    totals: dict[str, int] = {
        r.name: sum(slots for _, slots in r.devices) for r in count_resources(cfg, node, devices)
    }

    def add(resource_names: tuple[str, ...], amount: int) -> None:
        for name in resource_names:
            totals[name] = totals.get(name, 0) + amount

    for d in devices:
        if d.vendor == "ascend":
            chip = ascend_chip(cfg, d)
            if chip is not None:
                add((chip.resource_memory_name,), d.memory_mib)
                add(names(chip.resource_core_name), 100)
            continue
        spec = cfg.devices.vendor(d.vendor)
        if spec is None or not spec.enabled:
            continue
        add(names(spec.resource_memory_name), int(d.memory_mib * spec.device_memory_scaling))
        add(names(spec.resource_memory_percentage_name), 100)
        add(names(spec.resource_core_name), int(d.cores * spec.device_core_scaling))
    return {k: str(v) for k, v in sorted(totals.items())}
