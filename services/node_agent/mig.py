"""Dynamic MIG: make a card run the geometry its grants name.

The allocator may grant an instance of a geometry the card does not run yet (it picks
among the model's ``knownMigGeometries``; the grant carries the geometry, its profiles
in placement order). Before that pod's Allocate, the node agent reconfigures the card:

1. nothing to do when the card already runs the geometry;
2. never on a card whose MIG mode is off (switching it needs a GPU reset: that is the
   operator's call), and never on a card any other pod holds an instance of;
3. otherwise destroy the instances that are there (compute instances first), and create
   one GPU instance per profile, in order, each at the lowest placement NVML offers that
   does not overlap those already made, with one compute instance spanning it.

``MigDriver`` is the NVML surface this needs; ``NvmlMig`` implements it with pynvml's
ctypes calls, and tests give a fake one.
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shared.core.model import ContainerGrant, DeviceInfo, DeviceUUID
from shared.core.spec import NvidiaSpec

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class MigError(RuntimeError):
    """The card cannot be given the geometry (and why)."""


@dataclass(frozen=True)
class GiProfile:
    """A MIG GPU-instance profile a card offers."""

    id: int
    slices: int
    memory_mib: int


@dataclass(frozen=True)
class Instance:
    """A MIG GPU instance that exists on a card."""

    handle: Any
    profile_id: int
    start: int
    size: int


class MigDriver(Protocol):
    """The MIG calls the agent makes (NVML on a real card; a fake in tests)."""

    def mig_enabled(self, card: str) -> bool:
        """Whether MIG mode is on now on ``card`` (by UUID); Tessera never switches it."""
        ...

    def profiles(self, card: str) -> list[GiProfile]:
        """The GPU-instance profiles ``card`` offers."""
        ...

    def placements(self, card: str, profile_id: int) -> list[tuple[int, int]]:
        """Where on ``card`` an instance of the profile may start: (start, size) slices."""
        ...

    def instances(self, card: str) -> list[Instance]:
        """The GPU instances ``card`` runs now."""
        ...

    def create(self, card: str, profile: GiProfile, start: int) -> None:
        """Make a GPU instance of ``profile`` at slice ``start``, with one compute
        instance spanning it."""
        ...

    def destroy(self, card: str, instance: Instance) -> None:
        """Remove ``instance``, its compute instances first."""
        ...


def profile_for(name: str, memory_mib: int, offered: Sequence[GiProfile]) -> GiProfile:
    """NVML's GPU-instance profile for a configured one (``3g.40gb``, 40192 MiB): the
    same compute slices and the nearest memory."""
    m = re.match(r"(\d+)g\.", name)
    if m is None:
        raise MigError(f"{name} is not a MIG profile name (<slices>g.<memory>gb)")
    slices = int(m.group(1))
    same = [p for p in offered if p.slices == slices]
    if not same:
        raise MigError(f"the card offers no {slices}-slice GPU instance for {name}")
    return min(same, key=lambda p: abs(p.memory_mib - memory_mib))


def reconfigure(
    driver: MigDriver,
    card: str,
    geometry: Sequence[str],
    spec: NvidiaSpec,
    model: str,
    in_use: bool,
) -> bool:
    """Make ``card`` run ``geometry`` (profile names in placement order); True if it
    changed anything. Raises ``MigError`` when it may not or cannot."""
    if not driver.mig_enabled(card):
        raise MigError(f"MIG mode is off on {card}; Tessera does not switch it (GPU reset)")
    offered = driver.profiles(card)
    memory = _configured_memory(spec, model)
    wanted = [profile_for(name, memory.get(name, 0), offered) for name in geometry]
    running = sorted(driver.instances(card), key=lambda i: i.start)
    if [i.profile_id for i in running] == [p.id for p in wanted]:
        return False
    if in_use:
        raise MigError(
            f"{card} runs another MIG geometry and a pod holds one of its instances: "
            "it is not reconfigured under a running pod"
        )
    # Plan first: a geometry that does not fit leaves the card as it was.
    taken: list[tuple[int, int]] = []
    plan: list[tuple[GiProfile, int]] = []
    for p in wanted:
        free = [
            (start, size)
            for start, size in sorted(driver.placements(card, p.id))
            if all(start + size <= s or s + z <= start for s, z in taken)
        ]
        if not free:
            raise MigError(f"{','.join(geometry)} does not fit on {card} (no room for {p.id})")
        taken.append(free[0])
        plan.append((p, free[0][0]))
    for instance in running:
        driver.destroy(card, instance)
    for p, start in plan:
        driver.create(card, p, start)
    log.info("%s now runs MIG geometry %s", card, ",".join(geometry))
    return True


@dataclass(frozen=True)
class Change:
    """A card to cut into ``geometry`` before a pod's Allocate."""

    card: str
    model: str
    geometry: tuple[str, ...]
    in_use: bool


def changes_for(
    grants: Sequence[ContainerGrant],
    devices: Mapping[DeviceUUID, DeviceInfo],
    others: Iterable[Sequence[ContainerGrant]],
) -> list[Change]:
    """The cards whose geometry must change for ``grants`` to be handed over: a MIG grant
    whose instance (profile at placement) the card does not run. ``others`` are the
    grants of the other pods on the node; a card one of them uses is ``in_use``."""
    used = {d.uuid for g in others for c in g for d in c.devices if d.mig_profile}
    out: dict[str, Change] = {}
    for c in grants:
        for d in c.devices:
            card = devices.get(d.uuid)
            if d.mig_profile is None or card is None or d.uuid in out:
                continue
            running = {(m.placement, m.profile) for m in card.mig_geometry if m.uuid}
            if (d.mig_placement, d.mig_profile) in running:
                continue
            if not d.mig_geometry:
                continue  # no geometry named: nothing to create it from
            out[d.uuid] = Change(
                d.uuid, card.model, tuple(d.mig_geometry.split(",")), d.uuid in used
            )
    return list(out.values())


def _configured_memory(spec: NvidiaSpec, model: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for known in spec.known_mig_geometries:
        if any(m.lower() in model.lower() for m in known.models):
            for geometry in known.allowed_geometries:
                for p in geometry.geometries:
                    out.setdefault(p.name, p.memory)
    return out


class NvmlMig:
    """``MigDriver`` over pynvml (its MIG calls take ctypes arrays)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def _handle(self, card: str) -> Any:
        return self.nvml.nvmlDeviceGetHandleByUUID(card)

    def mig_enabled(self, card: str) -> bool:
        """Whether the card's current MIG mode is enabled (a pending change does not count)."""
        current, _pending = self.nvml.nvmlDeviceGetMigMode(self._handle(card))
        return bool(current == self.nvml.NVML_DEVICE_MIG_ENABLE)

    def profiles(self, card: str) -> list[GiProfile]:
        """Every GPU-instance profile the card answers for; those it does not offer are skipped."""
        nvml, h = self.nvml, self._handle(card)
        out = []
        for pid in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pid)
            except nvml.NVMLError:
                continue  # not offered by this card
            out.append(GiProfile(int(info.id), int(info.sliceCount), int(info.memorySizeMB)))
        return out

    def placements(self, card: str, profile_id: int) -> list[tuple[int, int]]:
        """NVML's possible placements of the profile on the card (at most 8)."""
        nvml = self.nvml
        array = (nvml.c_nvmlGpuInstancePlacement_t * 8)()
        count = ctypes.c_uint(8)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            self._handle(card), profile_id, array, ctypes.byref(count)
        )
        return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]

    def instances(self, card: str) -> list[Instance]:
        """The card's GPU instances of every profile it offers, with their placements."""
        nvml, h = self.nvml, self._handle(card)
        out = []
        for p in self.profiles(card):
            array = (nvml.c_nvmlGpuInstance_t * 8)()
            count = ctypes.c_uint(8)
            nvml.nvmlDeviceGetGpuInstances(h, p.id, array, ctypes.byref(count))
            for i in range(count.value):
                info = nvml.nvmlGpuInstanceGetInfo(array[i])
                out.append(Instance(array[i], p.id, info.placement.start, info.placement.size))
        return out

    def create(self, card: str, profile: GiProfile, start: int) -> None:
        """A GPU instance at ``start`` and one shared-engine compute instance spanning its
        slices."""
        nvml = self.nvml
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, 0
        gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            self._handle(card), profile.id, ctypes.byref(placement)
        )
        ci = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi,
            _CI_PROFILE.get(profile.slices, 0),
            nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)

    def destroy(self, card: str, instance: Instance) -> None:
        """Destroy every compute instance of ``instance`` (of each profile), then the GPU
        instance."""
        nvml = self.nvml
        for cip in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            array = (nvml.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(8)
            try:
                nvml.nvmlGpuInstanceGetComputeInstances(
                    instance.handle, cip, array, ctypes.byref(count)
                )
            except nvml.NVMLError:
                continue
            for i in range(count.value):
                nvml.nvmlComputeInstanceDestroy(array[i])
        nvml.nvmlGpuInstanceDestroy(instance.handle)


_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
"""Compute-instance profile spanning a GPU instance of that many slices (NVML's
``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE``)."""
