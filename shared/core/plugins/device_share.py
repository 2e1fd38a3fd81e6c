"""DeviceShare: software slicing of a card (HAMi's vGPU semantics), for every vendor
and mode but MIG and the Ascend vNPU templates."""

from __future__ import annotations

from collections.abc import Callable

from shared.core.families import (
    BUSY,
    GROUP_SPREAD,
    MPS_MULTI_CARD,
    NUMA,
    SLICE_SIZE,
    SPLIT_REACHED,
    UNHEALTHY,
    DeviceFit,
    FitContext,
    Picks,
    Screened,
    mps_refusal,
    static_filter,
)
from shared.core.ledger import Dev, NodeState, PoolIndex, PoolKey
from shared.core.model import MPS_ALONE, Constraints, DeviceGrant, DeviceRequest, Policy, gpu_type
from shared.core.policy import Workload, device_score, prefer_high
from shared.core.spec import GENERIC_VENDORS, DeviceSpecs
from shared.core.status import UNRESOLVABLE, Reason
from shared.core.topology import best_set


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


class DeviceShare(DeviceFit):
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
    kinds = frozenset({"vgpu", "gpu-share", "gpu-number"})

    def __init__(self, specs: DeviceSpecs) -> None:
        super().__init__(specs)
        self.uniform: frozenset[str] = frozenset(
            v for v in GENERIC_VENDORS if (spec := specs.vendor(v)) and spec.memory_templates
        )
        """Vendors whose cards hold slices of one template at a time (Kunlunxin's vXPU:
        HAMi pkg/device/kunlun/vdevice.go takes a used card only for a slice of the
        size it already holds)."""

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """NVIDIA's hami-core and MPS pools (the one the pod's mode names, if any), Ascend's
        hami-core pool of its chip, or the vendor's; none for a MIG profile request."""
        if request.mig_profile is not None:
            return ()  # an existing MIG instance of that profile: MIGInstances
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

        # screen's work, inlined: this loop runs for every device of every candidate
        # node, and the reasons are made only for the first device of each kind.
        screened = Screened()
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
                or static_filter(d, constraints) is not None
                or (model and model not in d.model_lc)
            ):
                if screened.static is None:
                    screened.static = static_filter(d, constraints) or static(d)
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
