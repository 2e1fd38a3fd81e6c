"""Making room for a gang that does not fit: preemption and holds, the allocator's side.

Which bound pods may go is the coordinator's offer (shared/core/preemption.py
``victims``); which of them must go is ``preemption.plan`` on the ledger. Here:

- a *nomination* keeps the devices of the pods evicted for a gang booked after they are
  gone, until the gang is placed on them, so no other pod takes what was freed for it;
- a *hold* (the starvation guard) closes the nodes a long-waiting gang would fit on to
  every other gang until their pods finish.

Both lapse after ``HOLD_S`` if the gang does not come back (the coordinator retries a
waiting gang at least every minute).

:meth:`Room.make_room` is what the allocator does for a gang it cannot place, as
kube-scheduler's PostFilter does for a pod: a gang with a pod of preemptionPolicy
``Never`` evicts no one and is told so in kube-scheduler's words; a gang whose victims
are still leaving preempts no more (kube-scheduler: "not eligible due to a terminating
pod on the nominated node"); otherwise it preempts, telling its pods which
PodDisruptionBudgets were respected or broken, and names the node each pod will go to
(``nominated``: the binder writes it as ``status.nominatedNodeName``). A gang for which
no room is made any more has that name cleared; binding clears it too (the API server
does, since Kubernetes 1.35).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from shared import events as ev
from shared.core.ledger import PodGrant
from shared.core.model import GangKey, NodeName, PodRef, PodUID, VictimUnit
from shared.core.placement import GangMember, Placer
from shared.core.preemption import NOT_ELIGIBLE, Plan, budget_note, eligible, marked, plan
from shared.core.status import Status

log = logging.getLogger(__name__)

HOLD_S = 120.0
"""A nomination or node hold lapses if its gang has not come back in this time."""


@dataclass
class Nomination:
    """Pods being evicted for a gang; their devices stay booked for it once they are gone."""

    victims: set[PodUID]
    until: float
    gone: set[PodUID] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Made:
    """What making room for a gang that is not placed came to."""

    events: tuple[ev.Event, ...] = ()
    """A ``PreemptionDecided`` to publish, if any."""
    note: str = ""
    """What its pods' message says of it, after the reasons."""
    nominated: dict[PodUID, NodeName] = field(default_factory=dict)
    """``status.nominatedNodeName`` to write: a node, or "" to clear it."""


class Room:
    """The allocator's nominations and holds (one instance, beside its ledger)."""

    def __init__(self, placer: Placer) -> None:
        self.placer = placer
        self.nominated: dict[GangKey, tuple[PodRef, ...]] = {}
        """Gangs whose pods were given a nominated node, until placed or it is cleared."""
        self.nominations: dict[GangKey, Nomination] = {}
        self.doomed: dict[PodUID, GangKey] = {}
        """Pods being preempted → the gang their devices are kept for."""
        self.holds: dict[GangKey, float] = {}
        """Gangs with nodes held for them (``placer.reserved_nodes``) → when the hold lapses."""

    def waiting(self, key: GangKey) -> str | None:
        """Why the gang waits for its preemption to finish; None when it may be placed
        (its gone victims' devices are then freed for it)."""
        nom = self.nominations.get(key)
        if nom is None:
            return None
        alive = nom.victims - nom.gone
        if alive and time.time() < nom.until:
            return f"waiting for {len(alive)} preempted pod(s) to exit"
        self.end_nomination(key)
        return None

    def end_nomination(self, key: GangKey) -> list[PodGrant]:
        """Free the devices kept for ``key``; victims still running are no longer doomed."""
        nom = self.nominations.pop(key, None)
        if nom is None:
            return []
        freed = []
        for uid in nom.victims:
            self.doomed.pop(uid, None)
            if uid in nom.gone:
                grant = self.placer.ledger.release(uid)
                if grant is not None:
                    freed.append(grant)
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
        nom = self.nominations.get(key)
        return nom is not None and nom.victims <= nom.gone

    def preempt(
        self, key: GangKey, members: list[GangMember], min_member: int, offered: list[VictimUnit]
    ) -> Plan | None:
        """The smallest set of the offered units whose eviction lets the gang fit (units
        already being evicted for another gang are not offered twice); nominated."""
        free = [v for v in offered if not any(p.uid in self.doomed for p in v.pods)]
        found = plan(self.placer, members, min_member, free, owner=key)
        if found is None:
            return None
        self.nominations[key] = Nomination(victims=set(found.pods), until=time.time() + HOLD_S)
        for uid in found.pods:
            self.doomed[uid] = key
        return found

    def make_room(
        self, gang: ev.GangReady, members: list[GangMember], status: Status, *, preempt: bool
    ) -> Made:
        """Preempt for a gang that is not placed (if it may), else hold nodes for it (if
        it has starved); see the module doc. ``status`` is why it was not placed;
        ``preempt`` is ``scheduler.preemption``."""
        key = gang.gang.key
        if key in self.nominations:
            return Made()  # its victims are still leaving
        notes = []
        if preempt and not eligible(p.preemption_policy for p in gang.members):
            notes.append(NOT_ELIGIBLE)
        elif preempt and gang.victims and not status.unresolvable:
            made = self._preempt(gang, members)
            if made is not None:
                return made
        cleared = {p.uid: NodeName("") for p in self.nominated.pop(key, ())}
        if gang.hold and not status.unresolvable:
            held = self.hold(key, members, gang.min_member)
            if held:
                notes.append(
                    f"It has waited long: nodes {', '.join(held)} are held for it until "
                    "their pods finish."
                )
        return Made(note=" ".join(notes), nominated=cleared)

    def _preempt(self, gang: ev.GangReady, members: list[GangMember]) -> Made | None:
        key = gang.gang.key
        found = self.preempt(key, members, gang.min_member, list(gang.victims))
        if found is None:
            return None
        victims = marked(found.units, gang.budgets)
        nodes = tuple(sorted({p.node for p in found.placements}))
        log.info(
            "preempting %d pod(s) for gang %s on %s: %s",
            len(found.pods),
            key,
            ", ".join(nodes),
            "; ".join(f"{', '.join(str(p) for p in v.pods)} ({v.why})" for v in victims),
        )
        self.nominated[key] = tuple(p.pod for p in found.placements)
        budgets = budget_note(found.units, gang.victims, gang.budgets)
        return Made(
            events=(
                ev.PreemptionDecided(
                    gang=gang.gang,
                    preemptor=tuple(m.pod for m in members),
                    victims=victims,
                    nodes=nodes,
                    attempt=gang.attempt,
                ),
            ),
            note=f"Preempting {len(found.pods)} pod(s) to make room on {', '.join(nodes)}"
            f"{budgets}.",
            nominated={p.pod.uid: p.node for p in found.placements},
        )

    def placed(self, key: GangKey) -> None:
        """The gang is placed: its hold ends, and binding clears its nominated nodes."""
        self.nominated.pop(key, None)
        self.drop_hold(key)

    def hold(self, key: GangKey, members: list[GangMember], min_member: int) -> list[NodeName]:
        """Hold the nodes the gang would fit on once their pods finish (fewest pods first)."""
        reserved = self.placer.reserved_nodes
        if key in self.holds:
            self.holds[key] = time.time() + HOLD_S
            return sorted(n for n, owner in reserved.items() if owner == key)
        ledger = self.placer.ledger
        by_node: dict[NodeName, list[PodRef]] = {}
        for uid, grant in ledger.pods.items():
            if uid not in self.doomed and reserved.get(grant.node, key) == key:
                by_node.setdefault(grant.node, []).append(grant.pod)
        units = sorted(
            (VictimUnit(pods=tuple(pods)) for pods in by_node.values()), key=lambda u: len(u.pods)
        )
        found = plan(self.placer, members, min_member, units, owner=key)
        if found is None:
            return []
        nodes = sorted({p.node for p in found.placements})
        for node in nodes:
            reserved[node] = key
        self.holds[key] = time.time() + HOLD_S
        log.info("gang %s has starved: holding %s for it", key, ", ".join(nodes))
        return nodes

    def drop_hold(self, key: GangKey) -> None:
        if self.holds.pop(key, None) is not None:
            reserved = self.placer.reserved_nodes
            for node in [n for n, owner in reserved.items() if owner == key]:
                del reserved[node]

    def lapsed(self, now: float) -> list[tuple[GangKey, list[PodGrant]]]:
        """End the nominations and holds whose gang did not come back; per lapsed
        nomination, the grants it freed."""
        freed = []
        for key in [k for k, n in self.nominations.items() if n.until <= now]:
            log.info("nomination of gang %s lapsed: its devices are free again", key)
            self.nominated.pop(key, None)  # its nominated nodes are left to its bind
            freed.append((key, self.end_nomination(key)))
        for key in [k for k, until in self.holds.items() if until <= now]:
            log.info("hold of gang %s lapsed", key)
            self.drop_hold(key)
        return freed
