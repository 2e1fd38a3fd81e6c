"""Which held grants, if they were gone, would let a gang fit: preemption and holds.

Both questions have the same shape. Preemption: a gang does not fit; which pods, evicted,
make room for it? The starvation guard: a big gang has waited too long; which nodes, once
their pods finish, would take it, so they can be held for it?

The caller offers *units*, cheapest first: sets of pods that leave together (a lone pod;
one member of a gang that has more than ``minMember`` running; a whole gang, since a gang
is never cut below its ``minMember``; or every pod of one node). ``plan`` releases
units in that order until the gang fits (a trial placement), then puts back every unit
that turns out not to be needed, the costliest first, so the set is small and cheap. The
ledger is restored exactly before it returns; nothing is evicted here. While a unit is
out, the DRA claims reserved for its pods alone count as free (kube-controller-manager
deallocates them once the pods are gone; docs/dra.md says why Tessera goes beyond
kube-scheduler here).

What kube-scheduler's DefaultPreemption promises holds here too. A pod whose
``preemptionPolicy`` is ``Never`` evicts no one (:func:`eligible`; it waits, and its
message says :data:`NOT_ELIGIBLE`). PodDisruptionBudgets (shared/core/disruption.py): a
unit whose eviction, after every cheaper one, would leave a budget short is offered
after every unit that breaks none (:func:`respecting`), so a set that breaks no budget
is chosen when one makes room, and the fewest breaks otherwise; the preemptor and the
victims are told which budget was respected or broken (:func:`budget_note`,
:func:`marked`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import msgspec

from shared.core.disruption import Budget
from shared.core.hierarchy import QueueTree, kinship, may_reclaim, may_take, rolled_up
from shared.core.ledger import Ledger, PodGrant, Statement
from shared.core.model import GangKey, PodRef, PodUID, VictimUnit
from shared.core.placement import GangMember, Placement, Placer
from shared.core.queues import GroupSpec, QueueSpec, Resources, accumulate, add, within
from shared.core.subgroups import SubGroups

MAX_UNITS = 256
"""Units a plan considers (cheapest first); each one costs a trial placement."""
NEVER = "Never"
"""The ``spec.preemptionPolicy`` of a pod that never evicts anyone."""
NOT_ELIGIBLE = "preemption: not eligible due to preemptionPolicy=Never."
"""kube-scheduler's words for such a pod, after its FailedScheduling reasons."""
NO_BUDGETS: Mapping[str, Mapping[str, Budget]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Plan:
    """Units to remove and where the gang would then go."""

    units: tuple[VictimUnit, ...]
    placements: tuple[Placement, ...]

    @property
    def pods(self) -> tuple[PodUID, ...]:
        """Every pod of the plan's units, each once, in the order first met."""
        seen: dict[PodUID, None] = {}
        for u in self.units:
            seen.update(dict.fromkeys(p.uid for p in u.pods))
        return tuple(seen)


@dataclass
class Protection:
    """Minimum runtimes before a bound pod may be evicted (KAI's ``preemptMinRuntime``
    and ``reclaimMinRuntime``, per queue with the config's defaults; Volcano's
    ``volcano.sh/cooldown-time`` per pod), at ``now`` (the candidates' ``started``
    clock). :func:`victims` notes in ``soonest`` how long until the first protection
    that kept a pod from being offered ends."""

    now: float
    preempt_s: float = 0.0
    reclaim_s: float = 0.0
    soonest: float = math.inf
    """Seconds until the first protection that kept a unit out ends (inf: none did)."""

    def left(self, unit: Sequence[Candidate], minimum: float) -> float:
        """Seconds until every pod of ``unit`` has run ``minimum`` (or its own cooldown,
        if longer) since it started; 0: it may be evicted now."""
        left = 0.0
        for s in unit:
            if s.started is not None:
                left = max(left, s.started + max(minimum, s.cooldown_s) - self.now)
        return left

    def minimum(
        self,
        queue: str,
        theirs: str,
        reclaim: bool,
        queues: Mapping[str, QueueSpec],
        tree: QueueTree | None,
    ) -> float:
        """The minimum runtime of a pod of ``theirs`` against a gang of ``queue``: for
        preemption, the first ``preemptMinRuntime`` from its queue up to the root; for
        reclaim, the ``reclaimMinRuntime`` of the queue just below the two queues' common
        ancestor on its side, then up to the root (KAI's ``lca``); else the default."""
        path: Sequence[str] = (theirs,)
        if tree is not None and theirs in tree.parent:
            up = tree.path(theirs)
            if reclaim and queue in tree.parent:
                below = kinship(tree, queue, theirs) + 1
                path = (up[below], *reversed(up[:below])) if below < len(up) else up[::-1]
            else:
                path = up[::-1]
        for name in path:
            spec = queues.get(name)
            found = (
                None
                if spec is None
                else (spec.reclaim_min_runtime_s if reclaim else spec.preempt_min_runtime_s)
            )
            if found is not None:
                return found
        return self.reclaim_s if reclaim else self.preempt_s


class Candidate(Protocol):
    """A bound pod as victim selection reads it (the coordinator's gang members)."""

    @property
    def pod(self) -> PodRef:
        """The pod an eviction names (its uid the precondition)."""
        ...

    @property
    def priority(self) -> int:
        """Its priority: only pods below the gang's may go, but for a queue's reclaim."""
        ...

    @property
    def created_at(self) -> float:
        """When it was created: of units otherwise equal, the newest is offered first."""
        ...

    @property
    def queue(self) -> str:
        """The queue it counts against (reclaim takes from queues over their share)."""
        ...

    @property
    def started(self) -> float | None:
        """When it was scheduled (the caller's clock), None if not known: its minimum
        runtime counts from here (:class:`Protection`)."""
        ...

    @property
    def cooldown_s(self) -> float:
        """Volcano's ``volcano.sh/cooldown-time`` of the pod, in seconds."""
        ...

    @property
    def vector(self) -> Resources:
        """What it holds, by resource: what evicting it gives back to its queue."""
        ...

    @property
    def labels(self) -> Mapping[str, str]:
        """Its labels: which PodDisruptionBudgets cover it."""
        ...

    @property
    def preemption_policy(self) -> str:
        """Its ``spec.preemptionPolicy``: ``Never`` keeps its gang from evicting anyone."""
        ...


def eligible(policies: Iterable[str]) -> bool:
    """May a gang whose pods have these ``preemptionPolicy`` values evict anyone? Not
    when one of them is ``Never``: what is evicted for a gang is evicted for each pod."""
    return all(p != NEVER for p in policies)


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
    budgets: Mapping[str, Mapping[str, Budget]] = NO_BUDGETS,
    tree: QueueTree | None = None,
    level: int = -1,
    protection: Protection | None = None,
    owed: Mapping[str, Resources] | None = None,
    starved: bool = False,
    follow_fair: bool = False,
) -> tuple[VictimUnit, ...]:
    """Bound pods that may be evicted for the gang ``key`` (whose waiting ``members``
    need ``need``), as units, cheapest first (Volcano's preempt and reclaim).

    Lower-priority pods of any gang may go, within the gang's queue or from another
    reclaimable queue; so may pods of a reclaimable queue over its deserved share while
    the gang's queue is within its own. A gang is offered as its members beyond
    ``minMember`` one by one, then as a whole: never cut below ``minMember``. ``lowest``
    is the lowest priority of any bound pod: when it is not below the gang's and no
    queue must give back, nothing is offered without scanning (that scan, per waiting
    pod, starved a benchmark run). Nothing is offered for a gang with a pod of
    preemptionPolicy Never. ``budgets`` (namespace → name → budget) order the offer:
    units that would break one come last (:func:`respecting`).

    With the ``capacity`` plugin's ``tree`` (shared/core/hierarchy.py), the gang's queue
    reclaims while it and its ancestors allow (``may_reclaim``), from queues whose pods
    ``may_take`` allows (over their deserved share up the tree to ``level`` ancestors,
    never below a guarantee), siblings first, then cousins; what a queue gives is
    counted as it is offered, so no queue is offered below what it deserves. With
    ``owed`` (the fair shares: ``hierarchy.fair``) a queue is not taken below its fair
    share, where it could take the room back at once, and the gang's queue reclaims
    only while within both its deserved (Volcano's rule) and its fair share: room beyond
    its deserved comes to it as pods end, while queues over their fair share wait
    (shared/core/gangs.py). With ``follow_fair`` (a memory of past use moves the fair
    shares) its fair share alone bounds it, as KAI's reclaim follows the fair share. With
    ``owed`` and ``starved`` (the gang waited past the starvation guard), a queue within
    its deserved share also reclaims from queues over their deserved, whatever their
    fair share (the tree's promise, kept where fragmented room never fits the gang).

    With ``protection``, a unit with a pod that has not run its minimum runtime yet is
    not offered; ``protection.soonest`` says when the first such protection ends.
    """
    if not eligible(m.preemption_policy for m in members):
        return ()
    queue = members[0].queue
    top = max(m.priority for m in members)
    rolled: dict[str, Resources] = {}
    if tree is not None:
        rolled = rolled_up(tree, used)
        within_deserved = may_reclaim(tree, queue, rolled, need, level)
        under = may_reclaim(tree, queue, rolled, need, level, owed) and (
            follow_fair or owed is None or within_deserved
        )
        # past the starvation guard, within its deserved share it also reclaims from
        # queues over theirs, whatever their fair share (the tree's guarantee)
        static = starved and owed is not None and within_deserved
        reclaim = under or static
    else:
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
    offers: list[tuple[tuple[int, int, int, int, float], VictimUnit]] = []
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
            kin = 0
            bar = "deserved" if owed is None else "fair"
            if tree is not None:
                over = False
                if theirs != queue and theirs in tree.parent:
                    if under and may_take(tree, queue, theirs, rolled, vector, level, owed) is None:
                        over = True
                    elif static and may_take(tree, queue, theirs, rolled, vector, level) is None:
                        over, bar = True, "deserved"
                kin = kinship(tree, queue, theirs) if over else 0
            else:
                still = add(used.get(theirs, {}), reclaimed.get(theirs, {}), -1)
                over = (
                    theirs != queue
                    and under
                    and not within(still, share.get(theirs, {}), absent=0.0)
                )
            if priority >= top and not over:
                continue
            if protection is not None:
                minimum = protection.minimum(queue, theirs, priority >= top, queues, tree)
                left = protection.left(unit, minimum)
                if left > 0:  # it has not run its minimum yet: not offered
                    protection.soonest = min(protection.soonest, left)
                    continue
            if priority < top:
                why = f"priority {priority} < {top}"
            else:
                why = f'queue "{theirs}" is over its {bar} share'
                reclaimed[theirs] = add(reclaimed.get(theirs, {}), vector)
                if tree is not None:  # what it gives is counted up its tree
                    for name in tree.path(theirs):
                        accumulate(rolled.setdefault(name, {}), vector, -1)
            if unit is ordered and group is not None:
                why += f"; all of gang {other.name} (never below minMember {min_member})"
            newest = max(s.created_at for s in unit)
            cost = (priority, 0 if over else 1, -kin, len(unit), -newest)
            covered = tuple(covering(s, budgets) for s in unit)
            offer = VictimUnit(
                pods=tuple(s.pod for s in unit),
                why=why,
                budgets=covered if any(covered) else (),
            )
            offers.append((cost, offer))
    offers.sort(key=lambda o: o[0])
    units = tuple(v for _, v in offers)
    return respecting(units, allowances(units, budgets))[:MAX_UNITS]


def covering(s: Candidate, budgets: Mapping[str, Mapping[str, Budget]]) -> tuple[str, ...]:
    """The PodDisruptionBudgets (``namespace/name``) that cover the bound pod ``s``."""
    pod = s.pod
    return tuple(
        b.key
        for b in budgets.get(pod.namespace, {}).values()
        if b.covers(pod.namespace, pod.name, s.labels)
    )


def allowances(
    units: Iterable[VictimUnit], budgets: Mapping[str, Mapping[str, Budget]]
) -> dict[str, int]:
    """What each budget ``units`` count against allows now (the allocator phrases its
    messages with them)."""
    allowed: dict[str, int] = {}
    for unit in units:
        for key in (k for keys in unit.budgets for k in keys):
            namespace, _, name = key.partition("/")
            allowed[key] = budgets[namespace][name].allowed
    return allowed


def _charges(units: Iterable[VictimUnit]) -> Iterator[tuple[VictimUnit, list[str]]]:
    """Each unit with the budgets its pods count against, a pod already counted for an
    earlier unit (a gang's member, then the whole gang) not again."""
    seen: set[PodUID] = set()
    for unit in units:
        keys: list[str] = []
        for i, pod in enumerate(unit.pods):
            if pod.uid not in seen:
                seen.add(pod.uid)
                keys.extend(unit.budgets[i] if i < len(unit.budgets) else ())
        yield unit, keys


def respecting(units: Sequence[VictimUnit], allowed: Mapping[str, int]) -> tuple[VictimUnit, ...]:
    """``units`` (cheapest first) with each whose eviction, after every cheaper one,
    would take a budget below zero moved after every other, both kinds in their order:
    kube-scheduler ranks candidates by fewest PodDisruptionBudget violations first."""
    left = dict(allowed)
    keep: list[VictimUnit] = []
    last: list[VictimUnit] = []
    for unit, keys in _charges(units):
        for key in keys:
            left[key] = left.get(key, 0) - 1
        (last if any(left[k] < 0 for k in keys) else keep).append(unit)
    return (*keep, *last)


def overdrawn(units: Iterable[VictimUnit], allowed: Mapping[str, int]) -> dict[str, int]:
    """The budgets evicting every pod of ``units`` would break, with how many
    disruptions past what each allows."""
    used = Counter(k for _, keys in _charges(units) for k in keys)
    return {k: n - allowed.get(k, 0) for k, n in sorted(used.items()) if n > allowed.get(k, 0)}


def budget_note(
    chosen: Sequence[VictimUnit], offered: Sequence[VictimUnit], allowed: Mapping[str, int]
) -> str:
    """What a preemptor is told of the budgets, after "Preempting N pod(s) to make room
    on ...": those a plan that took every offered unit would break and this one does not
    (respected), and those it breaks because no set that respects them makes room."""
    broken = overdrawn(chosen, allowed)
    respected = [k for k in overdrawn(offered, allowed) if k not in broken]
    said = ""
    if respected:
        said += f"; PodDisruptionBudget {', '.join(respected)} respected"
    if broken:
        said += "; violating PodDisruptionBudget " + ", ".join(
            f"{k} (it allows {allowed.get(k, 0)} disruption(s))" for k in broken
        )
        said += ": no choice that respects it makes room"
    return said


def marked(chosen: Sequence[VictimUnit], allowed: Mapping[str, int]) -> tuple[VictimUnit, ...]:
    """``chosen`` with each unit whose pods count against a budget the set breaks saying
    so in its ``why`` (the victims' Preempted Event)."""
    broken = overdrawn(chosen, allowed)
    out = []
    for unit in chosen:
        hit = sorted({k for keys in unit.budgets for k in keys if k in broken})
        if hit:
            why = f"{unit.why}; violates PodDisruptionBudget {', '.join(hit)}"
            unit = msgspec.structs.replace(unit, why=why.lstrip("; "))
        out.append(unit)
    return tuple(out)


def plan(
    placer: Placer,
    members: Sequence[GangMember],
    min_member: int,
    units: Sequence[VictimUnit],
    *,
    owner: GangKey | None = None,
    fragmentation_guard: int | None = None,
    subgroups: SubGroups | None = None,
) -> Plan | None:
    """The cheapest prefix-then-pruned set of ``units`` after whose removal the gang fits;
    None when even all of them are not enough. The ledger is left as it was: every
    release and put-back goes through one statement, discarded at the end."""
    ledger = placer.ledger
    out: dict[PodUID, PodGrant] = {}  # released and not put back

    def fits() -> tuple[Placement, ...] | None:
        with Statement(ledger) as probe:
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

    chosen: list[VictimUnit] = []
    with Statement(ledger) as st:
        found = None
        for unit in units[:MAX_UNITS]:
            freed = False
            for uid in (p.uid for p in unit.pods):
                if uid not in out and (grant := st.release(uid)) is not None:
                    out[uid] = grant
                    _claims(ledger, st, uid, leave=True)
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
                _claims(ledger, st, uid, leave=False)
            again = fits()
            if again is not None:
                chosen.remove(unit)
                found = again
            else:
                for uid in back:
                    grant = st.release(uid)
                    assert grant is not None  # granted just above
                    out[uid] = grant
                    _claims(ledger, st, uid, leave=True)
        return Plan(units=tuple(chosen), placements=found)


def _claims(ledger: Ledger, st: Statement, uid: PodUID, *, leave: bool) -> None:
    """A victim's DRA claims reserved for it alone count as free while it is out of the
    plan (``leave``), held again once it is put back; undone with ``st``
    (shared/core/plugins/dynamic_resources.py ``Claimed``)."""
    claimed = ledger.hosts.dra
    if claimed is None:
        return
    undo = claimed.leave(uid) if leave else claimed.stay(uid)
    if undo is not None:
        st.undo(undo)
