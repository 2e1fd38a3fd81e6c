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

from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.ledger import PodGrant
from shared.core.model import PodUID
from shared.core.placement import GangMember, Placement, Placer

MAX_UNITS = 256
"""Units a plan considers (cheapest first); each one costs a trial placement."""


@dataclass(frozen=True, slots=True)
class Unit:
    """Pods that leave together, and why they may (for the Events)."""

    pods: tuple[PodUID, ...]
    why: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """Units to remove and where the gang would then go."""

    units: tuple[Unit, ...]
    placements: tuple[Placement, ...]

    @property
    def pods(self) -> tuple[PodUID, ...]:
        seen: dict[PodUID, None] = {}
        for u in self.units:
            seen.update(dict.fromkeys(u.pods))
        return tuple(seen)


def plan(
    placer: Placer,
    members: Sequence[GangMember],
    min_member: int,
    units: Sequence[Unit],
    *,
    owner: str | None = None,
) -> Plan | None:
    """The cheapest prefix-then-pruned set of ``units`` after whose removal the gang fits;
    None when even all of them are not enough. The ledger is left as it was."""
    ledger = placer.ledger
    out: dict[PodUID, PodGrant] = {}  # released, in order, to be restored in reverse

    def take(unit: Unit, keep: set[PodUID]) -> bool:
        freed = False
        for uid in unit.pods:
            if uid in out or uid in keep:
                continue
            grant = ledger.release(uid)
            if grant is not None:
                out[uid] = grant
                freed = True
        return freed

    def put_back(unit: Unit, needed: set[PodUID]) -> list[PodUID]:
        back = [uid for uid in unit.pods if uid in out and uid not in needed]
        for uid in back:
            ledger.grant(out.pop(uid))
        return back

    def fits() -> tuple[Placement, ...] | None:
        result = placer.place_gang(members, min_member, owner=owner, trial=True)
        if not result.ok:
            return None
        for p in reversed(result.placed):
            ledger.release(p.pod.uid)
        return tuple(result.placed)

    chosen: list[Unit] = []
    try:
        found = None
        for unit in units[:MAX_UNITS]:
            if not take(unit, set()):
                continue  # holds nothing (more than what is already out)
            chosen.append(unit)
            found = fits()
            if found is not None:
                break
        if found is None:
            return None
        for unit in reversed(chosen):  # put back what is not needed, costliest first
            others = {uid for u in chosen if u is not unit for uid in u.pods}
            back = put_back(unit, others)
            again = fits()
            if again is not None:
                chosen.remove(unit)
                found = again
            else:
                for uid in back:
                    grant = ledger.release(uid)
                    assert grant is not None  # granted just above
                    out[uid] = grant

        return Plan(units=tuple(chosen), placements=found)
    finally:
        for uid in reversed(list(out)):
            ledger.grant(out[uid])
