"""The device ledger: every node's devices and every grant on them, with placement indexes.

The ledger is the allocator's cache of truth that lives in Kubernetes (grant annotations on
bound pods + node inventory). It is rebuilt from those on start, so it never persists
anything itself. It does no placement: :mod:`shared.core.placement` decides, and calls
:meth:`Ledger.grant` / :meth:`Ledger.release` to record.

State of one pod's grant::

    (absent) --grant()--> granted --release()--> (absent)
                 ^  idempotent: the same grant again is a no-op; release of an unknown pod
                 |  is a no-op, so replayed events cannot double-book or double-free.

A grant may name a node or device the ledger does not know yet (rebuild before the
inventory arrived): it is kept and applied when :meth:`set_node` brings the device.
Replacing a node's inventory re-applies every grant on that node to the new devices, so
usage always equals the sum of the grants that are in force.

A :class:`Statement` records the grants and releases made through it, and the tentative
device use of a trial, so a gang that does not fit, a trial placement and a preemption
plan are undone exactly, in reverse (Volcano's Statement).

Admission: on nodes whose kubelet asks Tessera's device plugin (``plugin_nodes``), a pod
granted for real is *admitting* until its kubelet has taken its devices; its admission
keys (shared/core/admission.py) are kept in ``admitting`` so no second pod of the same
key is placed there meanwhile. A release clears them.

Indexes: for each device pool (vendor, sharing mode, chip) every node sits in one bucket
keyed by the largest free memory of any usable device in that pool (GiB granularity).
Placement walks the buckets from the smallest one that could fit upwards (binpack) or
from the top down (spread), so it looks at a handful of nodes, not all of them; a
bitmask of non-empty buckets skips the empty ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.core.admission import AdmissionKey, keys_of_grants
from shared.core.hosts import NodeSpec, PodSpec
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceInfo,
    GangKey,
    NodeName,
    PodRef,
    PodUID,
    SharingMode,
    Vendor,
    gpu_type,
)
from shared.core.nodefit import HostNode, Hosts
from shared.core.spec import DeviceSpecs, KnownMigGeometries, NodeOverride, VendorSpec

PoolKey = tuple[str, str, str]
"""(vendor, sharing mode, chip): devices that serve the same kind of request."""

BUCKET_SHIFT = 10  # 1 GiB rows
CORE_BUCKETS = 11  # free cores 0-9, 10-19, ..., 100+
UNLIMITED_SLOTS = 1 << 30


@dataclass(frozen=True, slots=True)
class MigSlot:
    """One instance of a MIG geometry: its profile, memory and position in the geometry."""

    profile: str
    memory_mib: int
    placement: int


def geometry_id(slots: Iterable[MigSlot]) -> str:
    """A geometry's name: its profiles in placement order (``2g.20gb,2g.20gb,...``)."""
    return ",".join(s.profile for s in slots)


@dataclass(frozen=True, slots=True)
class MigLayout:
    """The alternative geometries a card's model allows (each a tuple of instance slots)."""

    alternatives: tuple[tuple[MigSlot, ...], ...]
    largest: int
    """Memory of the largest instance of any geometry."""

    @property
    def ids(self) -> tuple[str, ...]:
        """Each geometry's name (:func:`geometry_id`), in the order of ``alternatives``."""
        return tuple(geometry_id(alt) for alt in self.alternatives)


def mig_layout(model: str, known: Sequence[KnownMigGeometries]) -> MigLayout | None:
    """The geometries of the first ``knownMigGeometries`` entry naming ``model``."""
    lowered = model.lower()
    for entry in known:
        if any(m.lower() in lowered for m in entry.models):
            alts = []
            for geometry in entry.allowed_geometries:
                slots: list[MigSlot] = []
                for profile in geometry.geometries:
                    for _ in range(profile.count):
                        slots.append(MigSlot(profile.name, profile.memory, len(slots)))
                alts.append(tuple(slots))
            largest = max((s.memory_mib for alt in alts for s in alt), default=0)
            return MigLayout(tuple(alts), largest)
    return None


class Dev:
    """One device's capacity (after node overrides) and its live usage."""

    __slots__ = (
        "ai_cores",
        "ai_cpus",
        "chip",
        "cordoned",
        "healthy",
        "index",
        "info",
        "mig",
        "mig_alt",
        "mig_reported",
        "mig_used",
        "mode",
        "model",
        "model_lc",
        "mps_ready",
        "mps_user",
        "node",
        "numa",
        "phys_mem",
        "pool",
        "slots",
        "total_cores",
        "total_mem",
        "used_ai_cores",
        "used_ai_cpus",
        "used_cores",
        "used_mem",
        "used_slots",
        "uuid",
        "vendor",
    )

    def __init__(
        self,
        node: NodeState,
        info: DeviceInfo,
        *,
        mode: SharingMode,
        slots: int,
        mem_scaling: float,
        core_scaling: float,
        mig: MigLayout | None,
    ) -> None:
        self.node = node
        self.info = info
        self.uuid = info.uuid
        self.index = info.index
        self.vendor: Vendor = info.vendor
        self.model = info.model
        self.model_lc = gpu_type(info.model)
        self.numa = info.numa
        self.chip = info.chip or ""
        self.mode: SharingMode = mode
        self.healthy = info.healthy
        self.cordoned = False
        self.phys_mem = info.memory_mib
        self.total_mem = int(info.memory_mib * mem_scaling)
        self.total_cores = int(info.cores * core_scaling)
        self.slots = slots
        self.ai_cores = info.ai_cores
        self.ai_cpus = info.ai_cpus
        self.mig = mig if mode == "mig" else None
        self.mig_reported = self._reported_alt(info)
        self.mig_alt = self.mig_reported
        self.mig_used: set[int] = set()
        self.used_mem = 0
        self.used_cores = 0
        self.used_slots = 0
        self.used_ai_cores = 0
        self.used_ai_cpus = 0
        self.pool: PoolKey = (self.vendor, mode, self.chip)
        self.mps_ready = info.mps == "running"
        """(Mode ``mps``) the card's MPS daemon was reported running: a card whose state is
        ``unavailable`` or was never reported is offered to no MPS pod."""
        self.mps_user: int | None = None
        """The UID of the MPS clients on it while ``used_slots`` (mode ``mps``)."""

    def _reported_alt(self, info: DeviceInfo) -> int:
        """The geometry the card runs now, added as an alternative if unknown."""
        if self.mig is None or not info.mig_geometry:
            return -1
        reported = sorted((i.profile, i.memory_mib) for i in info.mig_geometry)
        for i, alt in enumerate(self.mig.alternatives):
            if sorted((s.profile, s.memory_mib) for s in alt) == reported:
                return i
        slots = tuple(
            MigSlot(i.profile, i.memory_mib, n)
            for n, i in enumerate(sorted(info.mig_geometry, key=lambda x: x.placement))
        )
        largest = max(self.mig.largest, *(s.memory_mib for s in slots))
        self.mig = MigLayout((*self.mig.alternatives, slots), largest)
        return len(self.mig.alternatives) - 1

    @property
    def usable(self) -> bool:
        """Healthy and not cordoned: the device may take a new grant if it has room."""
        return self.healthy and not self.cordoned

    def mem_key(self) -> int:
        """Free memory a new task could get here, or -1 when nothing more fits."""
        if not self.healthy or self.cordoned or self.used_slots >= self.slots:
            return -1
        if self.node.host.full:
            return -1
        mig = self.mig
        if mig is not None:
            if self.mig_alt < 0:
                return mig.largest
            free = [
                s.memory_mib
                for s in mig.alternatives[self.mig_alt]
                if s.placement not in self.mig_used
            ]
            return max(free, default=-1)
        if self.used_cores >= self.total_cores and self.total_cores > 0:
            return -1
        return self.total_mem - self.used_mem

    def core_key(self) -> int:
        """Free cores for the index; devices whose pools slice no cores count as full."""
        if self.mig is not None or self.mode == "vnpu" or not self.total_cores:
            return 100
        return self.total_cores - self.used_cores

    def free_fraction(self) -> float:
        """The share of this device a new task could still use (0..1), for fragmentation."""
        if not self.healthy or self.cordoned or self.used_slots >= self.slots:
            return 0.0
        mem = (self.total_mem - self.used_mem) / self.total_mem if self.total_mem else 1.0
        if self.total_cores:
            cores = (self.total_cores - self.used_cores) / self.total_cores
            mem = min(mem, cores)
        return max(0.0, min(1.0, mem))

    def grant(self, **fields: Any) -> DeviceGrant:
        """A grant on this device: its identity plus ``fields`` (memory, cores, ...)."""
        return DeviceGrant(
            uuid=self.uuid, index=self.index, vendor=self.vendor, model=self.model, **fields
        )

    def apply(self, grant: DeviceGrant, sign: int) -> None:
        """Add (``sign=1``) or remove (``-1``) one grant's usage: the only place usage moves.

        An exclusive grant takes the whole device whatever the scaling, so nothing else
        fits beside it.
        """
        if grant.exclusive:
            self.used_mem += sign * self.total_mem
            self.used_cores += sign * self.total_cores
        else:
            self.used_mem += sign * grant.memory_mib
            self.used_cores += sign * grant.cores
        if sign > 0 and not self.used_slots:
            self.mps_user = grant.mps_user
        self.used_slots += sign
        self.used_ai_cores += sign * grant.ai_cores
        self.used_ai_cpus += sign * grant.ai_cpus
        if grant.mig_placement is not None and self.mig is not None:
            if sign > 0:
                if not self.mig_used:
                    self.mig_alt = self._alt_of(grant)
                self.mig_used.add(grant.mig_placement)
            else:
                self.mig_used.discard(grant.mig_placement)
                if not self.mig_used:
                    self.mig_alt = self.mig_reported

    def _alt_of(self, grant: DeviceGrant) -> int:
        """The geometry a MIG grant implies; the reported one wins when it matches."""
        assert self.mig is not None
        order = list(range(len(self.mig.alternatives)))
        if self.mig_reported >= 0:
            order.remove(self.mig_reported)
            order.insert(0, self.mig_reported)
        for i in order:
            alt = self.mig.alternatives[i]
            place = grant.mig_placement
            fits = (
                place is not None and place < len(alt) and alt[place].profile == grant.mig_profile
            )
            if fits and grant.mig_geometry in (None, geometry_id(alt)):
                return i
        return self.mig_alt


def sharing_mode(info: DeviceInfo, override: NodeOverride | None) -> SharingMode:
    """How a device is shared on its node: as reported, or as the node's override
    (``operatingMode``) sets it where the vendor allows that mode. Ascend chips use hard
    vNPU templates unless the node is set to software slicing."""
    mode: SharingMode = "vnpu" if info.vendor == "ascend" else info.mode
    wanted = override.operating_mode if override is not None else None
    if wanted is not None and (
        (info.vendor == "nvidia" and wanted != "vnpu")
        or (info.vendor == "ascend" and wanted in ("hami-core", "vnpu"))
    ):
        mode = wanted
    return mode


def node_kind(devs: Sequence[Dev]) -> tuple[str, int]:
    """A node's kind in a pool: its first device's GPU type (lower case) and how many
    devices it has there. FGD's measure weighs nodes of one kind alike for the same free
    shares (shared/core/policy.py ``Tables``)."""
    return (devs[0].model_lc if devs else "", len(devs))


class NodeState:
    """One node: its devices (after overrides), the pools they belong to, and its host
    side (spec and pods, shared/core/nodefit.py)."""

    __slots__ = ("by_uuid", "devices", "host", "name", "pools")

    def __init__(self, name: NodeName, host: HostNode | None = None) -> None:
        self.name = name
        self.devices: list[Dev] = []
        self.by_uuid: dict[str, Dev] = {}
        self.pools: dict[PoolKey, list[Dev]] = {}
        self.host = host if host is not None else HostNode(name)


class PoolIndex:
    """The usable devices of one pool in a grid of (free memory, free cores) cells.

    A device sits in cell (free MiB >> 10, min(free cores // 10, 10)); one bitmask per core
    column says which memory rows are non-empty. A walk for (memory M, cores C) ORs the
    columns >= C, then visits rows from M upwards (binpack: tightest first, newest device
    first) or from the top down (spread: emptiest first, oldest first), and yields only
    devices whose exact free memory and cores suffice. Devices with nothing left (no slot,
    cores used up, unhealthy, cordoned) are not in the grid at all.
    """

    __slots__ = ("cells", "kinds", "masks", "max_total", "min_phys", "min_total", "where")

    def __init__(self) -> None:
        self.cells: dict[int, dict[Dev, None]] = {}
        self.masks = [0] * CORE_BUCKETS
        self.where: dict[Dev, tuple[int, int, int]] = {}
        self.min_total = 0
        self.max_total = 0
        self.min_phys = 0
        self.kinds: dict[tuple[str, int], int] = {}
        """Nodes of the pool by kind (``node_kind``: GPU type and device count), for the
        fragmentation guard's window (shared/core/plugins/fragmentation_guard.py)."""

    def put(self, dev: Dev) -> None:
        """(Re)place ``dev`` by its current free capacity; it goes last in its cell."""
        mem = dev.mem_key()
        if mem < 0:
            self.remove(dev)
            return
        cores = dev.core_key()
        row = mem >> BUCKET_SHIFT
        col = min(cores // 10, CORE_BUCKETS - 1)
        cid = row * CORE_BUCKETS + col
        old = self.where.get(dev)
        if old is not None and old[0] == cid:  # same cell: only move it last
            cell = self.cells[cid]
            del cell[dev]
            cell[dev] = None
            if old[1] != mem or old[2] != cores:
                self.where[dev] = (cid, mem, cores)
            return
        self.remove(dev)
        target = self.cells.get(cid)
        if target is None:
            target = self.cells[cid] = {}
        target[dev] = None
        self.masks[col] |= 1 << row
        self.where[dev] = (cid, mem, cores)

    def remove(self, dev: Dev) -> None:
        """Take ``dev`` out of its cell (the cell and its mask bit go when emptied); a device not
        indexed is ignored."""
        old = self.where.pop(dev, None)
        if old is not None:
            cell = self.cells[old[0]]
            del cell[dev]
            if not cell:
                del self.cells[old[0]]
                row, col = divmod(old[0], CORE_BUCKETS)
                self.masks[col] &= ~(1 << row)

    def walk(
        self,
        min_mem: int,
        min_cores: int,
        descending: bool,
        seen: set[str],
        skip: AbstractSet[str] = frozenset(),
    ) -> Iterator[Dev]:
        """Of each node not in ``seen`` that has a device with at least ``min_mem`` MiB
        and ``min_cores`` free, the first such device in policy order, unless the node
        is in ``skip``; each node met joins ``seen`` (a walk of several pools passes the
        nodes met already). Telling a node's other devices here, not in the caller,
        saves a generator step per device: a window of 16 nodes is a walk of hundreds
        of devices; and a node in ``skip`` (one the pod's filters rule out) costs a set
        lookup, not a step.

        The cells are read lazily: stop iterating before changing the ledger.
        """
        lo_row = max(min_mem, 0) >> BUCKET_SHIFT
        lo_col = min(max(min_cores, 0) // 10, CORE_BUCKETS - 1)
        cols = range(lo_col, CORE_BUCKETS)
        combined = 0
        for col in cols:
            combined |= self.masks[col]
        where = self.where
        cells = self.cells
        if descending:
            rows = combined
            while rows:
                row = rows.bit_length() - 1
                if row < lo_row:
                    return
                rows ^= 1 << row
                for col in reversed(cols):
                    cell = cells.get(row * CORE_BUCKETS + col)
                    if cell:
                        for dev in cell:
                            name = dev.node.name
                            if name in seen:
                                continue  # most of a walk: the node's other devices
                            _, mem, cores = where[dev]
                            if mem >= min_mem and cores >= min_cores:
                                seen.add(name)
                                if name not in skip:
                                    yield dev
            return
        rows = combined >> lo_row
        while rows:
            low = rows & -rows
            row = lo_row + low.bit_length() - 1
            rows ^= low
            for col in cols:
                cell = cells.get(row * CORE_BUCKETS + col)
                if cell:
                    for dev in reversed(cell):
                        name = dev.node.name
                        if name in seen:
                            continue
                        _, mem, cores = where[dev]
                        if mem >= min_mem and cores >= min_cores:
                            seen.add(name)
                            if name not in skip:
                                yield dev

    def __len__(self) -> int:
        return len(self.where)


@dataclass(frozen=True, slots=True)
class PodGrant:
    """Everything one pod holds."""

    pod: PodRef
    node: NodeName
    containers: tuple[ContainerGrant, ...]
    group: GangKey | None = None
    """The PodGroup the pod belongs to (``vgpu-podgroup-policy: spread`` avoids its cards)."""
    spec: PodSpec | None = None
    """What node filters read of the pod: its requests, ports and labels count on the
    node while it holds the grant (shared/core/nodefit.py)."""

    def device_grants(self) -> Iterator[DeviceGrant]:
        """What the pod books: every container's devices but an init container's that
        reuse the app containers' (``ContainerGrant.reuses``)."""
        for c in self.containers:
            if not c.reuses:
                yield from c.devices


class Ledger:
    """Nodes, devices and grants; the single source the placement core reads and writes."""

    def __init__(
        self,
        specs: DeviceSpecs,
        overrides: Mapping[str, NodeOverride] | None = None,
    ) -> None:
        self.specs = specs
        self.overrides = dict(overrides or {})
        self.nodes: dict[NodeName, NodeState] = {}
        self.pools: dict[PoolKey, PoolIndex] = {}
        self.pods: dict[PodUID, PodGrant] = {}
        self.node_pods: dict[NodeName, set[PodUID]] = {}
        self.group_devices: dict[GangKey, dict[str, int]] = {}
        self._mig_cache: dict[str, MigLayout | None] = {}
        self.plugin_nodes: set[NodeName] = set()
        """Nodes whose kubelet asks Tessera's device plugin (see shared/core/admission.py)."""
        self.admitting: dict[NodeName, dict[AdmissionKey, PodUID]] = {}
        """On those nodes, the admission keys of pods granted and not yet admitted."""
        self.hosts = Hosts()
        """Every node's spec and every pod on a node, of any scheduler."""
        self.trial_uses = 0
        """Device uses of open trials (``Statement.use``): no grant may happen meanwhile."""

    # --- inventory -------------------------------------------------------------------

    def _vendor_spec(self, vendor: Vendor) -> VendorSpec | None:
        return self.specs.vendor(vendor)

    def _device(self, node: NodeState, info: DeviceInfo, override: NodeOverride | None) -> Dev:
        spec = self._vendor_spec(info.vendor)
        split = spec.device_split_count if spec else 10
        mem_scaling = spec.device_memory_scaling if spec else 1.0
        core_scaling = spec.device_core_scaling if spec else 1.0
        mode = sharing_mode(info, override)
        if override is not None:
            split = override.device_split_count or split
            mem_scaling = override.device_memory_scaling or mem_scaling
            core_scaling = override.device_core_scaling or core_scaling
        if info.vendor == "ascend":
            chip = next((c for c in self.specs.vnpus if c.chip_name == info.chip), None)
            if chip is not None:
                # Templates partition the chip's full capacity (two vir04 fill a 310P3);
                # a whole card or a software slice gets what is allocatable.
                info = msgspec.structs.replace(
                    info,
                    ai_cores=info.ai_cores or chip.ai_core,
                    ai_cpus=info.ai_cpus or chip.ai_cpu,
                    memory_mib=chip.memory_capacity if mode == "vnpu" else info.memory_mib,
                )

        mig = None
        slots = split
        if mode == "mig":
            if info.model not in self._mig_cache:
                self._mig_cache[info.model] = mig_layout(
                    info.model, self.specs.nvidia.known_mig_geometries
                )
            mig = self._mig_cache[info.model]
            slots = UNLIMITED_SLOTS
        elif mode == "vnpu":
            slots = UNLIMITED_SLOTS  # templates are limited by AI cores and memory
        return Dev(
            node,
            info,
            mode=mode,
            slots=slots,
            mem_scaling=mem_scaling,
            core_scaling=core_scaling,
            mig=mig,
        )

    def set_node(
        self,
        name: NodeName,
        devices: Sequence[DeviceInfo],
        cordoned: Iterable[str] = (),
    ) -> None:
        """Add a node or replace its inventory; grants on it are re-applied to the new devices.

        Devices filtered by the node's override (``filterDevices``) are left out.
        """
        override = self.overrides.get(name)
        old = self.nodes.get(name)
        if old is not None:
            self._unindex(old)
        node = NodeState(name, self.hosts.node(name))
        blocked = set(cordoned)
        for info in devices:
            if override is not None and override.filter_devices.excludes(info.uuid, info.index):
                continue
            dev = self._device(node, info, override)
            dev.cordoned = info.uuid in blocked
            node.devices.append(dev)
            node.by_uuid[dev.uuid] = dev
            node.pools.setdefault(dev.pool, []).append(dev)
        self.nodes[name] = node
        for uid in self.node_pods.get(name, ()):
            self._apply(self.pods[uid], 1, node, groups=False)
        self._index(node)

    def set_cordoned(self, name: NodeName, uuids: Iterable[str]) -> None:
        """Devices listed (``hami.io/device-cordon``, unhealthy ids) take no new work."""
        node = self.nodes.get(name)
        if node is None:
            return
        blocked = set(uuids)
        for dev in node.devices:
            dev.cordoned = dev.uuid in blocked
        self.reindex(node.devices)

    def remove_node(self, name: NodeName) -> list[PodUID]:
        """Forget a node's devices (its agent is gone or refused); returns the pods that
        still hold grants on it (kept, unapplied). A node whose Node object is known
        stays, with no devices: it still takes pods that ask for none."""
        node = self.nodes.pop(name, None)
        if node is not None:
            self._unindex(node)
            if node.host.spec is not None:
                self.nodes[name] = NodeState(name, node.host)
        self.set_plugin_node(name, False)
        return sorted(self.node_pods.get(name, ()))

    def set_spec(self, spec: NodeSpec) -> None:
        """A node's Node object (labels, taints, allocatable, cordon); a node with no
        devices known yet is added without any."""
        self.hosts.set_spec(spec)
        name = NodeName(spec.name)
        if name not in self.nodes:
            self.nodes[name] = NodeState(name, self.hosts.node(name))
        self.refile()

    def observe(self, spec: PodSpec) -> None:
        """A pod with this spec is about to be placed (see ``Hosts.observe``)."""
        self.hosts.observe(spec)
        self.refile()

    def forget_node(self, name: NodeName) -> None:
        """The Node object is gone: its devices and spec with it (pods stay counted
        until they go)."""
        self.hosts.drop_spec(name)
        self.remove_node(name)
        self.nodes.pop(name, None)

    def _index(self, node: NodeState) -> None:
        for pool, devs in node.pools.items():
            index = self.pools.get(pool)
            if index is None:
                index = self.pools[pool] = PoolIndex()
            totals = [d.total_mem for d in devs]
            index.min_total = min(index.min_total or min(totals), min(totals))
            index.max_total = max(index.max_total, max(totals))
            phys = min(d.phys_mem for d in devs)
            index.min_phys = min(index.min_phys or phys, phys)

            for dev in devs:
                index.put(dev)
            kind = node_kind(devs)
            index.kinds[kind] = index.kinds.get(kind, 0) + 1

    def _unindex(self, node: NodeState) -> None:
        for pool, devs in node.pools.items():
            index = self.pools[pool]
            for dev in devs:
                index.remove(dev)
            kind = node_kind(devs)
            left = index.kinds.get(kind, 0) - 1
            if left > 0:
                index.kinds[kind] = left
            else:
                index.kinds.pop(kind, None)

    def reindex(self, devs: Iterable[Dev]) -> None:
        """Re-file the devices whose usage changed, with every device of their node in the
        same pool: the node moves last in each cell, so cell order is node recency, and
        binpack walks the newest node first (keeps filling it), spread the oldest first."""
        done: set[tuple[str, PoolKey]] = set()
        for dev in devs:
            key = (dev.node.name, dev.pool)
            if key in done:
                continue
            done.add(key)
            index = self.pools[dev.pool]
            for sibling in dev.node.pools[dev.pool]:
                index.put(sibling)

    # --- grants ----------------------------------------------------------------------

    def _apply(
        self, grant: PodGrant, sign: int, node: NodeState | None, *, groups: bool = True
    ) -> list[Dev]:
        """Move device usage by one grant; ``groups`` also moves the PodGroup's card counts
        (not when an inventory replacement re-applies grants that are already counted)."""
        touched: list[Dev] = []
        group = self.group_devices.setdefault(grant.group, {}) if grant.group and groups else None

        for dg in grant.device_grants():
            dev = node.by_uuid.get(dg.uuid) if node is not None else None
            if dev is not None:
                dev.apply(dg, sign)
                touched.append(dev)
            if group is not None:
                count = group.get(dg.uuid, 0) + sign
                if count > 0:
                    group[dg.uuid] = count
                else:
                    group.pop(dg.uuid, None)
        if group is not None and not group and grant.group:
            del self.group_devices[grant.group]
        return touched

    def grant(self, grant: PodGrant, *, admitting: bool = False) -> bool:
        """Record a pod's grant; False (and no change) if the pod already holds this one.

        A different grant for a pod that holds one replaces it (the old is released
        first), so a replayed or corrected decision never double-books. ``admitting``:
        a new placement, whose kubelet has yet to take the devices (on plugin nodes its
        admission keys are held until :meth:`admitted`).
        """
        assert not self.trial_uses, "a trial is open: discard it before granting"
        held = self.pods.get(grant.pod.uid)
        if held is not None:
            if held == grant:
                return False
            self.release(grant.pod.uid)
        self.pods[grant.pod.uid] = grant
        self.node_pods.setdefault(grant.node, set()).add(grant.pod.uid)
        self.reindex(self._apply(grant, 1, self.nodes.get(grant.node)))
        if grant.spec is not None:
            self.hosts.add_pod(grant.pod.uid, grant.node, grant.spec)
            self.refile()
        if admitting and grant.node in self.plugin_nodes:
            busy = self.admitting.setdefault(grant.node, {})
            for key in keys_of_grants(grant.containers):
                busy[key] = grant.pod.uid
        return True

    def release(self, uid: PodUID) -> PodGrant | None:
        """Return a pod's devices; None if it held nothing (release is idempotent)."""
        assert not self.trial_uses, "a trial is open: discard it before releasing"
        grant = self.pods.pop(uid, None)
        if grant is None:
            return None
        pods = self.node_pods.get(grant.node)
        if pods is not None:
            pods.discard(uid)
            if not pods:
                del self.node_pods[grant.node]
        self.reindex(self._apply(grant, -1, self.nodes.get(grant.node)))
        self.admitted(uid, grant.node)
        if self.hosts.remove_pod(uid) is not None:
            self.refile()
        return grant

    def refile(self) -> None:
        """Re-file the devices of nodes whose host fullness changed (see nodefit.Hosts), in
        name order: the order decides which of equal nodes comes first in the index, and
        a set's order follows string hashing, which differs per process."""
        refill = self.hosts.refill
        if refill:
            nodes = [self.nodes[n] for n in sorted(refill) if n in self.nodes]
            refill.clear()
            self.reindex(d for node in nodes for d in node.devices)

    def respec(self, uid: PodUID, spec: PodSpec) -> None:
        """A held pod's node-fit spec changed (its labels, or it is being deleted): its
        devices and admission stay as they are."""
        held = self.pods.get(uid)
        if held is None or held.spec == spec:
            return
        self.hosts.remove_pod(uid)
        self.hosts.add_pod(uid, held.node, spec)
        self.pods[uid] = dataclasses.replace(held, spec=spec)

    def admitted(self, uid: PodUID, node: NodeName) -> bool:
        """The pod's kubelet took its devices (or it is gone): its keys are free. True if
        it held any."""
        busy = self.admitting.get(node)
        if not busy:
            return False
        mine = [k for k, holder in busy.items() if holder == uid]
        for key in mine:
            del busy[key]
        return bool(mine)

    def set_plugin_node(self, name: NodeName, plugin: bool) -> None:
        """Whether the node's kubelet asks Tessera's device plugin (its inventory says)."""
        if plugin:
            self.plugin_nodes.add(name)
        else:
            self.plugin_nodes.discard(name)
            self.admitting.pop(name, None)

    def statement(self, parent: Statement | None = None) -> Statement:
        """A new transaction on this ledger (see :class:`Statement`)."""
        return Statement(self, parent)

    @classmethod
    def rebuild(
        cls,
        specs: DeviceSpecs,
        overrides: Mapping[str, NodeOverride] | None,
        inventory: Mapping[NodeName, Sequence[DeviceInfo]],
        grants: Iterable[PodGrant],
    ) -> Ledger:
        """A ledger from node inventories and the grants of bound pods (allocator start)."""
        ledger = cls(specs, overrides)
        for name, devices in inventory.items():
            ledger.set_node(name, devices)
        for grant in grants:
            ledger.grant(grant)
        return ledger

    # --- reading ---------------------------------------------------------------------

    def snapshot(self) -> tuple[object, ...]:
        """A comparable picture of all usage and grants (tests compare two of these)."""
        devices = tuple(
            (
                name,
                d.uuid,
                d.used_mem,
                d.used_cores,
                d.used_slots,
                d.used_ai_cores,
                d.used_ai_cpus,
                d.mig_alt,
                tuple(sorted(d.mig_used)),
                d.cordoned,
                self.pools[d.pool].where.get(d),
            )
            for name, node in sorted(self.nodes.items())
            for d in node.devices
        )
        pods = tuple(sorted((uid, g) for uid, g in self.pods.items()))
        groups = tuple(sorted((g, tuple(sorted(c.items()))) for g, c in self.group_devices.items()))
        admitting = tuple(
            sorted((n, tuple(sorted(keys.items()))) for n, keys in self.admitting.items() if keys)
        )
        hosts = tuple(
            sorted(
                (n, h.count, tuple(sorted(h.requested.items())), tuple(sorted(h.pods)))
                for n, h in self.hosts.nodes.items()
            )
        )
        return devices, pods, groups, admitting, hosts

    def device_count(self) -> int:
        """Devices on every node of the ledger."""
        return sum(len(n.devices) for n in self.nodes.values())


_GRANT, _RELEASE, _USE, _UNDO = 0, 1, 2, 3


class Statement:
    """A transaction on the ledger: what is done through it can be undone exactly.

    ``grant`` and ``release`` go to the ledger at once (later placements in the same
    transaction see them) and are recorded; ``use`` applies a device grant tentatively,
    with no pod and no re-indexing (a trial on one node: a pod's second container must
    see what its first took); ``undo`` records how to give back what a plugin holds
    beside the ledger for a placement. ``commit`` keeps the grants and releases; ``discard``
    undoes every step in reverse order, restoring the ledger to its state before the
    first (a property test checks it). Leaving a ``with`` block without ``commit``
    discards. A trial is discarded, never committed, and nothing is granted or released
    while one is open (the ledger asserts it: the index would file devices by amounts
    about to vanish).

    States::

        open --commit()--> committed (steps kept)
        open --discard() / leaving the block--> discarded (ledger as before)
    """

    __slots__ = ("ledger", "parent", "steps")

    def __init__(self, ledger: Ledger, parent: Statement | None = None) -> None:
        self.ledger = ledger
        self.parent = parent
        """An enclosing statement: a commit hands the steps to it, so discarding the
        parent undoes them too (a gang placed inside a preemption plan's trial)."""
        self.steps: list[tuple[int, Any, Any]] = []

    def grant(self, grant: PodGrant, *, admitting: bool = False) -> bool:
        """``Ledger.grant`` inside the transaction."""
        ledger = self.ledger
        held = ledger.pods.get(grant.pod.uid)
        was_admitting = held is not None and self._admitting(held)
        if not ledger.grant(grant, admitting=admitting):
            return False
        self.steps.append((_GRANT, grant, (held, was_admitting)))
        return True

    def release(self, uid: PodUID) -> PodGrant | None:
        """``Ledger.release`` inside the transaction."""
        ledger = self.ledger
        held = ledger.pods.get(uid)
        was_admitting = held is not None and self._admitting(held)
        grant = ledger.release(uid)
        if grant is not None:
            self.steps.append((_RELEASE, grant, was_admitting))
        return grant

    def use(self, dev: Dev, grant: DeviceGrant) -> None:
        """Take ``grant`` on ``dev`` tentatively (a trial; see the class docstring)."""
        dev.apply(grant, 1)
        self.ledger.trial_uses += 1
        self.steps.append((_USE, dev, grant))

    def undo(self, step: Callable[[], None]) -> None:
        """Record what gives back something held beside the ledger for this transaction
        (a plugin's Unreserve: shared/core/plugins/dynamic_resources.py); a discard calls
        it in its turn, a commit keeps it with the grants."""
        self.steps.append((_UNDO, step, None))

    def _admitting(self, grant: PodGrant) -> bool:
        busy = self.ledger.admitting.get(grant.node)
        return busy is not None and grant.pod.uid in busy.values()

    def commit(self) -> None:
        """Keep what was done: into the enclosing statement when there is one (its discard undoes it
        too), else for good. A trial's ``use`` is never committed."""
        assert all(kind != _USE for kind, _, _ in self.steps), "a trial is never committed"
        if self.parent is not None:
            self.parent.steps.extend(self.steps)
        self.steps.clear()

    def discard(self) -> None:
        """Undo every step in reverse order, trial uses included: the ledger is as it was before the
        first."""
        ledger = self.ledger
        steps, self.steps = self.steps, []
        used: list[Dev] = []  # counted only: the index never saw a trial's use
        for kind, subject, undo in reversed(steps):
            if kind == _USE:
                subject.apply(undo, -1)
                used.append(subject)
            elif kind == _UNDO:
                subject()
            elif kind == _RELEASE:
                ledger.grant(subject, admitting=undo)
            else:
                held, was_admitting = undo
                ledger.release(subject.pod.uid)
                if held is not None:
                    ledger.grant(held, admitting=was_admitting)
        ledger.trial_uses -= len(used)

    def __enter__(self) -> Statement:
        return self

    def __exit__(self, *_: object) -> None:
        if self.steps:
            self.discard()
