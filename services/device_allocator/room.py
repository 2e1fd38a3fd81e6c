"""Making room for a gang that does not fit: preemption and holds, the allocator's side.

Which bound pods may go is the coordinator's offer (shared/core/preemption.py
``victims``); which of them must go is ``preemption.plan`` on the ledger. Here:

- a *nomination* keeps the devices of the pods evicted for a gang booked after they are
  gone, until the gang is placed on them, so no other pod takes what was freed for it;
- a *hold* (the starvation guard) closes the nodes a long-waiting gang would fit on to
  every other gang until their pods finish.

Both lapse after ``HOLD_S`` if the gang does not come back (the coordinator retries a
waiting gang at least every minute).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from shared.core.ledger import PodGrant
from shared.core.model import GangKey, NodeName, PodRef, PodUID, VictimUnit
from shared.core.placement import GangMember, Placer
from shared.core.preemption import Plan, plan

log = logging.getLogger(__name__)

HOLD_S = 120.0
"""A nomination or node hold lapses if its gang has not come back in this time."""


@dataclass
class Nomination:
    """Pods being evicted for a gang; their devices stay booked for it once they are gone."""

    victims: set[PodUID]
    until: float
    gone: set[PodUID] = field(default_factory=set)


class Room:
    """The allocator's nominations and holds (one instance, beside its ledger)."""

    def __init__(self, placer: Placer) -> None:
        self.placer = placer
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
            freed.append((key, self.end_nomination(key)))
        for key in [k for k, until in self.holds.items() if until <= now]:
            log.info("hold of gang %s lapsed", key)
            self.drop_hold(key)
        return freed
