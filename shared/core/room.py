"""Making room for a gang that does not fit: preemption nominations and starvation holds.

Which bound pods may go is the coordinator's offer (shared/core/preemption.py
``victims``); which of them must go is ``preemption.plan`` on the ledger. Here:

- a *nomination* keeps the devices of the pods evicted for a gang booked after they are
  gone, until the gang is placed on them, so no other pod takes what was freed for it;
- a *hold* (the starvation guard) closes the nodes a long-waiting gang would fit on to
  every other gang until their pods finish (``Placer.reserved_nodes``).

Both lapse after ``HOLD_S`` if the gang does not come back (the coordinator retries a
waiting gang at least every minute). Nothing here reads a clock: every call that weighs
time is given ``now`` (seconds since the epoch). The devices a nomination gives back go
through a ``Statement`` (shared/core/ledger.py), so an error midway leaves the ledger
as it was.

:meth:`Room.make_room` is what the allocator does for a gang it cannot place, as
kube-scheduler's PostFilter does for a pod: it runs the profile's PostFilter plugins
(shared/core/plugins/default_preemption.py, starvation_hold.py) on the room kept here.
A gang whose victims are still leaving preempts no more (kube-scheduler: "not eligible
due to a terminating pod on the nominated node"); DefaultPreemption tells a gang with a
pod of preemptionPolicy ``Never`` that it evicts no one, in kube-scheduler's words, or
preempts (:meth:`Room.preempt`), telling its pods which PodDisruptionBudgets were
respected or broken, and names the node each pod will go to (``nominated``: the binder
writes it as ``status.nominatedNodeName``). A gang for which
no room is made any more has that name cleared; binding clears it too (the API server
does, since Kubernetes 1.35). What it comes to is a :class:`Made`, data only: the
allocator publishes it (services/device_allocator/outcomes.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from shared.core import consolidation
from shared.core.hosts import PodSpec
from shared.core.ledger import PodGrant, Statement
from shared.core.model import GangKey, Movable, NodeName, PodRef, PodRequest, PodUID, VictimUnit
from shared.core.placement import GangMember, Placement, Placer
from shared.core.preemption import Plan, budget_note, marked, plan
from shared.core.status import Status
from shared.core.subgroups import SubGroups

HOLD_S = 120.0
"""A nomination or node hold lapses if its gang has not come back in this time."""


@dataclass
class Nomination:
    """Pods being evicted for a gang; their devices stay booked for it once they are gone."""

    victims: set[PodUID]
    until: float
    gone: set[PodUID] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A gang that was not placed, as making room for it reads it."""

    key: GangKey
    members: Sequence[GangMember]
    """Its pods still to place."""
    min_member: int
    policies: tuple[str, ...] = ()
    """Its pods' ``preemptionPolicy``."""
    victims: tuple[VictimUnit, ...] = ()
    """What the coordinator offers to preempt for it, cheapest first."""
    budgets: Mapping[str, int] = field(default_factory=dict)
    """What each PodDisruptionBudget ``victims`` count against allows now."""
    hold: bool = False
    """It has waited past ``scheduler.starvationGuardS``: hold nodes for it."""
    fragmentation_guard: int | None = None
    """The guard its placement ran with (shared/core/pace.py): the trial placements of
    making room run with the same."""
    protected_s: float = 0.0
    """Pods that could have been offered have not run their minimum runtime: the first
    may go in this many seconds (0: none)."""
    subgroups: SubGroups | None = None
    """Its subgroups (shared/core/subgroups.py): room is made for it placed by them."""
    movable: tuple[Movable, ...] = ()
    """Pods the coordinator offers to move for it (shared/core/consolidation.py)."""


@dataclass(frozen=True, slots=True)
class Spot:
    """The place reserved for a moved pod's recreated self: its grant is held in the
    ledger under ``grant.pod`` (``consolidation.spot_ref``) until taken or lapsed."""

    owner: str
    namespace: str
    request: PodRequest
    grant: PodGrant
    until: float


@dataclass(frozen=True, slots=True)
class Preempting:
    """Pods to evict for a gang, and where it goes once they are gone."""

    victims: tuple[VictimUnit, ...]
    """The units chosen, each saying which budget its eviction breaks, if any."""
    nodes: tuple[NodeName, ...]
    pods: tuple[PodUID, ...]
    moves: dict[PodUID, NodeName] = field(default_factory=dict)
    """Consolidation: each moved pod's new node (a place is reserved for it there)."""


@dataclass(frozen=True, slots=True)
class Made:
    """What making room for a gang that is not placed came to."""

    preempting: Preempting | None = None
    """Pods to evict for it, if any (the allocator publishes ``allocation.preempting``)."""
    note: str = ""
    """What its pods' message says of it, after the reasons."""
    nominated: dict[PodUID, NodeName] = field(default_factory=dict)
    """``status.nominatedNodeName`` to write: a node, or "" to clear it."""
    starved: tuple[NodeName, ...] = ()
    """Nodes held for it from now on (none when its hold was only renewed)."""


@dataclass(frozen=True, slots=True)
class Lapsed:
    """Nominations and holds whose gang did not come back in time, now ended."""

    freed: dict[GangKey, list[PodGrant]] = field(default_factory=dict)
    """Per lapsed nomination, the devices of its gone victims, given back."""
    holds: tuple[GangKey, ...] = ()
    spots: tuple[PodGrant, ...] = ()
    """Places reserved for moved pods that were not taken in time, now freed."""


class Room:
    """The allocator's nominations and holds (one instance, beside its ledger)."""

    def __init__(self, placer: Placer, *, max_moves: int = 0, reserve_s: float = HOLD_S) -> None:
        self.placer = placer
        self.max_moves = max_moves
        """``scheduler.consolidation.maxMoves`` (0: no pod is moved)."""
        self.reserve_s = reserve_s
        """``scheduler.consolidation.reserveS``: how long a moved pod's place waits."""
        self.spots: dict[PodUID, Spot] = {}
        """Places reserved for moved pods, by the uid they are held under."""
        self.nominated: dict[GangKey, tuple[PodRef, ...]] = {}
        """Gangs whose pods were given a nominated node, until placed or it is cleared."""
        self.nominations: dict[GangKey, Nomination] = {}
        self.doomed: dict[PodUID, GangKey] = {}
        """Pods being preempted → the gang their devices are kept for."""
        self.holds: dict[GangKey, float] = {}
        """Gangs with nodes held for them (``placer.reserved_nodes``) → when the hold lapses."""
        self.released: dict[GangKey, tuple[frozenset[PodUID], float]] = {}
        """Gangs whose evicted pods are gone → those pods and when this lapses: their DRA
        claims count as free for the gang's placements (kube-controller-manager may not
        have deallocated them yet; no other gang's) until it is placed."""

    def waiting(self, key: GangKey, now: float) -> str | None:
        """Why the gang waits for its preemption to finish; None when it may be placed
        (its gone victims' devices are then freed for it)."""
        nom = self.nominations.get(key)
        if nom is None:
            return None
        alive = nom.victims - nom.gone
        if alive and now < nom.until:
            return f"waiting for {len(alive)} preempted pod(s) to exit"
        if nom.gone:
            self.released[key] = (frozenset(nom.gone), now + HOLD_S)
        self.end_nomination(key)
        return None

    def end_nomination(self, key: GangKey) -> list[PodGrant]:
        """Free the devices kept for ``key`` (one statement: all or none); victims still
        running are no longer doomed."""
        nom = self.nominations.get(key)
        if nom is None:
            return []
        freed = []
        with Statement(self.placer.ledger) as st:
            for uid in nom.victims:
                if uid in nom.gone:
                    grant = st.release(uid)
                    if grant is not None:
                        freed.append(grant)
            st.commit()
        del self.nominations[key]
        for uid in nom.victims:
            self.doomed.pop(uid, None)
        return freed

    def gone(self, pod: PodRef) -> GangKey | None:
        """A pod left: if it was preempted, its devices stay kept for the gang (returned);
        else None (the caller releases it)."""
        owner = self.doomed.get(pod.uid)
        nom = self.nominations.get(owner) if owner is not None else None
        if nom is None or owner is None:
            return None
        nom.gone.add(pod.uid)
        return owner

    def all_gone(self, key: GangKey) -> bool:
        """Have all the pods preempted for ``key`` left?"""
        nom = self.nominations.get(key)
        return nom is not None and nom.victims <= nom.gone

    def make_room(self, gang: Unplaced, status: Status, *, now: float) -> Made:
        """The profile's PostFilters for a gang that is not placed, in order until one
        evicts for it (see the module doc); ``status`` is why it was not placed. Its
        nominated nodes are cleared unless room is made now."""
        key = gang.key
        if key in self.nominations:
            return Made()  # its victims are still leaving
        notes: list[str] = []
        starved: tuple[NodeName, ...] = ()
        for plugin in self.placer.ledger.hosts.profile.post_filters:
            made = plugin.post_filter(self, gang, status, now)
            if made is None:
                continue
            if made.preempting is not None:  # room made: the round ends here
                note = " ".join([*notes, made.note])
                return replace(made, note=note, starved=starved + made.starved)
            if made.note:
                notes.append(made.note)
            starved += made.starved
        cleared = {p.uid: NodeName("") for p in self.nominated.pop(key, ())}
        return Made(note=" ".join(notes), nominated=cleared, starved=starved)

    def preempt(self, gang: Unplaced, now: float) -> Made | None:
        """Nominate the smallest set of the offered units whose eviction lets the gang
        fit (units already being evicted for another gang are not offered twice)."""
        found = self._plan(gang, [v for v in gang.victims if not self._doomed(v)])
        if found is None:
            return None
        nodes = self._nominate(gang.key, found.pods, found.placements, now)
        budgets = budget_note(found.units, gang.victims, gang.budgets)
        return Made(
            preempting=Preempting(
                victims=marked(found.units, gang.budgets), nodes=nodes, pods=found.pods
            ),
            note=f"Preempting {len(found.pods)} pod(s) to make room on {', '.join(nodes)}"
            f"{budgets}.",
            nominated={p.pod.uid: p.node for p in found.placements},
        )

    def _nominate(
        self, key: GangKey, pods: Sequence[PodUID], placements: Sequence[Placement], now: float
    ) -> tuple[NodeName, ...]:
        """The gang waits for ``pods`` to go (each doomed for it, not offered to another),
        nominated to ``placements``; the nodes it will use."""
        self.nominations[key] = Nomination(victims=set(pods), until=now + HOLD_S)
        for uid in pods:
            self.doomed[uid] = key
        self.nominated[key] = tuple(p.pod for p in placements)
        return tuple(sorted({p.node for p in placements}))

    def _doomed(self, unit: VictimUnit) -> bool:
        return any(p.uid in self.doomed for p in unit.pods)

    def _plan(self, gang: Unplaced, units: Sequence[VictimUnit]) -> Plan | None:
        return plan(
            self.placer,
            gang.members,
            gang.min_member,
            units,
            owner=gang.key,
            fragmentation_guard=gang.fragmentation_guard,
            subgroups=gang.subgroups,
        )

    def placed(self, key: GangKey) -> None:
        """The gang is placed: its hold ends, and binding clears its nominated nodes."""
        self.nominated.pop(key, None)
        self.released.pop(key, None)
        self.drop_hold(key)

    def hold(self, gang: Unplaced, now: float) -> tuple[list[NodeName], bool]:
        """Hold the nodes the gang would fit on once their pods finish (fewest pods
        first), or renew its hold; the nodes held, and whether the hold is new."""
        key = gang.key
        reserved = self.placer.reserved_nodes
        if key in self.holds:
            self.holds[key] = now + HOLD_S
            return sorted(n for n, owner in reserved.items() if owner == key), False
        by_node: dict[NodeName, list[PodRef]] = {}
        for uid, grant in self.placer.ledger.pods.items():
            if uid not in self.doomed and reserved.get(grant.node, key) == key:
                by_node.setdefault(grant.node, []).append(grant.pod)
        units = sorted(
            (VictimUnit(pods=tuple(pods)) for pods in by_node.values()), key=lambda u: len(u.pods)
        )
        found = self._plan(gang, units)
        if found is None:
            return [], False
        nodes = sorted({p.node for p in found.placements})
        for node in nodes:
            reserved[node] = key
        self.holds[key] = now + HOLD_S
        return nodes, True

    def drop_hold(self, key: GangKey) -> None:
        """Open the nodes held for ``key`` to every gang again."""
        if self.holds.pop(key, None) is not None:
            reserved = self.placer.reserved_nodes
            for node in [n for n, owner in reserved.items() if owner == key]:
                del reserved[node]

    def lapsed(self, now: float) -> Lapsed:
        """End the nominations and holds whose gang did not come back by ``now``. A
        lapsed nomination's nominated nodes are left to its pods' binds."""
        freed = {}
        for key in [k for k, n in self.nominations.items() if n.until <= now]:
            self.nominated.pop(key, None)
            freed[key] = self.end_nomination(key)
        for key in [k for k, (_, until) in self.released.items() if until <= now]:
            del self.released[key]
        holds = tuple(k for k, until in self.holds.items() if until <= now)
        for key in holds:
            self.drop_hold(key)
        spots = []
        for uid in [u for u, s in self.spots.items() if s.until <= now]:
            del self.spots[uid]
            grant = self.placer.ledger.release(uid)
            if grant is not None:
                spots.append(grant)
        return Lapsed(freed=freed, holds=holds, spots=tuple(spots))

    def consolidate(self, gang: Unplaced, now: float) -> Made | None:
        """Move offered pods so the gang fits (shared/core/consolidation.py): each moved
        pod's new place is reserved now, before any is evicted, and what they leave is
        kept for the gang as a preemption's is; a note saying why not when no moves do."""
        offered = [m for m in gang.movable if m.pod.uid not in self.doomed]
        found = consolidation.plan(
            self.placer,
            gang.members,
            gang.min_member,
            offered,
            max_moves=self.max_moves,
            allowed=gang.budgets,
            owner=gang.key,
            fragmentation_guard=gang.fragmentation_guard,
            subgroups=gang.subgroups,
        )
        if found is None:
            return None
        if isinstance(found, str):
            return Made(note=found)
        with Statement(self.placer.ledger) as st:
            for move in found.moves:
                st.grant(move.spot)
            st.commit()
        for move in found.moves:
            self.spots[move.spot.pod.uid] = Spot(
                owner=move.pod.owner,
                namespace=move.pod.pod.namespace,
                request=move.pod.request,
                grant=move.spot,
                until=now + self.reserve_s,
            )
        pods = tuple(m.pod.pod.uid for m in found.moves)
        nodes = self._nominate(gang.key, pods, found.placements, now)
        units = tuple(
            VictimUnit(
                pods=(m.pod.pod,),
                why=f"moved to {m.spot.node} to make room on {m.origin} (consolidation)",
                budgets=(m.pod.budgets,) if m.pod.budgets else (),
            )
            for m in found.moves
        )
        where = ", ".join(f"{m.pod.pod} to {m.spot.node}" for m in found.moves)
        return Made(
            preempting=Preempting(
                victims=units,
                nodes=nodes,
                pods=pods,
                moves={m.pod.pod.uid: m.spot.node for m in found.moves},
            ),
            note=f"Moving {len(pods)} pod(s) to make room on {', '.join(nodes)}: {where}; "
            f"their controllers recreate them there.",
            nominated={p.pod.uid: p.node for p in found.placements},
        )

    def take_spot(
        self, pod: PodRef, owner: str, request: PodRequest, spec: PodSpec | None
    ) -> PodGrant | None:
        """A recreated pod (same controller, same request) takes the place reserved for
        the pod it replaces: the held grant becomes its own (one statement); None when no
        place waits for it."""
        if not owner:
            return None
        for uid, spot in self.spots.items():
            if spot.owner == owner and spot.namespace == pod.namespace and spot.request == request:
                held = spot.grant
                grant = PodGrant(pod=pod, node=held.node, containers=held.containers, spec=spec)
                with Statement(self.placer.ledger) as st:
                    st.release(uid)
                    if not st.grant(grant):
                        return None  # left as it was: the statement undoes the release
                    st.commit()
                del self.spots[uid]
                return grant
        return None
