"""Consolidation: move shared-GPU pods to other nodes so that a gang fits.

A gang that fits nowhere may fit once a few fractional pods on one node run elsewhere.
The coordinator offers the pods that may move (:func:`movable`: lone pods that a
controller recreates, marked ``volcano.sh/preemptable: "true"`` or offered to preemption
for this gang, past their minimum runtime); :func:`plan` picks the moves, and the
allocator (shared/core/room.py ``Room.consolidate``) reserves each moved pod's new place
before anything is evicted.

The search is bounded, never every combination. Per node holding offered pods, the
cheapest clearing is reckoned without placing anything (:func:`_clearing`: the fewest,
smallest pods whose leaving frees the cards the gang's pod needs, then its cpu and
memory); at most :data:`MAX_SEEDS` of the cheapest nodes are tried. On each, those pods
are taken off one by one until a trial placement of the gang fits (at most
``max_moves``); pods not needed are put back, as ``preemption.plan`` prunes.
The scenario is then played out in a statement: the gang placed, then every moved pod
placed again by FGD (shared/core/plugins/fgd.py), never on the node it leaves. Of the
scenarios where every moved pod has a place, the fewest moves win, then the one that
leaves the nodes it touches least fragmented (FGD's measure). A scenario whose evictions
would overdraw a PodDisruptionBudget is refused (``preemption.overdrawn``). The ledger
is as it was when :func:`plan` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from shared.core.disruption import Budget
from shared.core.hierarchy import QueueTree
from shared.core.hosts import CPU, MEMORY
from shared.core.ledger import Ledger, NodeState, PodGrant, Statement
from shared.core.model import (
    DeviceRequest,
    GangKey,
    Movable,
    NodeName,
    PodRef,
    PodRequest,
    PodUID,
    VictimUnit,
)
from shared.core.placement import GangMember, Placement, Placer
from shared.core.plugins.fgd import node_fragmentation
from shared.core.policy import allows
from shared.core.preemption import Candidate, Protection, allowances, covering, overdrawn
from shared.core.queues import QueueSpec
from shared.core.subgroups import SubGroups

MAX_SEEDS = 8
"""Nodes tried as the one to clear, per plan: each costs a few trial placements."""
MAX_MOVABLE = 128
"""Movable pods the coordinator offers per gang: the smallest first (the easiest to
place elsewhere), the newest first among equals (bench/consolidation.py: the 64 newest
alone let almost no plan through on the openb trace)."""
PREEMPTABLE = "volcano.sh/preemptable"
"""Volcano's pod annotation (or label): ``"true"`` marks a pod that may be disturbed."""
MOVING = ".moving"
"""Suffix of the uid a moved pod's reserved place is held under in the ledger."""


Fits = Callable[[Statement], "tuple[Placement, ...] | None"]
"""A trial placement of the gang inside a statement: where it would go, or None."""


@dataclass(frozen=True, slots=True)
class Move:
    """One pod to move: where it runs and the place reserved for its recreated self."""

    pod: Movable
    origin: NodeName
    spot: PodGrant
    """Its grant at the destination, held under :func:`spot_ref` until taken or lapsed."""


@dataclass(frozen=True, slots=True)
class Consolidation:
    """The moves chosen, where the gang goes once they are done, and what they do to
    the expected fragmentation of the nodes they touch (negative: less fragmented)."""

    moves: tuple[Move, ...]
    placements: tuple[Placement, ...]
    fragmentation: float


class Mover(Candidate, Protocol):
    """A bound pod as :func:`movable` reads it (the coordinator's members)."""

    @property
    def request(self) -> PodRequest:
        """Its device request: only shared-GPU pods move, and the recreated pod must match."""
        ...

    @property
    def owner(self) -> str:
        """Its controller (``Kind/name``), "" for a bare pod."""
        ...

    @property
    def preemptable(self) -> bool:
        """Marked ``volcano.sh/preemptable: "true"``."""
        ...


def fractional(request: PodRequest) -> bool:
    """Does the pod share its GPU (one card, a part of its memory or cores)?"""
    asks = [d for c in request.containers for d in c.devices]
    return bool(asks) and all(
        d.count == 1
        and not d.exclusive
        and d.mig_profile is None
        and d.cores < 100
        and (d.memory_mib is not None or (d.memory_percent or 100) < 100 or d.cores > 0)
        for d in asks
    )


def movable(
    key: GangKey,
    queue: str,
    bound: Mapping[GangKey, Mapping[PodUID, Mover]],
    offered: Iterable[VictimUnit],
    protection: Protection,
    queues: Mapping[str, QueueSpec],
    tree: QueueTree | None,
    budgets: Mapping[str, Mapping[str, Budget]],
) -> tuple[Movable, ...]:
    """The bound pods that may be moved for gang ``key`` of ``queue``: lone pods with a
    controller, sharing a GPU, marked preemptable or among the preemption ``offered``,
    that have run their minimum runtime (``protection``, as preemption reads it; its
    ``soonest`` notes those held back). The least GPU memory first, then the newest; at
    most :data:`MAX_MOVABLE`."""
    victims = {p.uid for unit in offered for p in unit.pods}
    found: list[tuple[tuple[float, float], Movable]] = []
    for other, pods in bound.items():
        if other == key or not other.lone:
            continue
        for s in pods.values():
            if not s.owner or not (s.preemptable or s.pod.uid in victims):
                continue
            if not fractional(s.request):
                continue
            minimum = protection.minimum(queue, s.queue, s.queue != queue, queues, tree)
            left = protection.left((s,), minimum)
            if left > 0:
                protection.soonest = min(protection.soonest, left)
                continue
            move = Movable(
                pod=s.pod, request=s.request, owner=s.owner, budgets=covering(s, budgets)
            )
            memory = float(sum(v for k, v in s.vector.items() if k.endswith(".memory")))
            found.append(((memory, -s.created_at), move))
    found.sort(key=lambda f: f[0])
    return tuple(m for _, m in found[:MAX_MOVABLE])


def moved_allowances(
    moving: Iterable[Movable], budgets: Mapping[str, Mapping[str, Budget]]
) -> dict[str, int]:
    """What each PodDisruptionBudget that ``moving`` count against allows now (as
    ``preemption.allowances`` reads it for victims)."""
    return allowances((VictimUnit(pods=(m.pod,), budgets=(m.budgets,)) for m in moving), budgets)


def spot_ref(pod: PodRef) -> PodRef:
    """The ledger's name for the place reserved for a moved ``pod``."""
    return msgspec.structs.replace(pod, uid=PodUID(pod.uid + MOVING))


def plan(
    placer: Placer,
    members: Sequence[GangMember],
    min_member: int,
    offered: Sequence[Movable],
    *,
    max_moves: int,
    allowed: Mapping[str, int],
    owner: GangKey | None = None,
    fragmentation_guard: int | None = None,
    subgroups: SubGroups | None = None,
) -> Consolidation | str | None:
    """The moves that let the gang fit (see the module doc), or why none do (a sentence
    for its pods' message), or None when no offered pod runs here. ``allowed``: what
    each PodDisruptionBudget allows now. The ledger is left as it was."""
    ledger = placer.ledger
    grants = {m.pod.uid: ledger.pods[m.pod.uid] for m in offered if m.pod.uid in ledger.pods}
    if not grants or max_moves <= 0:
        return None
    by_node: dict[NodeName, list[Movable]] = {}
    for m in offered:
        if m.pod.uid in grants:
            by_node.setdefault(grants[m.pod.uid].node, []).append(m)
    ordered: dict[NodeName, list[Movable]] = {}
    cost: dict[NodeName, tuple[int, float]] = {}
    for n, pods in by_node.items():
        found = _clearing(ledger, n, pods, grants, members, max_moves)
        if found is not None:
            cost[n], ordered[n] = found
    seeds = sorted(ordered, key=lambda n: (*cost[n], n))

    def fits(st: Statement) -> tuple[Placement, ...] | None:
        with Statement(ledger, st) as probe:
            result = placer.place_gang(
                members,
                min_member,
                owner=owner,
                trial=True,
                statement=probe,
                fragmentation_guard=fragmentation_guard,
                subgroups=subgroups,
            )
        return tuple(result.placed) if result.ok else None

    best: Consolidation | None = None
    why = f"moving up to {max_moves} shared-GPU pod(s) would not make room"
    for seed in seeds[:MAX_SEEDS]:
        chosen = _clear(ledger, ordered[seed], grants, max_moves, fits)
        if chosen is None:
            continue
        units = [VictimUnit(pods=(m.pod,), budgets=(m.budgets,)) for m in chosen]
        broken = overdrawn(units, allowed)
        if broken:
            why = f"moving would violate PodDisruptionBudget {', '.join(broken)}"
            continue
        played = _play(placer, members, min_member, chosen, grants, fits)
        if isinstance(played, str):
            why = played
            continue
        if best is None or (len(played.moves), played.fragmentation) < (
            len(best.moves),
            best.fragmentation,
        ):
            best = played
    return best if best is not None else f"Consolidation: {why}."


def _share(ledger: Ledger, grant: PodGrant) -> dict[str, float]:
    """The share of each card ``grant`` holds (by memory, or cores when it names none)."""
    node = ledger.nodes[grant.node]
    out: dict[str, float] = {}
    for g in grant.device_grants():
        dev = node.by_uuid.get(g.uuid)
        if dev is None:
            continue
        part = g.memory_mib / dev.total_mem if dev.total_mem else g.cores / 100
        out[g.uuid] = out.get(g.uuid, 0.0) + min(part, 1.0)
    return out


def _clearing(
    ledger: Ledger,
    node: NodeName,
    pods: list[Movable],
    grants: Mapping[PodUID, PodGrant],
    members: Sequence[GangMember],
    max_moves: int,
) -> tuple[tuple[int, float], list[Movable]] | None:
    """The cheapest way to clear ``node`` for one member of the gang, reckoned without
    a trial placement: for the cards of an allowed type it needs, the fewest and
    smallest of ``pods`` whose leaving frees its share, then more (smallest first) while
    its cpu or memory is short. The cost (moves, GPU share moved) and the pods in order;
    None when no member could fit there within ``max_moves`` (a necessary test only:
    the trial placement decides)."""
    state = ledger.nodes[node]
    on: dict[str, list[tuple[float, Movable]]] = {}
    for m in pods:
        share = _share(ledger, grants[m.pod.uid])
        card = max(share, key=lambda u: share[u], default="")
        on.setdefault(card, []).append((sum(share.values()), m))
    for listed in on.values():
        listed.sort(key=lambda x: (x[0], x[1].pod.uid))
    best: tuple[tuple[int, float], list[Movable]] | None = None
    for member in members:
        asks = [d for k in member.request.containers for d in k.devices]
        c = member.request.constraints
        cards: list[tuple[int, float, list[tuple[float, Movable]]]] = []
        for dev in state.devices:
            if asks and not allows(dev.model_lc, c.use_types, c.nouse_types):
                continue
            need = max((_part(d, dev.total_mem) for d in asks), default=0.0)
            free = dev.free_fraction()
            taken: list[tuple[float, Movable]] = []
            for part, m in on.get(dev.uuid, ()):
                if free + 1e-9 >= need:
                    break
                free += part
                taken.append((part, m))
            if free + 1e-9 >= need:
                cards.append((len(taken), sum(x for x, _ in taken), taken))
        cards.sort(key=lambda x: (x[0], x[1]))
        count = max((d.count for d in asks), default=0)
        if len(cards) < count:
            continue
        chosen = [x for card in cards[:count] for x in card[2]]
        rest = sorted(
            (x for listed in on.values() for x in listed if x not in chosen),
            key=lambda x: (x[0], x[1].pod.uid),
        )
        while not _host_room(state, member, [m for _, m in chosen], grants) and rest:
            chosen.append(rest.pop(0))
        if len(chosen) > max_moves or not _host_room(state, member, [m for _, m in chosen], grants):
            continue
        key = (len(chosen), sum(x for x, _ in chosen))
        if best is None or key < best[0]:
            best = (key, [m for _, m in chosen])
    return best


def _host_room(
    state: NodeState, member: GangMember, leaving: list[Movable], grants: Mapping[PodUID, PodGrant]
) -> bool:
    """Has the node the member's cpu and memory once ``leaving`` have left?"""
    spec = state.host.spec
    if spec is None or member.spec is None:
        return True
    used, alloc, want = state.host.requested, spec.allocatable, member.spec.requests
    for name in (CPU, MEMORY):
        freed = sum(
            g.spec.requests.get(name, 0)
            for m in leaving
            if (g := grants[m.pod.uid]).spec is not None
        )
        if want.get(name, 0) > alloc.get(name, 0) - used.get(name, 0) + freed:
            return False
    return True


def _part(d: DeviceRequest, total_mib: int) -> float:
    """The least share of one card the request ``d`` needs (0 for a MIG instance)."""
    if d.mig_profile is not None:
        return 0.0
    if d.memory_mib is not None and total_mib:
        return min(1.0, d.memory_mib / total_mib)
    if d.memory_percent is not None:
        return d.memory_percent / 100
    return min(1.0, d.cores / 100) if d.cores else 1.0


def _clear(
    ledger: Ledger,
    pods: list[Movable],
    grants: Mapping[PodUID, PodGrant],
    max_moves: int,
    fits: Fits,
) -> list[Movable] | None:
    """The fewest of ``pods`` (in their order, then pruned) whose leaving lets the gang
    fit, at most ``max_moves``; None if those are not enough."""
    chosen: list[Movable] = []
    with Statement(ledger) as st:
        found = None
        for m in pods[:max_moves]:
            st.release(m.pod.uid)
            chosen.append(m)
            found = fits(st)
            if found is not None:
                break
        if found is None:
            return None
        for m in list(reversed(chosen)):  # put back what is not needed, last taken first
            st.grant(grants[m.pod.uid])
            if fits(st) is not None:
                chosen.remove(m)
            else:
                st.release(m.pod.uid)
    return chosen


def _play(
    placer: Placer,
    members: Sequence[GangMember],
    min_member: int,
    chosen: list[Movable],
    grants: Mapping[PodUID, PodGrant],
    fits: Fits,
) -> Consolidation | str:
    """Evict ``chosen``, place the gang, then each moved pod again by FGD elsewhere (all
    in a statement, undone); the scenario, or why a moved pod would have nowhere to go."""
    ledger = placer.ledger
    fgd = "fgd" in placer.policies
    touched: set[NodeName] = set()
    moves: list[Move] = []
    with Statement(ledger) as st:
        for m in chosen:
            st.release(m.pod.uid)
        placed = fits(st)
        if placed is None:
            return "the gang would not fit after the moves"
        for p in placed:
            grant = PodGrant(pod=p.pod, node=p.node, containers=p.grants)
            st.grant(grant)
            touched.add(p.node)
        for m in chosen:
            origin = grants[m.pod.uid].node
            request = m.request
            if fgd:
                fgd_constraints = msgspec.structs.replace(request.constraints, node_policy="fgd")
                request = msgspec.structs.replace(request, constraints=fgd_constraints)
            ref = spot_ref(m.pod)
            spec = grants[m.pod.uid].spec
            if spec is not None and spec.node_name:  # its recreated self names no node
                spec = msgspec.structs.replace(spec, node_name="")
            with Statement(ledger, st) as again:
                result = placer.place(ref, request, spec=spec, trial=True, statement=again)
                if isinstance(result, Placement) and result.node != origin:
                    again.commit()
            if not isinstance(result, Placement) or result.node == origin:
                return f"moving {m.pod} would make room, but it would have nowhere to go"
            spot = PodGrant(pod=ref, node=result.node, containers=result.grants, spec=spec)
            moves.append(Move(pod=m, origin=origin, spot=spot))
            touched.update((origin, result.node))
        after = sum(node_fragmentation(placer, ledger.nodes[n]) for n in touched)
    before = sum(node_fragmentation(placer, ledger.nodes[n]) for n in touched)
    return Consolidation(moves=tuple(moves), placements=placed, fragmentation=after - before)
