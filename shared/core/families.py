"""Device families: how one request is fitted onto one node's devices.

Every family implements one Protocol, :class:`DeviceFamily`:

- ``pools(request, constraints)``: which device pools (vendor, mode, chip) may serve it;
- ``demand(request, index)``: the least free memory and cores one device must offer, so
  the ledger's index can skip devices that cannot fit;
- ``filter(node, request, constraints, ctx)``: the devices and grants chosen on this node,
  or a :class:`~shared.core.status.Reason` why none fit. Unresolvable reasons (type
  excluded, larger than the card, no such template) cannot change with load; the others
  can.

Reserve and unreserve are the ledger's, for every family alike (``Ledger.grant`` /
``Ledger.release`` through ``Dev.apply``): idempotent and exact inverses.

Families: :class:`SlicedFamily` (NVIDIA hami-core and MPS, Volcano gpu-share and
gpu-number, Ascend in hami-core mode, every other vendor), :class:`MigFamily`,
:class:`TemplateFamily` (Ascend vNPU templates) and :class:`MindClusterFamily`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shared.core.ledger import Dev, MigSlot, NodeState, PoolIndex, PoolKey, geometry_id
from shared.core.model import (
    MPS_ALONE,
    Constraints,
    DeviceGrant,
    DeviceRequest,
    Policy,
    VendorSelector,
    gpu_type,
)
from shared.core.policy import Workload, device_score, prefer_high
from shared.core.spec import GENERIC_VENDORS, DeviceSpecs, VnpuChip, VnpuTemplate
from shared.core.status import UNRESOLVABLE, Reason
from shared.core.topology import best_set


@dataclass(slots=True)
class FitContext:
    """What a filter needs beyond the request: policy and the pod's group history."""

    device_policy: Policy = "spread"
    topology: bool = False
    """HAMi's ``topology-aware``: the best-linked cards that fit (shared/core/topology.py)."""
    allow_more_devices_than_cards: bool = False
    avoid: frozenset[str] = frozenset()
    """Cards used by other pods of the same PodGroup (``vgpu-podgroup-policy: spread``)."""
    only: frozenset[str] | None = None
    """Only these cards (an init container trying the app containers' devices)."""
    clamp_memory: bool = False
    """Memory above a card gets the whole card's memory (Volcano vGPU) instead of a no."""

    workload: Workload = field(default_factory=Workload)


Picks = list[tuple[Dev, DeviceGrant]]


class DeviceFamily(Protocol):
    """One way of sharing devices (see the module docstring for the contract)."""

    name: str
    """Its plugin name: what its reasons carry (``Reason.plugin``)."""

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The device pools (vendor, mode, chip) that may serve ``request``; none: this
        family does not serve it."""
        ...

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The least free memory (MiB) and cores (percent) one device of the pool must
        offer, so the ledger's index skips devices that cannot fit."""
        ...

    def filter(
        self, node: NodeState, request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """The devices and grants chosen for ``request`` on ``node``, or the reason none
        fit (unresolvable only when load cannot change it); changes nothing."""
        ...


# --- shared static filters ------------------------------------------------------------

TYPE_EXCLUDED = Reason(kind="type-excluded", code=UNRESOLVABLE)
UUID_EXCLUDED = Reason(kind="uuid-excluded", code=UNRESOLVABLE)
INDEX_EXCLUDED = Reason(kind="index-excluded", code=UNRESOLVABLE)
UNHEALTHY = Reason(kind="unhealthy")
SPLIT_REACHED = Reason(kind="split-reached")
BUSY = Reason(kind="busy")
GROUP_SPREAD = Reason(kind="group-spread")
MPS_UNAVAILABLE = Reason(kind="mps-unavailable")
MPS_USER_UNSET = Reason(kind="mps-user-unset", code=UNRESOLVABLE)
MPS_OTHER_USER = Reason(kind="mps-other-user")
MPS_MULTI_CARD = Reason(kind="mps-multi-card", code=UNRESOLVABLE)
"""A container asking two or more cards in MPS mode: an MPS client reaches one card's
daemon only (one daemon per card, services/node_agent/mps/), so no node can serve it."""


def mps_refusal(d: Dev, run_as: int | None) -> Reason | None:
    """Why an MPS card cannot take a pod running as ``run_as`` (Constraints.run_as):
    its daemon is not running, the pod's user is unknown, or the card serves another
    user's clients (one MPS daemon serves one user per card at a time)."""
    if not d.mps_ready:
        return MPS_UNAVAILABLE
    if run_as is None:
        return MPS_USER_UNSET
    if d.used_slots and (run_as == MPS_ALONE or d.mps_user != run_as):
        return MPS_OTHER_USER
    return None


NUMA = Reason(kind="numa")
SLICE_SIZE = Reason(
    kind="slice-size",
    detail="device(s) hold slices of another size (a card holds one slice size at a time)",
)
MIG_NONE_FREE = Reason(kind="mig-none-free")
MIG_TOO_SMALL = Reason(kind="mig-too-small", code=UNRESOLVABLE)


def _selects(dev: Dev, s: Constraints | VendorSelector) -> Reason | None:
    """One vendor's type and UUID allow/deny lists on ``dev``."""
    if s.use_types and not any(t in dev.model_lc for t in s.use_types):
        return TYPE_EXCLUDED
    if s.nouse_types and any(t in dev.model_lc for t in s.nouse_types):
        return TYPE_EXCLUDED
    if s.use_uuids and dev.uuid not in s.use_uuids:
        return UUID_EXCLUDED
    if s.nouse_uuids and dev.uuid in s.nouse_uuids:
        return UUID_EXCLUDED
    return None


def _covers(s: VendorSelector, dev: Dev) -> bool:
    """Do a selector's keys speak of ``dev``: its vendor, and its model when the keys
    name one (an Ascend chip exactly, another vendor's model as a type substring)?"""
    if s.vendor != dev.vendor:
        return False
    return not s.model or (dev.chip == s.model if dev.chip else gpu_type(s.model) in dev.model_lc)


def _static_filter(dev: Dev, c: Constraints) -> Reason | None:
    """The pod's annotations: each vendor's type and uuid allow/deny lists on that
    vendor's devices (NVIDIA's in the Constraints' own fields, as HAMi reads
    ``nvidia.com/use-gputype`` for NVIDIA devices only), and the index list."""
    if dev.vendor == "nvidia":
        refused = _selects(dev, c)
        if refused is not None:
            return refused
    for s in c.selectors:
        if _covers(s, dev):
            refused = _selects(dev, s)
            if refused is not None:
                return refused
    if c.device_indexes and dev.index not in c.device_indexes:
        return INDEX_EXCLUDED
    return None


def _pool_devices(
    node: NodeState, request: DeviceRequest, pools: Sequence[PoolKey]
) -> list[Dev] | Reason:
    """The node's devices of ``pools``, or why there are none (unresolvable)."""
    if len(pools) == 1:
        devs = node.pools.get(pools[0], [])
    else:
        devs = [d for p in pools for d in node.pools.get(p, ())]
    if devs:
        return devs
    modes = sorted({p[1] for p in pools})
    what = (request.chip and f"Ascend{request.chip}") or request.vendor
    if request.mig_profile is not None:
        what = f"nvidia MIG {request.mig_profile}"
    return Reason(kind="no-pool", code=UNRESOLVABLE, resource=what, detail="/".join(modes))


_Check = Callable[[Dev], "Reason | None"]


@dataclass(slots=True)
class _Screened:
    """A node's devices for one request, screened: those that may take it now (``ok``),
    how many the pod may use at all (``eligible``), and the first reason of each kind."""

    ok: list[Dev] = field(default_factory=list)
    eligible: int = 0
    static: Reason | None = None
    dynamic: Reason | None = None

    def failure(self) -> Reason:
        return self.dynamic or self.static or BUSY


def _screen(devs: list[Dev], c: Constraints, static: _Check, dynamic: _Check) -> _Screened:
    """Screen ``devs``: the pod's allow/deny lists and ``static`` (what no load changes),
    then ``dynamic`` (what a release could change)."""
    out = _Screened()
    for d in devs:
        reason = _static_filter(d, c) or static(d)
        if reason is not None:
            out.static = out.static or reason
            continue
        out.eligible += 1
        reason = dynamic(d)
        if reason is not None:
            out.dynamic = out.dynamic or reason
            continue
        out.ok.append(d)
    return out


def _usable(d: Dev) -> Reason | None:
    return None if d.usable else UNHEALTHY


def _no_check(_d: Dev) -> Reason | None:
    return None


def _order(devs: list[Dev], key: Callable[[Dev], float], policy: Policy) -> list[Dev]:
    return sorted(devs, key=key, reverse=prefer_high(policy))


def _numa_group(devs: list[Dev], count: int) -> list[Dev] | None:
    """The first NUMA node (in the policy order of ``devs``) with ``count`` devices."""
    groups: dict[int, list[Dev]] = {}
    for d in devs:
        group = groups.setdefault(d.numa, [])
        group.append(d)
        if len(group) == count:
            return group
    return None


def _link(a: Dev, b: Dev) -> int:
    """The score ``a`` reports for its link to ``b`` (cards of one vendor on one node)."""
    return a.info.links.get(b.index, 0)


def _numa_of(d: Dev) -> int:
    return d.numa


def _fgd_pick(
    devs: list[Dev], node: NodeState, share: Callable[[Dev], float], workload: Workload
) -> Dev:
    """The device whose use increases the node's expected fragmentation least (the
    first of equals). The measure reads the free shares as a multiset, so devices left
    with the same share from the same share are weighed once."""
    free = {d.uuid: d.free_fraction() for d in node.devices}
    base = workload.fragmentation(free.values())
    best, best_delta = devs[0], float("inf")
    weighed: dict[tuple[float, float], float] = {}
    for d in devs:
        was = free[d.uuid]
        left = max(0.0, was - share(d))
        delta = weighed.get((was, left))
        if delta is None:
            after = dict(free)
            after[d.uuid] = left
            delta = weighed[(was, left)] = workload.fragmentation(after.values()) - base
        if delta < best_delta - 1e-12:
            best, best_delta = d, delta
    return best


# --- sliced devices (count x memory x cores) ---------------------------------------------


class _Family:
    """What every family shares: ``filter`` finds the node's devices of the request's
    pools (or says there are none) and hands them to the family's ``fit``."""

    name = ""

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        raise NotImplementedError

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        raise NotImplementedError

    def filter(
        self, node: NodeState, request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        devs = _pool_devices(node, request, self.pools(request, constraints))
        return devs if isinstance(devs, Reason) else self.fit(devs, request, constraints, ctx)


class SlicedFamily(_Family):
    """Software slicing: ``count`` devices, each with memory and cores (HAMi semantics).

    Serves NVIDIA in hami-core and MPS mode (MPS: cores are the active-thread percentage),
    Volcano gpu-share (one device, memory only) and gpu-number (whole devices), Ascend in
    hami-core vNPU mode and every other vendor. Exclusive requests (cores 100, memory
    100 %, or a count alone) take only idle devices and keep them to themselves. A
    request naming a model (Iluvatar's names) takes that model's devices only; a vendor
    with slice templates (Kunlunxin) puts slices of one size on a card. Of the cards
    that fit, the device policy's first ``count`` are taken (one NUMA node's with
    ``numa``), or with ``topology-aware`` on a node whose cards report links the
    best-linked set (shared/core/topology.py).
    """

    name = "DeviceShare"

    def __init__(self, specs: DeviceSpecs | None = None) -> None:
        self.uniform: frozenset[str] = frozenset(
            v
            for v in GENERIC_VENDORS
            if specs is not None and (spec := specs.vendor(v)) and spec.memory_templates
        )
        """Vendors whose cards hold slices of one template at a time (Kunlunxin's vXPU:
        HAMi pkg/device/kunlun/vdevice.go takes a used card only for a slice of the
        size it already holds)."""

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """NVIDIA's hami-core and MPS pools (the one the pod's mode names, if any), Ascend's
        hami-core pool of its chip, or the vendor's; none for a MIG profile request."""
        if request.mig_profile is not None:
            return ()  # an existing MIG instance of that profile: MigFamily
        if request.vendor == "ascend":
            return (("ascend", "hami-core", request.chip or ""),)
        if request.vendor != "nvidia":
            return ((request.vendor, "hami-core", ""),)
        mode = constraints.mode
        if mode is not None:
            return (("nvidia", mode, ""),) if mode in ("hami-core", "mps") else ()
        return (("nvidia", "hami-core", ""), ("nvidia", "mps", ""))

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The least free memory and cores a device must offer: the smallest card's whole memory for
        an exclusive request, the smallest card's physical memory for one larger than every card
        (only the clamp can place it), else the request's memory (or its percentage of the smallest
        card) and cores."""
        if request.exclusive:
            return index.min_total, 100 if request.cores else 0
        if request.memory_mib is not None:
            if request.memory_mib > index.max_total:  # only a clamp can place it
                return index.min_phys, request.cores
            return request.memory_mib, request.cores
        return index.min_phys * (request.memory_percent or 0) // 100, request.cores

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """``count`` devices that each hold the request's memory and cores, chosen by the device
        policy (NUMA, topology, FGD); a reason when too few cards could ever hold it (unresolvable)
        or too few are free now."""
        memory = request.memory_mib
        percent = request.memory_percent or 100
        cores = request.cores
        exclusive = request.exclusive
        model = gpu_type(request.model) if request.model else ""
        uniform = request.vendor in self.uniform and not exclusive
        if request.count > 1 and not exclusive and any(d.mode == "mps" for d in devs):
            devs = [d for d in devs if d.mode != "mps"]  # MPS cards serve one per container
            if not devs:
                return MPS_MULTI_CARD

        def need_of(d: Dev) -> int:
            need = memory if memory is not None else d.phys_mem * percent // 100
            return min(need, d.phys_mem) if ctx.clamp_memory else need

        def static(d: Dev) -> Reason | None:
            if model and model not in d.model_lc:
                return Reason(
                    kind="model-mismatch",
                    code=UNRESOLVABLE,
                    resource=request.resource,
                    detail=f"device model is not the {request.model} {request.resource} asks",
                )
            need = need_of(d)
            if need <= d.total_mem and not cores > d.total_cores > 0:
                return None
            big_mem = need > d.total_mem
            return Reason(
                kind="larger-than-card",
                code=UNRESOLVABLE,
                resource=(request.memory_resource if big_mem else request.core_resource)
                or request.resource,
                requested=need if big_mem else cores,
                capacity=d.total_mem if big_mem else d.total_cores,
            )

        def dynamic(d: Dev) -> Reason | None:
            if not d.usable:
                return UNHEALTHY
            if d.mode == "mps" and (refused := mps_refusal(d, run_as)) is not None:
                return refused
            if d.used_slots >= d.slots:
                return SPLIT_REACHED
            if exclusive and d.used_slots:
                return BUSY
            need = need_of(d)
            if uniform and d.used_slots and d.used_mem != need * d.used_slots:
                return SLICE_SIZE
            short = None
            if d.total_mem - d.used_mem < need:
                short = (request.memory_resource, need, d.total_mem - d.used_mem, d.total_mem)
            elif d.total_cores and (
                d.total_cores - d.used_cores < cores or d.used_cores >= d.total_cores
            ):
                short = (request.core_resource, cores, d.total_cores - d.used_cores, d.total_cores)
            if short is not None:
                resource, requested, free, capacity = short
                return Reason(
                    kind="device-insufficient",
                    resource=resource or request.resource,
                    requested=requested,
                    free=free,
                    capacity=capacity,
                )
            return GROUP_SPREAD if d.uuid in ctx.avoid else None

        # _screen's work, inlined: this loop runs for every device of every candidate
        # node, and the reasons are made only for the first device of each kind.
        screened = _Screened()
        ok = screened.ok
        avoid = ctx.avoid
        only = ctx.only
        # A whole card is no MPS client: it holds the card alone whoever it runs as.
        run_as = MPS_ALONE if exclusive else constraints.run_as
        for d in devs:
            if only is not None and d.uuid not in only:
                continue
            need = memory if memory is not None else d.phys_mem * percent // 100
            if ctx.clamp_memory and need > d.phys_mem:
                need = d.phys_mem
            if (
                need > d.total_mem
                or cores > d.total_cores > 0
                or _static_filter(d, constraints) is not None
                or (model and model not in d.model_lc)
            ):
                if screened.static is None:
                    screened.static = _static_filter(d, constraints) or static(d)
                continue
            screened.eligible += 1
            if (
                d.healthy
                and not d.cordoned
                and d.used_slots < d.slots
                and not (exclusive and d.used_slots)
                and d.total_mem - d.used_mem >= need
                and (
                    not d.total_cores
                    or (d.total_cores - d.used_cores >= cores and d.used_cores < d.total_cores)
                )
                and d.uuid not in avoid
                and not (uniform and d.used_slots and d.used_mem != need * d.used_slots)
                and (
                    d.mode != "mps"
                    or (
                        d.mps_ready
                        and run_as is not None
                        and (not d.used_slots or (run_as != MPS_ALONE and d.mps_user == run_as))
                    )
                )
            ):
                ok.append(d)
            elif screened.dynamic is None:
                screened.dynamic = dynamic(d)
        eligible = screened.eligible
        count = request.count
        more = ctx.allow_more_devices_than_cards and not exclusive
        if eligible < count and not more:
            if eligible == 0 and screened.static is not None:
                return screened.static
            return Reason(
                kind="too-few-devices",
                code=UNRESOLVABLE,
                resource=request.resource,
                requested=count,
                free=eligible,
                detail=""
                if ctx.allow_more_devices_than_cards
                else " (scheduler.allowMoreDevicesThanCards lets one card serve several)",
            )
        if len(ok) < count and not (more and ok):
            return screened.failure()

        whole = request.kind == "gpu-number"

        def grant(d: Dev) -> DeviceGrant:
            return d.grant(
                memory_mib=need_of(d),
                cores=cores,
                exclusive=exclusive,
                mps_user=run_as if d.mode == "mps" else None,
                whole=whole,
            )

        policy = ctx.device_policy
        if len(ok) >= count:
            chosen = self._choose(
                ok, count, devs[0].node, request, constraints, policy, need_of, ctx
            )
            if chosen is None:
                return NUMA
            return [(d, grant(d)) for d in chosen]
        return self._repeat(ok, count, grant, need_of, cores, policy) or (screened.dynamic or BUSY)

    def _choose(
        self,
        ok: list[Dev],
        count: int,
        node: NodeState,
        request: DeviceRequest,
        constraints: Constraints,
        policy: Policy,
        need_of: Callable[[Dev], int],
        ctx: FitContext,
    ) -> list[Dev] | None:
        if count == 1 and len(ok) == 1:
            return ok
        cores = request.cores

        def score(d: Dev) -> float:
            return device_score(
                d.used_slots + 1,
                d.slots,
                d.used_cores + cores,
                d.total_cores,
                d.used_mem + need_of(d),
                d.total_mem,
            )

        high = prefer_high("binpack" if policy == "fgd" else policy)
        if ctx.topology and any(d.info.links for d in ok):
            # The best-linked set (one card: the one that splits least), the policy's
            # order breaking ties; with numa, within one NUMA node.
            ordered = sorted(ok, key=score, reverse=high)
            return best_set(ordered, count, _link, _numa_of if constraints.numa_bind else None)
        if policy == "fgd" and count == 1:

            def share(d: Dev) -> float:
                mem = need_of(d) / d.total_mem if d.total_mem else 0.0
                return 1.0 if request.exclusive else max(mem, cores / 100)

            return [_fgd_pick(ok, node, share, ctx.workload)]

        if count == 1 and not constraints.numa_bind:  # the first best, as the sort below
            return [max(ok, key=score) if high else min(ok, key=score)]
        ordered = sorted(ok, key=score, reverse=high)
        if constraints.numa_bind:
            return _numa_group(ordered, count)
        return ordered[:count]

    def _repeat(
        self,
        ok: list[Dev],
        count: int,
        grant: Callable[[Dev], DeviceGrant],
        need_of: Callable[[Dev], int],
        cores: int,
        policy: Policy,
    ) -> Picks | None:
        """Several slices of the same cards for one container (opt-in beyond upstream)."""
        free = {
            d.uuid: [d.total_mem - d.used_mem, d.total_cores - d.used_cores, d.slots - d.used_slots]
            for d in ok
        }
        picks: Picks = []
        while len(picks) < count:
            usable = [
                d
                for d in ok
                if free[d.uuid][0] >= need_of(d)
                and (not d.total_cores or free[d.uuid][1] >= cores)
                and free[d.uuid][2] > 0
            ]
            if not usable:
                return None
            d = sorted(usable, key=lambda x: free[x.uuid][0], reverse=not prefer_high(policy))[0]
            free[d.uuid][0] -= need_of(d)
            free[d.uuid][1] -= cores
            free[d.uuid][2] -= 1
            picks.append((d, grant(d)))
        return picks


# --- MIG --------------------------------------------------------------------------------


class MigFamily(_Family):
    """MIG instances: a card keeps one geometry while any instance is used; the smallest
    instance that fits is taken; an idle card is (re)configured to the geometry that
    wastes least (smallest fitting instance, then most instances), preferring the one it
    already runs. Each device of the request is one instance; instances of one card may
    serve one container (upstream allows more devices than cards in MIG mode). A request
    through ``nvidia.com/mig-<profile>`` takes existing instances of that profile only,
    never recutting a card (NVIDIA's plugin in ``migStrategy: mixed`` hands what exists)."""

    name = "MIGInstances"

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The NVIDIA MIG pool, for a vGPU request not pinned to another mode."""
        if request.vendor != "nvidia" or request.kind != "vgpu":
            return ()
        if constraints.mode not in (None, "mig"):
            return ()
        return (("nvidia", "mig", ""),)

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The request's memory (no cores: an instance's compute comes with its profile)."""
        return request.memory_mib or 0, 0

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """One instance per device asked, the smallest that fits on a card whose geometry (in use,
        or chosen now for an idle card) holds it; a reason when no geometry has one free."""

        def static(d: Dev) -> Reason | None:
            if d.mig is None:
                return Reason(kind="no-mig-geometry", code=UNRESOLVABLE, detail=d.model)
            if request.mig_profile is not None:
                return None  # whether the card holds one is a matter of its geometry now
            return MIG_TOO_SMALL if self._need(request, d) > d.mig.largest else None

        def dynamic(d: Dev) -> Reason | None:
            return _usable(d) or (BUSY if request.exclusive and d.mig_used else None)

        screened = _screen(devs, constraints, static, dynamic)
        cards = screened.ok
        if not cards:
            return screened.failure()
        # tentative state per card: geometry chosen and placements taken
        alt = {d.uuid: d.mig_alt if d.mig_used else -1 for d in cards}
        taken: dict[str, set[int]] = {d.uuid: set(d.mig_used) for d in cards}
        picks: Picks = []
        for _ in range(request.count):
            best: tuple[tuple[float, ...], Dev, int, MigSlot] | None = None
            for d in cards:
                for a, slot in self._options(d, alt[d.uuid], taken[d.uuid], request):
                    used = len(taken[d.uuid])
                    fill = -used if ctx.device_policy == "spread" else used
                    rank = (slot.memory_mib, 0 if a == d.mig_reported else 1, -fill)
                    if best is None or rank < best[0]:
                        best = (rank, d, a, slot)
            if best is None:
                if request.mig_profile is not None:
                    return Reason(
                        kind="mig-profile-none-free",
                        detail=f"no free MIG {request.mig_profile} instance",
                    )
                return MIG_NONE_FREE
            _, d, a, slot = best
            assert d.mig is not None
            alt[d.uuid] = a
            taken[d.uuid].add(slot.placement)
            picks.append(
                (
                    d,
                    d.grant(
                        memory_mib=slot.memory_mib,
                        mig_profile=slot.profile,
                        mig_placement=slot.placement,
                        mig_geometry=geometry_id(d.mig.alternatives[a]),
                        exclusive=False,
                        external=request.mig_profile is not None,
                    ),
                )
            )
        return picks

    @staticmethod
    def _need(request: DeviceRequest, d: Dev) -> int:
        """MiB asked; a percentage is of the largest instance (100 % = the whole card)."""
        if request.memory_mib is not None:
            return request.memory_mib
        largest = d.mig.largest if d.mig is not None else d.phys_mem
        return largest * (request.memory_percent or 100) // 100

    def _options(
        self, d: Dev, alt: int, taken: set[int], request: DeviceRequest
    ) -> list[tuple[int, MigSlot]]:
        """(geometry, instance) pairs that could take the request: the smallest per geometry.

        A ``nvidia.com/mig-<profile>`` request takes an instance of that profile that
        exists now (the geometry the card runs: in use, else as reported), as NVIDIA's
        device plugin in ``migStrategy: mixed`` hands only existing instances."""
        assert d.mig is not None
        profile = request.mig_profile
        if profile is not None:
            now = alt if alt >= 0 else d.mig_reported
            if now < 0:
                return []
            same = [
                s
                for s in d.mig.alternatives[now]
                if s.profile == profile and s.placement not in taken
            ]
            return [(now, min(same, key=lambda s: s.placement))] if same else []
        need = self._need(request, d)
        alts = [alt] if alt >= 0 else range(len(d.mig.alternatives))
        found = []
        for a in alts:
            free = [
                s
                for s in d.mig.alternatives[a]
                if s.placement not in taken and s.memory_mib >= need
            ]
            if free:
                found.append((a, min(free, key=lambda s: (s.memory_mib, s.placement))))
        if alt < 0 and found:
            smallest = min(s.memory_mib for _, s in found)
            found = [(a, s) for a, s in found if s.memory_mib == smallest]
            # among equals, the geometry with most instances leaves most room
            most = max(len(d.mig.alternatives[a]) for a, _ in found)
            found = [
                (a, s)
                for a, s in found
                if len(d.mig.alternatives[a]) == most or a == d.mig_reported
            ]
        return found


# --- Ascend vNPU templates -------------------------------------------------------------


def _template_picks(
    devs: list[Dev],
    request: DeviceRequest,
    constraints: Constraints,
    ctx: FitContext,
    templates: Sequence[VnpuTemplate],
) -> Picks | Reason:
    """Fit the first template (in preference order) some device has room for."""
    screened = _screen(devs, constraints, _no_check, _usable)
    eligible = screened.ok
    if not eligible:
        return screened.failure()
    whole = request.exclusive
    if whole:
        idle = [d for d in eligible if not d.used_slots]
        if len(idle) < request.count:
            if len(eligible) < request.count:
                return Reason(
                    kind="too-few-npus",
                    code=UNRESOLVABLE,
                    resource=request.resource,
                    requested=request.count,
                    free=len(eligible),
                )
            return BUSY
        ordered = _order(idle, lambda d: d.index, "spread")[: request.count]
        return [
            (
                d,
                d.grant(
                    memory_mib=d.phys_mem,
                    ai_cores=d.ai_cores,
                    ai_cpus=d.ai_cpus,
                    exclusive=True,
                ),
            )
            for d in ordered
        ]
    for t in templates:
        fits = [
            d
            for d in eligible
            if d.total_mem - d.used_mem >= t.memory
            and d.ai_cores - d.used_ai_cores >= t.ai_core
            and d.ai_cpus - d.used_ai_cpus >= t.ai_cpu
        ]
        if not fits:
            continue

        def score(d: Dev, t: VnpuTemplate = t) -> float:
            return device_score(
                0, 0, d.used_ai_cores + t.ai_core, d.ai_cores, d.used_mem + t.memory, d.total_mem
            )

        d = _order(fits, score, "binpack" if ctx.device_policy == "fgd" else ctx.device_policy)[0]
        return [
            (
                d,
                d.grant(
                    memory_mib=t.memory,
                    vnpu_template=t.name,
                    ai_cores=t.ai_core,
                    ai_cpus=t.ai_cpu,
                ),
            )
        ]
    return Reason(kind="no-template", detail=templates[0].name)


class TemplateFamily(_Family):
    """Ascend hard slicing (HAMi mode): memory rounds UP to the smallest template that fits;
    when no template fits but the card does, the whole card; several cards only whole."""

    name = "AscendTemplates"

    def __init__(self, specs: DeviceSpecs) -> None:
        self.chips: dict[str, VnpuChip] = {c.chip_name: c for c in specs.vnpus}

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The Ascend vNPU pool of the request's chip."""
        return (("ascend", "vnpu", request.chip or ""),)

    def template(self, request: DeviceRequest) -> VnpuTemplate | None:
        """The template a request rounds up to; None means the whole card."""
        chip = self.chips.get(request.chip or "")
        if chip is None or request.exclusive or request.memory_mib is None:
            return None
        fitting = [t for t in chip.templates if t.memory >= request.memory_mib]
        return min(fitting, key=lambda t: t.memory) if fitting else None

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The memory of the template the request rounds up to, else the smallest card's whole
        memory."""
        t = self.template(request)
        return (t.memory if t is not None else index.min_total), 0

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """Cards holding the request's template; without a fitting template, whole cards
        (exclusive)."""
        t = self.template(request)
        if t is None and not request.exclusive:
            whole = DeviceRequest(
                vendor="ascend",
                kind="npu-template",
                resource=request.resource,
                count=request.count,
                memory_percent=100,
                exclusive=True,
                chip=request.chip,
            )
            return _template_picks(devs, whole, constraints, ctx, ())
        return _template_picks(devs, request, constraints, ctx, (t,) if t else ())


# MindCluster 310P templates: name -> (AI cores, AI CPUs, MiB)
MINDCLUSTER_TEMPLATES: dict[str, tuple[int, int, int]] = {
    "vir01": (1, 1, 3072),
    "vir02": (2, 2, 6144),
    "vir02_1c": (2, 1, 6144),
    "vir04": (4, 4, 12288),
    "vir04_3c": (4, 3, 12288),
    "vir04_3c_ndvpp": (4, 3, 12288),
    "vir04_4c_dvpp": (4, 4, 12288),
}

# (AI cores, vnpu-dvpp, vnpu-level) -> templates in preference order (later = degraded)
MINDCLUSTER_TABLE: dict[tuple[int, str, str], tuple[str, ...]] = {
    (1, "null", "low"): ("vir01",),
    (1, "null", "high"): ("vir01",),
    (2, "null", "low"): ("vir02_1c",),
    (2, "null", "high"): ("vir02", "vir02_1c"),
    (4, "yes", "low"): ("vir04_4c_dvpp",),
    (4, "yes", "high"): ("vir04_4c_dvpp",),
    (4, "no", "low"): ("vir04_3c_ndvpp",),
    (4, "no", "high"): ("vir04_3c_ndvpp",),
    (4, "null", "low"): ("vir04_3c",),
    (4, "null", "high"): ("vir04", "vir04_3c"),
}


class MindClusterFamily(_Family):
    """Ascend MindCluster (``huawei.com/npu-core``): AI cores, ``vnpu-level`` and
    ``vnpu-dvpp`` pick a 310P template; ``high`` degrades to the lighter template when
    AI CPUs are scarce; multiples of 8 cores are whole cards."""

    name = "AscendCores"

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The Ascend vNPU pool of the request's chip (310P3 when it names none)."""
        return (("ascend", "vnpu", request.chip or "310P3"),)

    @staticmethod
    def templates(request: DeviceRequest, constraints: Constraints) -> tuple[VnpuTemplate, ...]:
        """The 310P templates for the request's AI cores, ``vnpu-dvpp`` and ``vnpu-level``, in
        preference order (a later one is the degraded choice); none for a combination MindCluster
        does not offer."""
        key = (
            request.npu_cores or 0,
            constraints.vnpu_dvpp or "null",
            constraints.vnpu_level or "low",
        )
        names = MINDCLUSTER_TABLE.get(key, ())
        return tuple(
            VnpuTemplate(
                name=n,
                ai_core=MINDCLUSTER_TEMPLATES[n][0],
                ai_cpu=MINDCLUSTER_TEMPLATES[n][1],
                memory=MINDCLUSTER_TEMPLATES[n][2],
            )
            for n in names
        )

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The smallest memory of the templates for the request's cores; the smallest card's whole
        memory when exclusive."""
        if request.exclusive:
            return index.min_total, 0
        found = self.templates(request, Constraints())
        return min((t.memory for t in found), default=0), 0

    def filter(
        self, node: NodeState, request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """An unresolvable reason when no template serves the request's cores, ``vnpu-dvpp`` and
        ``vnpu-level`` (and it does not ask whole cards); else the pool's devices fitted."""
        templates = self.templates(request, constraints)
        if not templates and not request.exclusive:
            return Reason(
                kind="no-template-for",
                code=UNRESOLVABLE,
                detail=f"{request.npu_cores} AI cores with "
                f"vnpu-dvpp={constraints.vnpu_dvpp or 'null'}, "
                f"vnpu-level={constraints.vnpu_level or 'low'}",
            )
        return super().filter(node, request, constraints, ctx)

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """Cards with room for one of the request's templates, the first preferred."""
        templates = self.templates(request, constraints)
        return _template_picks(devs, request, constraints, ctx, templates)
