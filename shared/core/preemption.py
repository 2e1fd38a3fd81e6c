"""Which held grants, if they were gone, would let a gang fit: preemption and holds.

Both questions have the same shape. Preemption: a gang does not fit; which pods, evicted,
make room for it? The starvation guard: a big gang has waited too long; which nodes, once
their pods finish, would take it, so they can be held for it?

The caller offers *units*, cheapest first: sets of pods that leave together (a lone pod;
one member of a gang that has more than ``minMember`` running; a whole gang, since a gang
is never cut below its ``minMember``; or every pod of one node). ``plan`` releases
units in that order until the gang fits (a trial placement), then puts back every unit
that turns out not to be needed, the costliest first, so the set is small and cheap. The
ledger is restored exactly before it returns; nothing is evicted here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.core.ledger import PodGrant, Statement
from shared.core.model import GangKey, PodRef, PodUID, VictimUnit
from shared.core.placement import GangMember, Placement, Placer
from shared.core.queues import GroupSpec, QueueSpec, Resources, add, within

MAX_UNITS = 256
"""Units a plan considers (cheapest first); each one costs a trial placement."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Units to remove and where the gang would then go."""

    units: tuple[VictimUnit, ...]
    placements: tuple[Placement, ...]

    @property
    def pods(self) -> tuple[PodUID, ...]:
        seen: dict[PodUID, None] = {}
        for u in self.units:
            seen.update(dict.fromkeys(p.uid for p in u.pods))
        return tuple(seen)


class Candidate(Protocol):
    """A bound pod as victim selection reads it (the coordinator's gang members)."""

    @property
    def pod(self) -> PodRef: ...
    @property
    def priority(self) -> int: ...
    @property
    def created_at(self) -> float: ...
    @property
    def queue(self) -> str: ...
    @property
    def vector(self) -> Resources: ...


def victims(
    key: GangKey,
    members: Sequence[Candidate],
    need: Resources,
    *,
    bound: Mapping[GangKey, Mapping[PodUID, Candidate]],
    groups: Mapping[GangKey, GroupSpec],
    queues: Mapping[str, QueueSpec],
    used: Mapping[str, Resources],
    share: Mapping[str, Resources],
    lowest: int,
) -> tuple[VictimUnit, ...]:
    """Bound pods that may be evicted for the gang ``key`` (whose waiting ``members``
    need ``need``), as units, cheapest first (Volcano's preempt and reclaim).

    Lower-priority pods of any gang may go, within the gang's queue or from another
    reclaimable queue; so may pods of a reclaimable queue over its deserved share while
    the gang's queue is within its own. A gang is offered as its members beyond
    ``minMember`` one by one, then as a whole: never cut below ``minMember``. ``lowest``
    is the lowest priority of any bound pod: when it is not below the gang's and no
    queue must give back, nothing is offered without scanning (that scan, per waiting
    pod, starved a benchmark run).
    """
    queue = members[0].queue
    top = max(m.priority for m in members)
    under = bool(queues) and within(
        add(used.get(queue, {}), need), share.get(queue, {}), absent=0.0
    )
    reclaim = under and any(
        name != queue
        and q.reclaimable
        and not within(used.get(name, {}), share.get(name, {}), absent=0.0)
        for name, q in queues.items()
    )
    if top <= lowest and not reclaim:
        return ()
    offers: list[tuple[tuple[int, int, int, float], VictimUnit]] = []
    reclaimed: dict[str, Resources] = {}
    for other, members_of in bound.items():
        if other == key or not members_of:
            continue
        ordered = sorted(members_of.values(), key=lambda s: (s.priority, -s.created_at))
        theirs = ordered[0].queue
        q = queues.get(theirs)
        if theirs != queue and q is not None and not q.reclaimable:
            continue  # a queue that does not give back is only preempted within itself
        group = None if other.lone else groups.get(other)
        min_member = group.min_member if group is not None else len(ordered)
        surplus = max(len(ordered) - min_member, 0)
        for unit in [*([s] for s in ordered[:surplus]), ordered]:
            priority = max(s.priority for s in unit)
            vector: Resources = {}
            for s in unit:
                vector = add(vector, s.vector)
            still = add(used.get(theirs, {}), reclaimed.get(theirs, {}), -1)
            over = (
                theirs != queue and under and not within(still, share.get(theirs, {}), absent=0.0)
            )
            if priority < top:
                why = f"priority {priority} < {top}"
            elif over:
                why = f'queue "{theirs}" is over its deserved share'
                reclaimed[theirs] = add(reclaimed.get(theirs, {}), vector)
            else:
                continue
            if unit is ordered and group is not None:
                why += f"; all of gang {other.name} (never below minMember {min_member})"
            newest = max(s.created_at for s in unit)
            cost = (priority, 0 if over else 1, len(unit), -newest)
            offers.append((cost, VictimUnit(pods=tuple(s.pod for s in unit), why=why)))
    offers.sort(key=lambda o: o[0])
    return tuple(v for _, v in offers[:MAX_UNITS])


def plan(
    placer: Placer,
    members: Sequence[GangMember],
    min_member: int,
    units: Sequence[VictimUnit],
    *,
    owner: GangKey | None = None,
) -> Plan | None:
    """The cheapest prefix-then-pruned set of ``units`` after whose removal the gang fits;
    None when even all of them are not enough. The ledger is left as it was: every
    release and put-back goes through one statement, discarded at the end."""
    ledger = placer.ledger
    out: dict[PodUID, PodGrant] = {}  # released and not put back

    def fits() -> tuple[Placement, ...] | None:
        with Statement(ledger) as probe:
            result = placer.place_gang(
                members, min_member, owner=owner, trial=True, statement=probe
            )
        return tuple(result.placed) if result.ok else None

    chosen: list[VictimUnit] = []
    with Statement(ledger) as st:
        found = None
        for unit in units[:MAX_UNITS]:
            freed = False
            for uid in (p.uid for p in unit.pods):
                if uid not in out and (grant := st.release(uid)) is not None:
                    out[uid] = grant
                    freed = True
            if not freed:
                continue  # holds nothing (more than what is already out)
            chosen.append(unit)
            found = fits()
            if found is not None:
                break
        if found is None:
            return None
        for unit in reversed(chosen):  # put back what is not needed, costliest first
            others = {p.uid for u in chosen if u is not unit for p in u.pods}
            back = [p.uid for p in unit.pods if p.uid in out and p.uid not in others]
            for uid in back:
                st.grant(out.pop(uid))
            again = fits()
            if again is not None:
                chosen.remove(unit)
                found = again
            else:
                for uid in back:
                    grant = st.release(uid)
                    assert grant is not None  # granted just above
                    out[uid] = grant
        return Plan(units=tuple(chosen), placements=found)
