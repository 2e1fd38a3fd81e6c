"""Placement: one pod, or a gang of pods all-or-nothing, onto the ledger.

``Placer.place`` walks the ledger's index for the pod's first device request in the
order of the node policy and fits the whole pod (every container, every device
request, any vendor) on each node it meets; the first node that fits wins (binpack,
spread), or the one that adds least fragmentation of the first ``fgd_candidates`` that
fit, drawn from both ends of the index (fgd; shared/core/policy.py). By default
(``fragmentation_guard``) binpack and spread weigh the first few nodes that fit in
their order by the fragmentation each would add, devices included, and pods with no
devices are placed by FGD. It then reserves the grant in the ledger: assume first,
bind later; the caller releases the reservation if the bind fails.

When nothing fits, every node is asked why, and the answer is a counted
:class:`~shared.core.status.Status` (``0/12 nodes are available: 5 gpu type excluded,
7 insufficient volcano.sh/vgpu-memory.``), unresolvable when every node's reason is:
no change of load can help, only a new node or a changed pod.

``Placer.place_gang`` is a transaction (a :class:`~shared.core.ledger.Statement`):
members are reserved one by one; once so many cannot be placed that ``min_member`` is
out of reach, every reservation made is undone in reverse order, leaving the ledger
exactly as before.
A gang of subgroups (shared/core/subgroups.py) nests a statement per subgroup, so each
is placed whole or not at all inside the gang's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import zip_longest
from typing import Literal

import msgspec

from shared.core.admission import keys_of_grants
from shared.core.families import FitContext, Picks
from shared.core.framework import (
    Choice,
    Chosen,
    DeviceFitPlugin,
    NodePolicyPlugin,
    Profile,
    registry,
)
from shared.core.hosts import CPU, MEMORY, PodSpec
from shared.core.ledger import Ledger, NodeState, PodGrant, PoolKey, Statement
from shared.core.model import (
    Constraints,
    ContainerGrant,
    ContainerRequest,
    DeviceRequest,
    GangKey,
    NodeName,
    PodRef,
    PodRequest,
    Policy,
)
from shared.core.nodefit import Prepared
from shared.core.plugins.fgd import FgdSearch
from shared.core.policy import Shape, Workload, request_share
from shared.core.request import REQUEST_CHECK
from shared.core.status import (
    SUCCESS,
    UNRESOLVABLE,
    Code,
    Reason,
    Status,
    counted,
    fail,
)
from shared.core.subgroups import SubGroups


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Policy knobs (the allocator fills them from ``scheduler:`` in the config)."""

    node_policy: Policy = "binpack"
    device_policy: Policy = "spread"
    topology_aware: bool = False
    """HAMi's ``topology-aware`` for pods without ``hami.io/gpu-scheduler-policy``: the
    best-linked cards of a node (shared/core/topology.py)."""
    allow_more_devices_than_cards: bool = False
    memory_larger_than_card: Literal["reject", "clamp"] = "reject"
    """``clamp`` (Volcano vGPU): memory above a card is the whole card's memory."""
    fgd_candidates: int = 64
    """Feasible nodes FGD compares per pod (0: every node; the paper's exhaustive form)."""
    score_window: int = 16
    """Feasible nodes scored per pod when scores matter: always for a pod that asks for
    no devices, and for one with soft preferences (preferred node or pod affinity,
    ScheduleAnyway spread) or when some node has a PreferNoSchedule taint. Other pods
    take the first node that fits in the device policy's order."""
    fragmentation_guard: int = 16
    """With binpack or spread nodes (pods that name no node policy and have no soft
    preferences): a pod with devices takes, of the first this many nodes that fit, the
    one whose expected fragmentation it increases least (shared/core/policy.py: its cpu
    and memory counted, the first of equals), and its devices there by the same measure
    unless it names a device policy; a pod with no devices is placed by FGD. The nodes
    are drawn in the policy's order, for binpack from both ends of the index in turn
    (the tightest cards and the emptiest, as ``fgd`` draws them: on a cluster of several
    card sizes the tight end alone sees only the smallest), at most a quarter of them of
    one node kind where there are several (shared/core/plugins/fragmentation_guard.py).
    0: neither (HAMi's and kube-scheduler's choices). 16 on the openb trace, ten seeds
    of the paper's own stream: above the FGD paper's allocation on all four of its
    variants (by 0.06 to 0.79 point) and 5.3 to 6.2 points above best-fit
    (bench/RESULTS.md)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """A reserved placement: the pod's node and every container's grant."""

    pod: PodRef
    node: NodeName
    grants: tuple[ContainerGrant, ...]


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a pod was not placed."""

    pod: PodRef
    status: Status

    @property
    def message(self) -> str:
        """The status as one line, as the pod's Event says it."""
        return self.status.message()

    @property
    def unresolvable(self) -> bool:
        """Whether no change of load can place the pod (preemption would not help)."""
        return self.status.unresolvable


@dataclass(frozen=True, slots=True)
class GangMember:
    """A pod to place as part of a gang, and the PodGroup it belongs to."""

    pod: PodRef
    request: PodRequest
    group: GangKey | None = None
    spec: PodSpec | None = None
    """What node filters read of it (None: devices only, as the core's own tests do)."""


@dataclass
class GangResult:
    """All placed (``status.ok``) or none; ``failures`` says why members did not fit."""

    status: Status
    placed: list[Placement] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every member placed."""
        return self.status.ok

    @property
    def message(self) -> str:
        """Why the gang was not placed, as one line ("" when it was)."""
        return self.status.message()


_Route = tuple[PoolKey, DeviceFitPlugin]


def _container_grant(
    container: ContainerRequest, picks: Picks, *, reuses: bool = False
) -> ContainerGrant:
    """One container's grant from what it picked."""
    return ContainerGrant(
        container=container.name,
        init=container.init,
        devices=tuple(g for _, g in picks),
        reuses=reuses,
        priority=next((r.priority for r in container.devices if r.priority is not None), None),
        disable_isolation=container.disable_isolation,
        core_policy=container.core_policy,
    )


def _decided_by(reason: Reason, family: DeviceFitPlugin) -> Reason:
    """``reason`` naming the family that found it, unless it names its plugin already."""
    return reason if reason.plugin else msgspec.structs.replace(reason, plugin=family.name)


def _shape(request: DeviceRequest, c: Constraints) -> tuple[object, ...]:
    """What of a request and its pod's constraints decides the families and pools that
    serve it."""
    return (request.kind, request.vendor, request.chip, c.mode, request.mig_profile is None)


def _not_enabled(what: str, plugin: str) -> Reason:
    """``what`` (a device resource, a node policy) would be served by ``plugin``, which
    the profile does not enable."""
    return Reason(
        kind="not-enabled", code=UNRESOLVABLE, resource=what, detail=plugin, plugin=plugin
    )


def _mode_mismatch(request: DeviceRequest, pod: PodRequest) -> Reason:
    return Reason(
        kind="mode-mismatch",
        code=UNRESOLVABLE,
        resource=request.resource,
        detail=str(pod.constraints.mode),
        plugin="DeviceShare",
    )


class Placer:
    """Places pods on one ledger; build once per ledger."""

    def __init__(
        self,
        ledger: Ledger,
        config: PlacementConfig | None = None,
        workload: Workload | None = None,
    ) -> None:
        self.ledger = ledger
        self.config = config or PlacementConfig()
        self.fixed_workload = workload is not None
        self.workload = workload or Workload()
        self.reserved_nodes: dict[NodeName, GangKey] = {}
        """Nodes held for a gang that waited too long (the starvation guard): node → the
        gang. Only that gang is placed there until the hold is dropped."""
        self.within: frozenset[NodeName] | None = None
        """Only these nodes are offered (None: every node): a gang placed inside one
        network domain (shared/core/network.py). Set around one ``place_gang``."""
        self._ordered: list[NodeState] = []
        self._version = -1
        self._start = 0
        """Where the round robin of pods with no devices starts next (see _rotation)."""
        self._routes: dict[tuple[object, ...], list[_Route]] = {}
        self._largest = (0, 1)
        """(pools seen, the largest card's MiB): what FGD's shapes are fractions of."""
        self._unserved: dict[tuple[object, ...], Reason] = {}
        """Per request shape no enabled family serves: the reason (a family the profile
        leaves out, or no pool of the pod's mode)."""
        self.fgd = FgdSearch()
        self._contexts: dict[tuple[str, bool], FitContext] = {}
        """The fit contexts of pods that avoid no cards, by device policy and topology."""
        """FGD's search and memo, shared by the FGD policy and the guard."""
        self._profile: Profile | None = None
        self.families: tuple[DeviceFitPlugin, ...] = ()
        """The profile's device families, in preference order."""
        self.policies: dict[str, NodePolicyPlugin] = {}
        """The profile's node policies by the policy value each serves."""
        self.overlays: tuple[NodePolicyPlugin, ...] = ()
        """Node policies that apply over another's (the fragmentation guard)."""

    # --- plugins --------------------------------------------------------------------

    def _fresh(self) -> None:
        """Make the plugins again if the ledger's profile is not the one they came from."""
        if self.ledger.hosts.profile is not self._profile:
            self._load()

    def _load(self) -> None:
        """Make the profile's per-ledger plugins (again, when the profile changed)."""
        profile = self._profile = self.ledger.hosts.profile
        self.families = tuple(kind(self.ledger.specs) for kind in profile.devices)
        made = [kind(weight) for kind, weight in profile.policies]
        self.policies = {p.policy: p for p in made if p.policy}
        self.overlays = tuple(p for p in made if not p.policy)
        self._routes.clear()
        self._unserved.clear()

    def routes(self, request: DeviceRequest, pod: PodRequest) -> list[_Route]:
        """Which families may serve a request, and from which pools, in the profile's
        order (the same for every request of one shape: kept per shape, until the
        profile changes: every entry point looks, ``_fresh``)."""
        c = pod.constraints
        shape = (request.kind, request.vendor, request.chip, c.mode, request.mig_profile is None)
        known = self._routes.get(shape)  # the key is _shape's, inline: every fit's path
        if known is not None:
            return known
        self._fresh()
        found: list[_Route] = [
            (pool, f)
            for f in self.families
            if request.kind in f.kinds
            for pool in f.pools(request, c)
        ]
        self._routes[shape] = found
        if not found:
            self._unserved[shape] = self._why_unserved(request, pod)
        return found

    def _why_unserved(self, request: DeviceRequest, pod: PodRequest) -> Reason:
        """Why no enabled family serves a request: a family the profile leaves out would
        (it names the plugin), or none serves the pod's mode."""
        enabled = {type(f) for f in self.families}
        for kind in registry().values():
            if (
                issubclass(kind, DeviceFitPlugin)
                and kind not in enabled
                and request.kind in kind.kinds
                and kind(self.ledger.specs).pools(request, pod.constraints)
            ):
                return _not_enabled(request.resource, kind.name)
        return _mode_mismatch(request, pod)

    # --- checks ---------------------------------------------------------------------

    def check(self, request: PodRequest) -> Status:
        """Errors no placement can cure (memory above every card of the family):
        unresolvable, one reason per field; success otherwise."""
        self._fresh()
        reasons = []
        for c in request.containers:
            for r in c.devices:
                if r.memory_mib is None or r.kind in ("npu-template", "npu-core"):
                    continue
                largest = 0
                for pool, _family in self.routes(r, request):
                    index = self.ledger.pools.get(pool)
                    if index is not None:
                        largest = max(largest, index.max_total)
                clamped = self.config.memory_larger_than_card == "clamp"
                if largest and r.memory_mib > largest and not clamped:
                    reasons.append(
                        Reason(
                            kind="invalid",
                            plugin=REQUEST_CHECK,
                            code=UNRESOLVABLE,
                            resource=f"{r.memory_resource or r.resource} (container {c.name})",
                            requested=r.memory_mib,
                            capacity=largest,
                            detail=f"{r.memory_mib} MiB is larger than any {r.vendor} card in "
                            f"the cluster ({largest} MiB); ask for at most {largest}",
                        )
                    )
        return Status(code=Code.UNRESOLVABLE, reasons=tuple(reasons)) if reasons else SUCCESS

    # --- one node -------------------------------------------------------------------

    def _context(self, request: PodRequest, group: GangKey | None) -> FitContext:
        """What fitting the pod's devices reads beyond its request. Shared by the pods
        of one device policy and topology choice that avoid no cards (no one changes a
        context: a variant is a ``replace``)."""
        c = request.constraints
        policy = c.device_policy or self.config.device_policy
        topology = self.config.topology_aware if c.topology is None else c.topology
        avoid: frozenset[str] = frozenset()
        if c.group_spread and group:
            avoid = frozenset(self.ledger.group_devices.get(group, ()))
        elif (kept := self._contexts.get((policy, topology))) is not None:
            return kept
        made = FitContext(
            device_policy=policy,
            topology=topology,
            allow_more_devices_than_cards=self.config.allow_more_devices_than_cards,
            avoid=avoid,
            workload=self.workload,
            clamp_memory=self.config.memory_larger_than_card == "clamp",
        )
        if not avoid:
            self._contexts[(policy, topology)] = made
        return made

    def fit_node(
        self,
        node: NodeState,
        request: PodRequest,
        ctx: FitContext,
        prep: Prepared | None = None,
    ) -> tuple[ContainerGrant, ...] | Status:
        """The pod's grants on ``node``, or why it does not fit: kube-scheduler's filters
        first (``prep``, when the pod's spec is known), then its devices. Leaves no
        trace: each container's picks are used tentatively, so the next one sees them."""
        if prep is not None:
            refused = prep.filter(node.host)
            if refused is not None:
                return refused
        if not request.wants_devices:
            return ()
        containers = request.containers
        # What runs for the pod's whole life first (app containers, sidecars), then each
        # plain init container: it runs before them, alone, so it may take devices the
        # app containers hold (``_reuse``) instead of more (the kubelet's device manager
        # hands an init container's devices on to the app containers).
        order = [i for i, c in enumerate(containers) if not c.init or c.sidecar]
        order += [i for i, c in enumerate(containers) if c.init and not c.sidecar]
        grants: dict[int, ContainerGrant] = {}
        app: Picks = []  # what the plain app containers took
        left = sum(len(c.devices) for c in containers)
        with Statement(self.ledger) as trial:
            for i in order:
                container = containers[i]
                if container.init and not container.sidecar:
                    reused = self._reuse(node, container, request, ctx, app)
                    if reused is not None:
                        left -= len(container.devices)
                        grants[i] = _container_grant(container, reused, reuses=True)
                        continue
                picks: Picks = []
                for r in container.devices:
                    found = self._fit_request(node, r, request, ctx)
                    if isinstance(found, Reason):
                        return fail(found)
                    left -= 1
                    if left:  # a later request must see what this one took
                        for dev, g in found:
                            trial.use(dev, g)
                    picks.extend(found)
                if not container.init:
                    app.extend(picks)
                grants[i] = _container_grant(container, picks)
        ordered = tuple(grants[i] for i in range(len(containers)))
        busy = self.ledger.admitting.get(node.name)
        if busy:
            for channel, amount in keys_of_grants(ordered):
                if (channel, amount) in busy:
                    return fail(
                        Reason(
                            kind="admitting",
                            resource=channel,
                            requested=amount,
                            plugin="DeviceAdmission",
                        )
                    )
        return ordered

    def _reuse(
        self,
        node: NodeState,
        container: ContainerRequest,
        request: PodRequest,
        ctx: FitContext,
        app: Picks,
    ) -> Picks | None:
        """An init container's devices inside what the app containers took on this node
        (each card's memory, cores and exclusivity no more than theirs), or None. The
        app's picks are set aside while it looks, as if the init container ran first."""
        if not app or len(container.devices) != 1:
            return None
        held: dict[str, list[int]] = {}
        exclusive: set[str] = set()
        for dev, g in app:
            if g.mig_placement is not None or g.vnpu_template is not None:
                continue  # an instance or a template is not a share to split
            amounts = held.setdefault(dev.uuid, [0, 0])
            amounts[0] += g.memory_mib
            amounts[1] += g.cores
            if g.exclusive:
                exclusive.add(dev.uuid)
        if not held:
            return None
        for dev, g in app:
            dev.apply(g, -1)
        try:
            found = self._fit_request(
                node, container.devices[0], request, replace(ctx, only=frozenset(held))
            )
        finally:
            for dev, g in app:
                dev.apply(g, 1)
        if isinstance(found, Reason):
            return None
        for dev, g in found:
            if dev.uuid not in held or g.mig_placement is not None:
                return None
            if dev.uuid in exclusive:
                continue
            memory, cores = held[dev.uuid]
            if g.exclusive or g.memory_mib > memory or g.cores > cores:
                return None
        return found

    def _fit_request(
        self, node: NodeState, r: DeviceRequest, request: PodRequest, ctx: FitContext
    ) -> Picks | Reason:
        reason: Reason | None = None
        tried: set[int] = set()
        routes = self.routes(r, request)
        for pool, family in routes:
            if pool not in node.pools or id(family) in tried:
                continue
            tried.add(id(family))
            found = family.filter(node, r, request.constraints, ctx)
            if not isinstance(found, Reason):
                if r.units:  # what the kubelet will ask of the resource counted in units
                    return [(dev, msgspec.structs.replace(g, units=r.units)) for dev, g in found]
                return found
            found = _decided_by(found, family)
            if reason is None or (reason.unresolvable and not found.unresolvable):
                reason = found
        if reason is None:
            # The node has none of the pools that could serve the request.
            if not routes:
                return self._unserved[_shape(r, request.constraints)]
            family = routes[0][1]
            found = family.filter(_EMPTY, r, request.constraints, ctx)
            assert isinstance(found, Reason)
            reason = _decided_by(found, family)
        return reason

    # --- one pod --------------------------------------------------------------------

    def _primary(self, request: PodRequest) -> DeviceRequest | None:
        for c in request.containers:
            if c.devices:
                return c.devices[0]
        return None

    def _held_for_other(self, node: NodeName, owner: GangKey | None) -> Status | None:
        """Why ``node`` is not open to ``owner``: it is held for another waiting gang."""
        holder = self.reserved_nodes.get(node) if self.reserved_nodes else None
        if holder is None or holder == owner:
            return None
        return fail(Reason(kind="held", detail=str(holder), plugin="StarvationHold"))

    def candidates(
        self,
        request: PodRequest,
        primary: DeviceRequest,
        policy: Policy,
        owner: GangKey | None,
        prep: Prepared | None,
    ) -> Iterator[NodeState]:
        """Nodes holding a device that could take the primary request, in policy order,
        less those the pod's Node-only filters rule out (``Prepared.ruled_out``: the
        walk passes them without a fit each)."""
        seen: set[str] = set()
        skip = prep.ruled_out() if prep is not None else frozenset()
        within = self.within
        if within is not None:
            yield from self._walk_within(within, request, primary, policy, owner, skip)
            return
        for pool, family in self.routes(primary, request):
            index = self.ledger.pools.get(pool)
            if index is None:
                continue
            mem, cores = family.demand(primary, index)
            for dev in index.walk(mem, cores, policy == "spread", seen, skip):
                if self._held_for_other(dev.node.name, owner) is None:
                    yield dev.node

    def _walk_within(
        self,
        within: frozenset[NodeName],
        request: PodRequest,
        primary: DeviceRequest,
        policy: Policy,
        owner: GangKey | None,
        skip: AbstractSet[str],
    ) -> Iterator[NodeState]:
        """:meth:`candidates` restricted to ``within``. A small domain is read node by
        node (its devices' free room, ordered as the index walks them: tightest first for
        binpack); a large one by the index walk, passing the nodes outside it. Reading a
        domain costs its devices; walking the index costs about (nodes / domain) steps
        per node yielded: the first is cheaper while domain² < 4 x nodes (bench/topology.py:
        a 16-node rack of 4,096 nodes, not a 256-node spine)."""
        nodes = self.ledger.nodes
        spread = policy == "spread"
        if len(within) ** 2 >= 4 * len(nodes):
            seen: set[str] = set()
            for pool, family in self.routes(primary, request):
                index = self.ledger.pools.get(pool)
                if index is None:
                    continue
                mem, cores = family.demand(primary, index)
                for dev in index.walk(mem, cores, spread, seen, skip):
                    name = dev.node.name
                    if name in within and self._held_for_other(name, owner) is None:
                        yield dev.node
            return
        found: dict[NodeName, tuple[int, int]] = {}
        for pool, family in self.routes(primary, request):
            index = self.ledger.pools.get(pool)
            if index is None:
                continue
            mem, cores = family.demand(primary, index)
            where = index.where
            for name in within:
                node = nodes.get(name)
                if node is None or name in skip or name in found:
                    continue
                best: tuple[int, int] | None = None
                for dev in node.pools.get(pool, ()):
                    free = where.get(dev)
                    if free is None or free[1] < mem or free[2] < cores:
                        continue
                    key = (free[1], free[2])
                    if best is None or (key > best if spread else key < best):
                        best = key
                if best is not None:
                    found[name] = best
        for name in sorted(found, key=lambda n: (found[n], n), reverse=spread):
            if self._held_for_other(name, owner) is None:
                yield nodes[name]

    def place(
        self,
        pod: PodRef,
        request: PodRequest,
        group: GangKey | None = None,
        *,
        spec: PodSpec | None = None,
        owner: GangKey | None = None,
        trial: bool = False,
        statement: Statement | None = None,
        fragmentation_guard: int | None = None,
    ) -> Placement | Failure:
        """Place and reserve one pod, or say why not.

        ``spec`` is what node filters read of the pod (None: devices only). ``owner``
        is the pod's gang (nodes held for it stay open to it). A ``trial`` (a preemption
        plan asking "would it fit?") neither learns the workload's shape nor scans every
        node for the reasons of a failure. Given a ``statement``, the grant is made
        inside it (a gang's transaction). Every other call counts the pod's type in the
        workload FGD weighs, placed or not: waiting pods are demand too.
        ``fragmentation_guard``, when given, is this call's window in place of
        ``config.fragmentation_guard`` (the allocator's, narrowed while it is behind:
        shared/core/pace.py).
        """
        if fragmentation_guard is None:
            fragmentation_guard = self.config.fragmentation_guard
        prep: Prepared | None = None
        if spec is not None:
            self.ledger.observe(spec)
            prepared = self.ledger.hosts.prepare(spec)
            if isinstance(prepared, Status):
                return Failure(pod=pod, status=prepared)
            prep = prepared
        primary = self._primary(request)
        if primary is None and prep is None:
            return Failure(pod=pod, status=Status(code=Code.UNRESOLVABLE, reasons=(_NO_DEVICES,)))
        if not trial:
            # Before weighing: the pod's own type is part of the demand FGD weighs (the
            # first pod of a cluster would otherwise be weighed against whole cards only,
            # and a quarter-card pod take a whole MIG card, which leaves no fragment).
            self._observe(request, spec)
        ctx = self._context(request, group)
        c = request.constraints
        if self.ledger.hosts.profile is not self._profile:
            self._load()  # as _fresh, inline: this is every pod's path
        choice = Choice(  # by position: this is every pod's path
            self,
            request,
            primary,
            ctx,
            prep,
            owner,
            c.node_policy or self.config.node_policy,
            0 if c.node_policy else fragmentation_guard,
        )
        chooser = self.policies.get(choice.policy)
        if chooser is None:
            named = (
                k.name
                for k in registry().values()
                if issubclass(k, NodePolicyPlugin) and k.policy == choice.policy
            )
            why = _not_enabled(f"node policy {choice.policy}", next(named, choice.policy))
            return Failure(pod=pod, status=fail(why))
        for overlay in self.overlays:
            if overlay.applies(choice):
                chooser = overlay
                break
        chosen = chooser.choose(choice)
        if chosen is None:
            if trial:
                return Failure(pod=pod, status=_TRIAL_MISS)
            # Full scan: it finds every node's reason, and a node the index's bounds missed.
            scanned = self._scan(request, ctx, owner, prep)
            if isinstance(scanned, Status):
                return Failure(pod=pod, status=scanned)
            chosen = scanned
        node, grants = chosen
        grant = PodGrant(pod=pod, node=node.name, containers=grants, group=group, spec=spec)
        if statement is not None:
            statement.grant(grant, admitting=not trial)
        else:
            self.ledger.grant(grant, admitting=not trial)
        if prep is not None and prep.reserves:  # kube-scheduler's Reserve
            for reserve in prep.reserves:
                unreserve = reserve(prep, pod.uid, node.name)
                if unreserve is not None and statement is not None:
                    statement.undo(unreserve)
        return Placement(pod=pod, node=node.name, grants=grants)

    def rotation(self, owner: GangKey | None, prep: Prepared | None) -> Iterator[NodeState]:
        """Every node, from where the last pod with no devices stopped (kube-scheduler's
        round robin: such pods spread their evaluation); with a node selector, only the
        nodes the label index says carry its labels."""
        nodes = self._ordered
        if len(nodes) != len(self.ledger.nodes) or self._version != self.ledger.hosts.version:
            nodes = self._ordered = sorted(self.ledger.nodes.values(), key=lambda n: n.name)
            self._version = self.ledger.hosts.version
        selected = self.ledger.hosts.selected(prep.pod.node_selector) if prep else None
        if self.within is not None:
            selected = set(self.within) if selected is None else selected & self.within
        start = self._start % len(nodes) if nodes else 0
        for i in range(len(nodes)):
            node = nodes[(start + i) % len(nodes)]
            self._start += 1
            if selected is not None and node.name not in selected:
                continue
            if self._held_for_other(node.name, owner) is None:
                yield node

    def first_fit(
        self,
        candidates: Iterator[NodeState],
        choice: Choice,
        weight: int,
        *,
        rotate: bool = False,
    ) -> Chosen | None:
        """The first node that fits, or the best scored of a window of feasible ones
        (``score_window``) when scores matter (see PlacementConfig): the profile's
        scores, and for a walk of the device index (not ``rotate``) its order, the
        first best, times ``weight``."""
        request, ctx, prep, policy = choice.request, choice.ctx, choice.prep, choice.policy
        window = 1
        if prep is not None and (rotate or prep.soft()):
            window = max(self.config.score_window, 1)
        found: list[tuple[NodeState, tuple[ContainerGrant, ...]]] = []
        for node in candidates:
            grants = self.fit_node(node, request, ctx, prep)
            if isinstance(grants, Status):
                continue
            found.append((node, grants))
            if len(found) >= window:
                break
        if len(found) <= 1 or prep is None:
            return found[0] if found else None
        scores = prep.score(
            [n.host for n, _ in found], "spread" if policy == "spread" else "binpack"
        )
        if not rotate:  # the walk's order, first best
            last = len(found) - 1
            for i in range(len(found)):
                scores[i] += weight * 100 * (last - i) / last
        best = max(range(len(found)), key=lambda i: (scores[i], -i))
        return found[best]

    def both_ends(
        self,
        request: PodRequest,
        primary: DeviceRequest,
        owner: GangKey | None,
        limit: int,
        prep: Prepared | None,
    ) -> Iterator[NodeState]:
        """Nodes that could take the primary request for FGD (or the binpack guard) to
        weigh, from both ends of the index in turn: the tightest devices (where a task
        fills what others left) and the emptiest (idle cards, usually with cpu to spare;
        on a cluster of several card sizes, the larger cards, which the tight end reaches
        only once every smaller card is taken). On the openb trace a window drawn from
        both ends finds placements that fragment less than one twice as long from the
        tightest end alone (bench/RESULTS.md); with every node in the window (``limit``
        0) the order does not matter and one walk serves."""
        tight = self.candidates(request, primary, "binpack", owner, prep)
        offered = len(self.ledger.nodes) if self.within is None else len(self.within)
        if not limit or limit >= offered:
            yield from tight
            return
        roomy = self.candidates(request, primary, "spread", owner, prep)
        seen: set[str] = set()
        for pair in zip_longest(tight, roomy):
            for node in pair:
                if node is not None and node.name not in seen:
                    seen.add(node.name)
                    yield node

    def _observe(self, request: PodRequest, spec: PodSpec | None) -> None:
        """Learn the task types FGD weighs (unless a workload was given): the pod's first
        device request as a share of a card, its cpu and memory, its GPU types."""
        if self.fixed_workload:
            return
        r = self._primary(request)
        if r is None:
            return  # a task with no GPU weighs nothing (shared/core/policy.py)
        card = 0
        if r.memory_mib is not None and self.ledger.pools:
            if self._largest[0] != len(self.ledger.pools):
                top = max(ix.max_total for ix in self.ledger.pools.values())
                self._largest = (len(self.ledger.pools), top or 1)
            card = self._largest[1]
        frac = request_share(r, card)
        requests = spec.requests if spec is not None else {}
        c = request.constraints
        self.workload.observe(
            Shape(
                r.count,
                frac,
                requests.get(CPU, 0),
                requests.get(MEMORY, 0),
                c.use_types,
                c.nouse_types,
            )
        )

    def explain(self, m: GangMember) -> Status:
        """Ask every node why the pod does not fit (now); the counted reasons, or success
        when some node would take it."""
        self._fresh()
        prep = self.ledger.hosts.prepare(m.spec) if m.spec is not None else None
        if isinstance(prep, Status):
            return prep
        scanned = self._scan(m.request, self._context(m.request, m.group), None, prep)
        return scanned if isinstance(scanned, Status) else SUCCESS

    def verdicts(self, m: GangMember) -> tuple[Status, list[tuple[NodeName, Status | None]]]:
        """Every node's answer on the pod now (None: it would take it), and the counted
        outcome as its Event would say it (``tessera explain``). Nothing is placed."""
        checked = self.check(m.request)
        if not checked.ok:
            return checked, []
        prep = self.ledger.hosts.prepare(m.spec) if m.spec is not None else None
        if isinstance(prep, Status):
            return prep, []
        ctx = self._context(m.request, m.group)
        answers: list[tuple[NodeName, Status | None]] = []
        for node in self.ledger.nodes.values():
            status = self._held_for_other(node.name, None) or self.fit_node(
                node, m.request, ctx, prep
            )
            answers.append((node.name, status if isinstance(status, Status) else None))
        rejected = [s for _, s in answers if s is not None]
        if len(rejected) < len(answers):
            return SUCCESS, answers
        return counted(rejected, len(answers)), answers

    def _scan(
        self,
        request: PodRequest,
        ctx: FitContext,
        owner: GangKey | None,
        prep: Prepared | None = None,
    ) -> tuple[NodeState, tuple[ContainerGrant, ...]] | Status:
        """Fit every node (of ``within``, when set): the first that fits, or the counted
        reasons of all."""
        rejected: list[Status] = []
        nodes: Iterable[NodeState] = self.ledger.nodes.values()
        if self.within is not None:
            nodes = [n for n in map(self.ledger.nodes.get, sorted(self.within)) if n is not None]
        for node in nodes:
            status = self._held_for_other(node.name, owner) or self.fit_node(
                node, request, ctx, prep
            )
            if not isinstance(status, Status):
                return node, status
            rejected.append(status)
        return counted(rejected, len(rejected))

    def release(self, pod: PodRef) -> bool:
        """Return a pod's reservation (bind failed, pod deleted); idempotent."""
        return self.ledger.release(pod.uid) is not None

    # --- gangs ----------------------------------------------------------------------

    def place_gang(
        self,
        members: Sequence[GangMember],
        min_member: int,
        *,
        owner: GangKey | None = None,
        trial: bool = False,
        statement: Statement | None = None,
        fragmentation_guard: int | None = None,
        subgroups: SubGroups | None = None,
    ) -> GangResult:
        """Place ``min_member`` members all together or none, in the members' order (a
        member that does not fit is passed while enough others may still make
        ``min_member``); the rest if they fit.
        Given a ``statement``, a placed gang's grants are committed into it;
        ``fragmentation_guard`` is each member's (see :meth:`place`). With ``subgroups``
        (a PodGroup's ``subGroupPolicy``), see :meth:`_place_subgroups`."""
        if subgroups is not None and subgroups.subgroups:
            return self._place_subgroups(
                members,
                min_member,
                subgroups,
                partial(
                    self._place_member,
                    owner=owner,
                    trial=trial,
                    fragmentation_guard=fragmentation_guard,
                ),
                statement,
            )
        placed: list[Placement] = []
        failures: list[Failure] = []
        required = min(max(min_member, 1), len(members))
        spare = len(members) - required  # how many may fail, as Volcano counts ready tasks
        with Statement(self.ledger, statement) as gang:
            for m in members:
                result = self._place_member(
                    m, gang, owner=owner, trial=trial, fragmentation_guard=fragmentation_guard
                )
                if isinstance(result, Placement):
                    placed.append(result)
                    continue
                failures.append(result)
                if len(failures) > spare:
                    # As Volcano counts it: minMember less the tasks ready (none, after
                    # the rollback the statement does on leaving the block).
                    context = f"{required}/{len(members)} tasks in gang unschedulable"
                    return GangResult(status=result.status.with_context(context), failures=failures)
            gang.commit()
        return GangResult(status=SUCCESS, placed=placed, failures=failures)

    def _place_member(
        self,
        m: GangMember,
        statement: Statement,
        *,
        owner: GangKey | None,
        trial: bool,
        fragmentation_guard: int | None,
    ) -> Placement | Failure:
        """One member, within the gang's ``statement``."""
        return self.place(
            m.pod,
            m.request,
            m.group,
            spec=m.spec,
            owner=owner,
            trial=trial,
            statement=statement,
            fragmentation_guard=fragmentation_guard,
        )

    def _place_subgroups(
        self,
        members: Sequence[GangMember],
        min_member: int,
        layout: SubGroups,
        place: Callable[[GangMember, Statement], Placement | Failure],
        statement: Statement | None,
    ) -> GangResult:
        """A gang of subgroups, in one statement: first the subgroups each policy
        requires, each whole in a nested statement (its first ``need`` pods together,
        then its further pods each if they fit), trying the policy's subgroups in order
        until enough fit; then every other loose pod and subgroup in the members' order,
        a subgroup again whole or not at all. Placed only if every policy got its
        subgroups and ``min_member`` pods are placed; otherwise nothing is."""
        placed: list[Placement] = []
        failures: list[Failure] = []
        by_uid = {m.pod.uid: m for m in members}
        parts = {s.name: (s, [by_uid[u] for u in s.pods if u in by_uid]) for s in layout.subgroups}
        part_of = {u: s.name for s in layout.subgroups for u in s.pods}
        tried: set[str] = set()

        def keep(result: Placement | Failure) -> None:
            if isinstance(result, Placement):
                placed.append(result)
            else:
                failures.append(result)

        def whole(name: str, st: Statement) -> Failure | None:
            """Place one subgroup whole, or none of it (every pod of it then fails)."""
            tried.add(name)
            sub, pods = parts[name]
            core: list[Placement] = []
            with Statement(self.ledger, st) as part:
                for m in pods[: sub.need]:
                    result = place(m, part)
                    if isinstance(result, Failure):
                        context = f"subgroup {name}: {sub.need} pods together"
                        status = result.status.with_context(context)
                        failures.extend(Failure(pod=p.pod, status=status) for p in pods)
                        return Failure(pod=m.pod, status=status)
                    core.append(result)
                part.commit()
            placed.extend(core)
            for m in pods[sub.need :]:
                keep(place(m, st))
            return None

        with Statement(self.ledger, statement) as gang:
            for policy, least in layout.required.items():
                got, last = 0, None
                for name, (sub, _) in parts.items():
                    if got >= least:
                        break
                    if sub.policy == policy and sub.need and name not in tried:
                        last = whole(name, gang)
                        if last is None:
                            got += 1
                if got < least:
                    context = f'{least - got}/{least} subgroups of "{policy}" unschedulable'
                    status = (last.status if last else fail(_NO_SUBGROUP)).with_context(context)
                    return GangResult(status=status, failures=failures or _all(members, status))
            for m in members:
                its = part_of.get(m.pod.uid)
                if its is None:
                    keep(place(m, gang))
                elif its not in tried:
                    whole(its, gang)
            required = min(max(min_member, 1), len(members))
            if len(placed) < required:
                context = f"{required - len(placed)}/{len(members)} tasks in gang unschedulable"
                last = failures[-1] if failures else None
                status = (last.status if last else fail(_NO_SUBGROUP)).with_context(context)
                return GangResult(status=status, failures=failures or _all(members, status))
            gang.commit()
        return GangResult(status=SUCCESS, placed=placed, failures=failures)


def _all(members: Sequence[GangMember], status: Status) -> list[Failure]:
    """Every member failed for ``status``."""
    return [Failure(pod=m.pod, status=status) for m in members]


_EMPTY = NodeState(NodeName(""))
_NO_SUBGROUP = Reason(kind="waiting", detail="no subgroup left to place")
_NO_DEVICES = Reason(kind="no-devices", code=UNRESOLVABLE)
_TRIAL_MISS = fail(Reason(kind="waiting", detail="does not fit"))


class WalkOrder(NodePolicyPlugin):
    """A node policy that walks the device index in its own order (``policy``: binpack
    or spread) and takes the first node that fits (shared/core/plugins/binpack.py)."""

    weight = 5
    """The weight of the walk's order among a window's scores: kube-scheduler's own
    weigh 1 to 3 each (0 to 100 points per plugin), so 5 keeps device packing first."""

    def choose(self, choice: Choice) -> Chosen | None:
        """The first fit of the walk (a pod with no devices: of every node in turn)."""
        placer = choice.placer
        if choice.primary is None:
            rotation = placer.rotation(choice.owner, choice.prep)
            return placer.first_fit(rotation, choice, self.weight_in_window, rotate=True)
        walk = placer.candidates(
            choice.request, choice.primary, choice.policy, choice.owner, choice.prep
        )
        return placer.first_fit(walk, choice, self.weight_in_window)
