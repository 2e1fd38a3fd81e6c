"""Device families: how one request is fitted onto one node's devices, and what the
families share (the pod's device allow and deny lists, screening, template picks).

Each family is a DeviceFit plugin (shared/core/framework.py) in its own module of
shared/core/plugins/, built on :class:`DeviceFit`:

- ``pools(request, constraints)``: which device pools (vendor, mode, chip) may serve it;
- ``demand(request, index)``: the least free memory and cores one device must offer, so
  the ledger's index can skip devices that cannot fit;
- ``filter(node, request, constraints, ctx)``: the devices and grants chosen on this node,
  or a :class:`~shared.core.status.Reason` why none fit. Unresolvable reasons (type
  excluded, larger than the card, no such template) cannot change with load; the others
  can.

Reserve and unreserve are the ledger's, for every family alike (``Ledger.grant`` /
``Ledger.release`` through ``Dev.apply``): idempotent and exact inverses.

Families: DeviceShare (NVIDIA hami-core and MPS, Volcano gpu-share and gpu-number,
Ascend in hami-core mode, every other vendor: shared/core/plugins/device_share.py),
MIGInstances, AscendTemplates (Ascend vNPU templates) and AscendCores (MindCluster).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shared.core.framework import DeviceFitPlugin
from shared.core.ledger import Dev, NodeState, PoolKey
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
from shared.core.spec import VnpuTemplate
from shared.core.status import UNRESOLVABLE, Reason


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


def static_filter(dev: Dev, c: Constraints) -> Reason | None:
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


def pool_devices(
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


Check = Callable[[Dev], "Reason | None"]


@dataclass(slots=True)
class Screened:
    """A node's devices for one request, screened: those that may take it now (``ok``),
    how many the pod may use at all (``eligible``), and the first reason of each kind."""

    ok: list[Dev] = field(default_factory=list)
    eligible: int = 0
    static: Reason | None = None
    dynamic: Reason | None = None

    def failure(self) -> Reason:
        """Why no device may take the request: what load changes first, else what it
        cannot, else busy."""
        return self.dynamic or self.static or BUSY


def screen(devs: list[Dev], c: Constraints, static: Check, dynamic: Check) -> Screened:
    """Screen ``devs``: the pod's allow/deny lists and ``static`` (what no load changes),
    then ``dynamic`` (what a release could change)."""
    out = Screened()
    for d in devs:
        reason = static_filter(d, c) or static(d)
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


def usable(d: Dev) -> Reason | None:
    """UNHEALTHY for a device that cannot be used now (unhealthy or cordoned)."""
    return None if d.usable else UNHEALTHY


def no_check(_d: Dev) -> Reason | None:
    """A screen's check that passes every device."""
    return None


def order_devices(devs: list[Dev], key: Callable[[Dev], float], policy: Policy) -> list[Dev]:
    """``devs`` in the device policy's order of ``key`` (binpack: highest first)."""
    return sorted(devs, key=key, reverse=prefer_high(policy))


class DeviceFit(DeviceFitPlugin):
    """What every family shares: ``filter`` finds the node's devices of the request's
    pools (or says there are none) and hands them to the family's ``fit``."""

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """The devices and grants chosen among ``devs`` (the node's devices of the
        request's pools), or the reason none fit."""
        raise NotImplementedError

    def filter(
        self, node: NodeState, request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """The request fitted on the node's devices of its pools."""
        devs = pool_devices(node, request, self.pools(request, constraints))
        return devs if isinstance(devs, Reason) else self.fit(devs, request, constraints, ctx)


# --- Ascend vNPU templates -------------------------------------------------------------


def template_picks(
    devs: list[Dev],
    request: DeviceRequest,
    constraints: Constraints,
    ctx: FitContext,
    templates: Sequence[VnpuTemplate],
) -> Picks | Reason:
    """Fit the first template (in preference order) some device has room for."""
    screened = screen(devs, constraints, no_check, usable)
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
        ordered = order_devices(idle, lambda d: d.index, "spread")[: request.count]
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

        policy = "binpack" if ctx.device_policy == "fgd" else ctx.device_policy
        d = order_devices(fits, score, policy)[0]
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
