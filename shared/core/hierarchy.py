"""Hierarchical queues, as Volcano's ``capacity`` plugin computes them with ``enableHierarchy``.

Queues form a tree under ``root`` through their ``parent``. Usage is counted at the leaves
(only a leaf holds jobs) and rolls up into every ancestor; every limit is then checked at
each level of the path, so a team's queues together stay within the team's own bounds.

- **Real capability**, top down: a child gets what its parent really has, less what the
  parent guarantees to all its children, plus its own guarantee, and never more than its
  own capability (a dimension it does not name inherits the parent's). A dimension a
  vector does not name is unlimited; a queue limited in no dimension has ``None``.
- **Deserved** is never below the guarantee; the root deserves and guarantees the sums
  over its children. A queue's *share* is its usage over its deserved, the largest over
  the dimensions it deserves; a queue deserving nothing has share 1 (best effort).
- **Broken trees wait, the rest schedules.** A queue whose parent does not exist, or whose
  parents form a cycle, is refused with its whole subtree (``QueueTree.broken`` says why);
  every healthy queue is computed as if that subtree were not there. Volcano instead stops
  the whole plugin until the tree is repaired; one tenant's typo should not stop the others.
- **Reclaim** runs in two halves. The reclaimer's queue may reclaim while it stays within
  its real capability and within its deserved on one requested dimension
  (``may_reclaim``); a victim's queue gives a pod up only while it stays at or above its
  guarantee and is over its deserved on a dimension the pod uses, and so must every
  ancestor of the victim's queue that the reclaimer does not share (``may_take``). Volcano
  checks none of those ancestors by default, so a child over its deserved is reclaimed from
  while its parent is under the parent's; Tessera checks all of them unless told a level.

- **Fair shares** (``fair``): each queue's deserved up to what it asks, and the surplus
  above divided top down as KAI divides it, by weight moved by a memory of past use
  (shared/core/usage.py; with weight 0 a plain water-filling). Given as ``owed``, they
  stand for deserved in the order of turns and in reclaim: a queue is reclaimed from only
  above its fair share, never to where it could take the room straight back (with the
  static deserved, a queue lent what another left idle was reclaimed at the margin and
  took it back: bench/fairness.py). The coordinator also bounds admission by them while
  a queue below its own waits, and keeps the deserved bar for a gang that waited past
  its starvation guard (shared/core/gangs.py).

Nothing here reads the cluster: the caller gives the queues and what each leaf uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.core.queues import (
    EPS,
    QueueShare,
    Resources,
    accumulate,
    add,
    capped,
    deserved,
    within,
)

ROOT = "root"


@dataclass(frozen=True, slots=True)
class TreeQueue:
    """A Volcano Queue as the hierarchy reads it, its resource lists already vectors."""

    name: str
    parent: str = ""
    """``""`` means ``root``; ignored on the queue named ``root``."""
    deserved: Resources = field(default_factory=dict)
    guarantee: Resources = field(default_factory=dict)
    capability: Resources | None = None
    """``None``: none written; a dimension the vector does not name is unlimited."""
    priority: int = 0
    weight: float = 1.0
    """Its part of its parent's surplus, among its siblings (``fair``)."""


@dataclass(frozen=True, slots=True)
class QueueTree:
    """The healthy queues' tree and what each may hold; the refused queues and why.

    Every mapping but ``broken`` names the healthy queues only (``ROOT`` included, except
    in ``parent``): ask ``broken`` first.
    """

    parent: Mapping[str, str]
    children: Mapping[str, tuple[str, ...]]
    """Sorted by name; ``ROOT`` included."""
    broken: Mapping[str, str]
    deserved: Mapping[str, Resources]
    guarantee: Mapping[str, Resources]
    real: Mapping[str, Resources | None]
    """Real capability; ``None``: unlimited in every dimension."""
    priority: Mapping[str, int]
    weight: Mapping[str, float] = field(default_factory=dict)

    def leaf(self, queue: str) -> bool:
        """Whether ``queue`` may hold jobs: it has no children (``ROOT`` never may)."""
        return queue != ROOT and not self.children.get(queue)

    def path(self, queue: str) -> tuple[str, ...]:
        """``ROOT``, then every ancestor down to ``queue`` itself."""
        out = [queue]
        while out[-1] != ROOT:
            out.append(self.parent[out[-1]])
        return tuple(reversed(out))

    def depth(self, queue: str) -> int:
        """``ROOT`` 0, a top-level queue 1, its children 2, ..."""
        return len(self.path(queue)) - 1


def build(queues: Iterable[TreeQueue]) -> QueueTree:
    """The tree of ``queues``: parents, refusals, deserved, guarantees, real capabilities."""
    specs: dict[str, TreeQueue] = {}
    root = TreeQueue(ROOT)
    for q in queues:
        if q.name == ROOT:
            root = q
        else:
            specs[q.name] = q
    up = {name: q.parent or ROOT for name, q in specs.items()}
    broken = _refused(specs, up)
    parent = {n: p for n, p in up.items() if n not in broken}
    kids: dict[str, list[str]] = {ROOT: [], **{n: [] for n in parent}}
    for n, p in parent.items():
        kids[p].append(n)
    children = {n: tuple(sorted(c)) for n, c in kids.items()}

    guarantee: dict[str, Resources] = {n: dict(specs[n].guarantee) for n in parent}
    deserved: dict[str, Resources] = {
        n: {
            d: max(specs[n].deserved.get(d, 0.0), guarantee[n].get(d, 0.0))
            for d in specs[n].deserved.keys() | guarantee[n].keys()
        }
        for n in parent
    }
    guarantee[ROOT], deserved[ROOT] = {}, {}
    for n in children[ROOT]:
        accumulate(guarantee[ROOT], guarantee[n])
        accumulate(deserved[ROOT], deserved[n])

    limit: dict[str, Resources] = {ROOT: dict(root.capability or {})}
    todo = [ROOT]
    while todo:
        p = todo.pop()
        held: Resources = {}
        for c in children[p]:
            accumulate(held, guarantee[c])
        for c in children[p]:
            limit[c] = _real(limit[p], held, guarantee[c], specs[c].capability)
            todo.append(c)
    return QueueTree(
        parent=parent,
        children=children,
        broken=broken,
        deserved=deserved,
        guarantee=guarantee,
        real={n: v or None for n, v in limit.items()},
        priority={ROOT: root.priority, **{n: specs[n].priority for n in parent}},
        weight={n: specs[n].weight for n in parent},
    )


def _refused(specs: Mapping[str, TreeQueue], up: Mapping[str, str]) -> dict[str, str]:
    """Queues with a missing parent or on a cycle, then every queue below one of them."""
    direct: dict[str, str] = {}
    for name in sorted(specs):
        if up[name] != ROOT and up[name] not in specs:
            direct[name] = f'queue "{name}": its parent "{up[name]}" does not exist'
            continue
        chain, x = [name], up[name]
        while x in specs and x not in chain:
            chain.append(x)
            x = up[x]
        if x == name:
            cycle = " → ".join([*chain, name])
            direct[name] = f'queue "{name}": its parents form a cycle: {cycle}'
    broken = dict(direct)
    for name in specs:
        x = up[name]
        while name not in direct and x != ROOT:
            if x in direct:  # the chain up ends at ROOT, a missing parent or a cycle
                broken[name] = f'queue "{name}": its ancestor "{x}" is refused: {direct[x]}'
                break
            x = up[x]
    return broken


def _real(
    above: Resources, held: Resources, mine: Resources, capability: Resources | None
) -> Resources:
    """A child's real capability (finite dimensions only) from its parent's ``above``."""
    own = capability or {}
    out: Resources = {}
    for d in above.keys() | held.keys() | mine.keys() | own.keys():
        parent = above.get(d, math.inf)
        bound = min(own.get(d, parent), parent - held.get(d, 0.0) + mine.get(d, 0.0))
        if bound < math.inf:
            out[d] = max(0.0, bound)
    return out


def rolled_up(tree: QueueTree, own: Mapping[str, Resources]) -> dict[str, Resources]:
    """Each healthy queue's usage with all its descendants', from what each leaf holds
    (``own``; a refused or unknown queue's usage counts nowhere)."""
    out: dict[str, Resources] = {ROOT: {}, **{n: {} for n in tree.parent}}
    for queue, used in own.items():
        if queue in out:
            for x in tree.path(queue):
                accumulate(out[x], used)
    return out


def over_capability(
    tree: QueueTree, queue: str, rolled: Mapping[str, Resources], need: Resources
) -> str | None:
    """The deepest queue on ``queue``'s path that ``need`` more would take past its real
    capability (checked on the dimensions ``need`` names), or None if none would."""
    for x in reversed(tree.path(queue)):
        if not within(_after(rolled, x, need), tree.real[x] or {}, absent=math.inf):
            return x
    return None


def share(
    tree: QueueTree,
    queue: str,
    rolled: Mapping[str, Resources],
    owed: Mapping[str, Resources] | None = None,
) -> float:
    """Usage over deserved (over ``owed`` when given: ``fair``), the largest over the
    dimensions ``queue`` is owed; 1.0 for a queue owed nothing."""
    mine = (owed if owed is not None else tree.deserved).get(queue, {})
    used = rolled.get(queue, {})
    return max((used.get(d, 0.0) / v for d, v in mine.items() if v > EPS), default=1.0)


def order_key(
    tree: QueueTree,
    queue: str,
    rolled: Mapping[str, Resources],
    owed: Mapping[str, Resources] | None = None,
) -> tuple[object, ...]:
    """Sort key for leaf queues, lowest first: higher priority, then at the first level
    where two paths diverge the lower share (of ``owed`` when given: ``fair``), then the
    queue that deserves something, then the name (so a tie there is not decided by
    deeper levels)."""
    levels = (
        (share(tree, x, rolled, owed), 0 if _deserves(tree, x) else 1, x)
        for x in tree.path(queue)[1:]
    )
    return (-tree.priority[queue], *levels)


def fair(
    tree: QueueTree,
    total: Resources,
    demand: Mapping[str, Resources],
    usage: Mapping[str, Resources],
    k: float,
) -> dict[str, Resources]:
    """Each healthy queue's fair share of ``total``, top down as KAI divides it: among a
    parent's children, each first gets its deserved (up to its ``demand``, rolled up,
    and its real capability); then what is left of the parent's fair share goes to the
    children wanting more, higher ``priority`` first, within one priority divided by
    ``weight``, each weight moved by the queue's past use (``usage``, rolled up and
    normalized: shared/core/usage.py) with ``k``.

    At the top level a queue's use is its part of the cluster's, as KAI counts it; below,
    its part of the part its parent is owed (KAI divides by the cluster at every level,
    where children's uses, small beside their weights among siblings, hardly move the
    division). Only the dimensions some sibling deserves are divided: a dimension no
    queue is owed stays free for all, as without fair shares (owed on one and not on
    another, two queues could each reclaim from the other)."""
    out: dict[str, Resources] = {ROOT: capped(total, tree.real[ROOT])}
    todo = [ROOT]
    while todo:
        p = todo.pop()
        kids = tree.children.get(p, ())
        if not kids:
            continue
        named = {d for c in kids for d, v in tree.deserved[c].items() if v > EPS}
        left = {d: v for d, v in out[p].items() if d in named}  # only what queues are owed
        wants: dict[int, list[QueueShare]] = {}
        for c in kids:
            want = capped(demand.get(c, {}), tree.real[c])
            given = {d: min(v, want.get(d, 0.0)) for d, v in tree.deserved[c].items()}
            out[c] = given
            accumulate(left, given, -1)
            more = QueueShare(name=c, weight=tree.weight.get(c, 1.0), demand=add(want, given, -1))
            wants.setdefault(tree.priority[c], []).append(more)
        part = {d: out[p].get(d, 0.0) / v for d, v in total.items() if v > EPS}
        past = {
            c: {d: v / part[d] for d, v in usage.get(c, {}).items() if part.get(d, 0.0) > EPS}
            for c in kids
        }
        for priority in sorted(wants, reverse=True):
            got = deserved({d: max(v, 0.0) for d, v in left.items()}, wants[priority], past, k)
            for c, extra in got.items():
                accumulate(out[c], extra)
                accumulate(left, extra, -1)
        todo.extend(kids)
    return out


def may_reclaim(
    tree: QueueTree,
    queue: str,
    rolled: Mapping[str, Resources],
    need: Resources,
    level: int = -1,
    owed: Mapping[str, Resources] | None = None,
) -> bool:
    """Whether ``queue`` may reclaim ``need`` from others: it stays within its real
    capability, and within its deserved on one dimension of ``need`` that it deserves
    (dimensions deserving 0 do not count). With ``level`` N > 0, one of its N nearest
    ancestors below ``ROOT`` staying within that ancestor's deserved also qualifies it;
    -1 or 0 weighs the queue alone. With ``owed`` (``fair``: a memory of past use), its
    fair share stands for its deserved, as KAI's reclaim follows the fair share."""
    if not within(_after(rolled, queue, need), tree.real[queue] or {}, absent=math.inf):
        return False
    ancestors = tuple(reversed(tree.path(queue)[1:-1]))[: max(level, 0)]
    bar = owed if owed is not None else tree.deserved
    return any(_under(bar, x, rolled, need) for x in (queue, *ancestors))


def kinship(tree: QueueTree, a: str, b: str) -> int:
    """Depth of the deepest common ancestor of ``a`` and ``b`` (``ROOT`` 0): victims are
    offered deepest kinship first, siblings, then cousins, up the tree."""
    common = 0
    for x, y in zip(tree.path(a), tree.path(b), strict=False):
        if x != y:
            break
        common += 1
    return common - 1


def may_take(
    tree: QueueTree,
    reclaimer: str,
    victim_queue: str,
    rolled: Mapping[str, Resources],
    victim: Resources,
    level: int = -1,
    owed: Mapping[str, Resources] | None = None,
) -> str | None:
    """None if a pod holding ``victim`` in ``victim_queue`` may be reclaimed for a pod of
    ``reclaimer``'s queue, else why not.

    The victim's queue must stay at or above its guarantee on the dimensions the pod uses,
    and be over its deserved on one of them (or deserve none of them). So must each
    ancestor of ``victim_queue`` that ``reclaimer`` does not share, parent first: all of
    them with ``level`` -1, none with 0 (Volcano's default), the first N with N > 0. The
    caller checks that the pod holds what the reclaimer asks for, and takes each chosen
    victim out of ``rolled`` (at every ancestor) before weighing the next, so that no
    queue is reclaimed below its deserved.
    """
    used = rolled.get(victim_queue, {})
    floor = tree.guarantee[victim_queue]
    for d, v in victim.items():
        if v > EPS and floor.get(d, 0.0) > EPS and used.get(d, 0.0) - v < floor[d] - EPS:
            return f'queue "{victim_queue}" would fall below its guarantee'
    bar, what = (tree.deserved, "deserved") if owed is None else (owed, "fair")
    if not _over(bar, victim_queue, rolled, victim):
        return f'queue "{victim_queue}" is within its {what} share'
    below = kinship(tree, reclaimer, victim_queue) + 1
    diverging = tuple(reversed(tree.path(victim_queue)[below:-1]))
    if level >= 0:
        diverging = diverging[:level]
    for i, x in enumerate(diverging):
        if not _over(bar, x, rolled, victim):
            kin = "parent" if i == 0 else "ancestor"
            return f'its {kin} queue "{x}" is within its {what} share'
    return None


def _after(rolled: Mapping[str, Resources], queue: str, need: Resources) -> Resources:
    """``queue``'s usage with ``need`` added, on the dimensions ``need`` asks for."""
    used = rolled.get(queue, {})
    return add({d: used.get(d, 0.0) for d, v in need.items() if v > EPS}, need)


def _deserves(tree: QueueTree, queue: str) -> bool:
    return any(v > EPS for v in tree.deserved[queue].values())


def _under(
    bar: Mapping[str, Resources], queue: str, rolled: Mapping[str, Resources], need: Resources
) -> bool:
    """On one dimension of ``need`` that ``queue`` is owed (``bar``: deserved or fair),
    ``need`` more stays within."""
    deserved = bar.get(queue, {})
    after = _after(rolled, queue, need)
    return any(
        after[d] <= deserved[d] + EPS
        for d, v in need.items()
        if v > EPS and deserved.get(d, 0.0) > EPS
    )


def _over(
    bar: Mapping[str, Resources], queue: str, rolled: Mapping[str, Resources], victim: Resources
) -> bool:
    """``queue`` is owed (``bar``: deserved or fair) none of the dimensions ``victim``
    uses, or is over what it is owed on one of them."""
    deserved = bar.get(queue, {})
    used = rolled.get(queue, {})
    dims = [d for d, v in victim.items() if v > EPS and deserved.get(d, 0.0) > EPS]
    return not dims or any(used.get(d, 0.0) > deserved[d] + EPS for d in dims)
