"""Network topology for gangs: Volcano's HyperNodes, a PodGroup's ``networkTopology``,
and placing a gang inside one network domain.

A HyperNode (``topology.volcano.sh/v1alpha1``, cluster-scoped) is one network domain: a
``spec.tier`` (lower is closer: tier 1 a leaf switch, a rack), a ``spec.tierName`` and
``spec.members``, each a Node or a HyperNode chosen by exactly one selector
(``exactMatch.name``, ``regexMatch.pattern``, or for Nodes ``labelMatch``). Nested, they
form a tree. :func:`read_hypernode` reads one object with every rule it breaks (the
webhook refuses it with them); :func:`build` turns them, with the nodes' labels, into a
:class:`Fabric`: which nodes each domain holds, the domains of each tier, each node's
chain of domains. A HyperNode that names itself, or sits on a cycle of HyperNodes, is
told in ``Fabric.problems`` and holds no node through that cycle; nothing raises.
Clusters that write no HyperNodes may have them derived from node labels
(``scheduler.networkTopologyLabels``, :func:`from_labels`).

A PodGroup's ``spec.networkTopology`` (or its ``volcano.sh/network-topology-*``
annotations; :func:`read_topology`) asks for its gang inside one domain: ``hard`` (the
default) of a tier at most ``highestTierAllowed`` (or the tier of ``highestTierName``),
waiting otherwise; ``soft`` in the smallest domain that fits, else anywhere.

:func:`place_gang` decides. Free room is counted once per gang (:func:`room`: each node's
copies of the gang's pod shapes, read from the ledger's device index), summed per
domain; tiers are tried low to high, and within a tier the domains with room for the
whole gang, the one the gang fills best first (binpack of domains: big domains stay
whole for big gangs). The gang is then placed by ``Placer.place_gang`` with the placer
restricted to the chosen domain's nodes (``Placer.within``, shared/core/placement.py),
so the cost is one ordinary placement, not one per domain. A gang larger than every
domain of its allowed tiers (by their devices, whatever their use) is refused as
unresolvable. A gang without ``networkTopology`` never comes here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from shared.core.hosts import NOTHING, Selector
from shared.core.ledger import Statement
from shared.core.model import GangKey, NodeName, NonNegInt, PodRequest
from shared.core.placement import Failure, GangMember, GangResult, Placer
from shared.core.status import UNRESOLVABLE, Reason, Status, fail
from shared.core.subgroups import SubGroups, read_selector
from shared.core.vcjob import JobError, whole_field

API = "topology.volcano.sh/v1alpha1"
FIELD = "spec.networkTopology"
MODE_ANNOTATION = "volcano.sh/network-topology-mode"
TIER_ANNOTATION = "volcano.sh/network-topology-highest-tier"
PLUGIN = "NetworkTopology"
TRIES = 3
"""Domains of one tier a gang is placed in before the next tier is tried: the count of
free room is an estimate (cpu, memory and node filters are not in it), so the best
domain may still refuse the gang."""

Mode = Literal["hard", "soft"]


class NetworkTopology(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A PodGroup's ``spec.networkTopology`` as the watcher read it."""

    mode: Mode = "hard"
    highest_tier: NonNegInt | None = None
    """``highestTierAllowed``: the gang lands inside one domain of at most this tier."""
    highest_tier_name: str = ""
    """``highestTierName``: the same, naming the tier by a HyperNode's ``tierName``."""


class Member(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One entry of a HyperNode's ``spec.members``: what it takes in."""

    type: Literal["Node", "HyperNode"] = "Node"
    exact: str = ""
    """``selector.exactMatch.name``."""
    pattern: str = ""
    """``selector.regexMatch.pattern``: names it matches anywhere (anchor with ^ and $)."""
    labels: Selector | None = None
    """``selector.labelMatch`` (Nodes only)."""

    def matches(self, name: str, labels: Mapping[str, str] | None = None) -> bool:
        """Whether the object ``name`` (a Node's with its ``labels``) is taken in."""
        if self.exact:
            return name == self.exact
        if self.pattern:
            try:
                return re.search(self.pattern, name) is not None
            except re.error:
                return False
        if self.labels is not None and labels is not None:
            return self.labels.matches(labels)
        return False


class HyperNode(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A HyperNode as read (from the API server, or derived from node labels)."""

    name: str
    tier: NonNegInt = 0
    tier_name: str = ""
    members: tuple[Member, ...] = ()


# --- reading -------------------------------------------------------------------------


def read_topology(
    raw: Any, annotations: Mapping[str, str] | None = None, where: str = FIELD
) -> tuple[NetworkTopology | None, list[JobError]]:
    """A ``networkTopology`` as written (None: none asked), else the annotations'
    equivalents, and every rule it breaks, each naming its field. Never raises: a broken
    one is read as best it can be (a mode not hard or soft as hard)."""
    errors: list[JobError] = []

    def err(at: str, message: str) -> None:
        errors.append(JobError(at, message))

    if raw is None:
        return _from_annotations(annotations or {}, err), errors
    if not isinstance(raw, dict):
        err(where, "must be an object")
        return None, errors
    written = raw.get("mode") or "hard"
    if written not in ("hard", "soft"):
        err(f"{where}.mode", f"{written!r} is not hard or soft")
    mode: Mode = "soft" if written == "soft" else "hard"
    tier = whole_field(raw.get("highestTierAllowed"), f"{where}.highestTierAllowed", 0, err)
    name = raw.get("highestTierName")
    if name is not None and not isinstance(name, str):
        err(f"{where}.highestTierName", "must be a string")
        name = None
    if tier is not None and name:
        err(where, "highestTierAllowed and highestTierName are both set: set one")
        name = None
    return NetworkTopology(mode=mode, highest_tier=tier, highest_tier_name=name or ""), errors


def _from_annotations(
    annotations: Mapping[str, str], err: Callable[[str, str], None]
) -> NetworkTopology | None:
    mode = annotations.get(MODE_ANNOTATION)
    tier_text = annotations.get(TIER_ANNOTATION)
    if mode is None and tier_text is None:
        return None
    if mode not in (None, "hard", "soft"):
        err(f"metadata.annotations[{MODE_ANNOTATION}]", f"{mode!r} is not hard or soft")
        mode = "hard"
    tier: int | None = None
    if tier_text is not None:
        if tier_text.strip().isdigit():
            tier = int(tier_text)
        else:
            err(
                f"metadata.annotations[{TIER_ANNOTATION}]",
                f"{tier_text!r} is not a tier (0, 1, ...)",
            )
    return NetworkTopology(mode="soft" if mode == "soft" else "hard", highest_tier=tier)


def read_hypernode(obj: Mapping[str, Any]) -> tuple[HyperNode, list[JobError]]:
    """A HyperNode object, and every rule its spec breaks on its own (a member naming the
    HyperNode itself included; cycles through others are :func:`build`'s to find)."""
    errors: list[JobError] = []

    def err(at: str, message: str) -> None:
        errors.append(JobError(at, message))

    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        err("spec", "required")
        return HyperNode(name=name), errors
    tier = whole_field(spec.get("tier"), "spec.tier", 0, err, required=True)
    tier_name = spec.get("tierName") or ""
    if not isinstance(tier_name, str):
        err("spec.tierName", "must be a string")
        tier_name = ""
    raw = spec.get("members")
    if not isinstance(raw, list) or not raw:
        err("spec.members", "needs at least one member")
        raw = []
    members = []
    for i, entry in enumerate(raw):
        member = _member(entry, f"spec.members[{i}]", err)
        if member is None:
            continue
        if member.type == "HyperNode" and member.matches(name):
            err(f"spec.members[{i}]", f"names the HyperNode {name} itself")
            continue
        members.append(member)
    return HyperNode(name=name, tier=tier or 0, tier_name=tier_name, members=tuple(members)), errors


def _member(entry: Any, where: str, err: Callable[[str, str], None]) -> Member | None:
    if not isinstance(entry, dict):
        err(where, "must be an object")
        return None
    written = entry.get("type") or "Node"
    if written not in ("Node", "HyperNode"):
        err(f"{where}.type", f"{written!r} is not Node or HyperNode")
        return None
    kind: Literal["Node", "HyperNode"] = "Node" if written == "Node" else "HyperNode"
    selector = entry.get("selector")
    if not isinstance(selector, dict):
        err(f"{where}.selector", "required")
        return None
    written = [k for k in ("exactMatch", "regexMatch", "labelMatch") if selector.get(k) is not None]
    if len(written) != 1:
        err(f"{where}.selector", "set exactly one of exactMatch, regexMatch and labelMatch")
        return None
    at = f"{where}.selector.{written[0]}"
    value = selector[written[0]]
    if written[0] == "labelMatch":
        if kind != "Node":
            err(at, "only members of type Node may be chosen by labels")
            return None
        labels = read_selector(value, at, err)
        return None if labels is NOTHING else Member(type="Node", labels=labels)
    key = "name" if written[0] == "exactMatch" else "pattern"
    text = value.get(key) if isinstance(value, dict) else None
    if not isinstance(text, str) or not text:
        err(f"{at}.{key}", "required")
        return None
    if key == "pattern":
        try:
            re.compile(text)
        except re.error as exc:
            err(f"{at}.pattern", f"is not a regular expression: {exc}")
            return None
        return Member(type=kind, pattern=text)
    return Member(type=kind, exact=text)


def refusal(what: str, errors: Sequence[JobError]) -> str:
    """What a user is told of an object whose topology fields break a rule."""
    return f"invalid {what}: " + "; ".join(f"{e.field}: {e.message}" for e in errors)


def from_labels(
    keys: Sequence[str], nodes: Mapping[NodeName, Mapping[str, str]]
) -> list[HyperNode]:
    """HyperNodes derived from node labels (Volcano's ``label`` discovery source):
    ``keys`` from the top tier down, ``kubernetes.io/hostname`` (the nodes themselves)
    implied below the last. The last key's values are tier 1, each holding the nodes
    that carry it; each key above is one tier up, holding the domains below whose nodes
    carry its value. A node lacking a key is in no domain of that tier or below. A
    domain is named by its label value, qualified by its parent's when two parents share
    one; its ``tierName`` is the key's last path segment (``rack`` for
    ``example.com/rack``)."""
    levels = [k for k in keys if k != "kubernetes.io/hostname"]
    if not levels:
        return []
    made: list[HyperNode] = []
    # path of values from the top → nodes, per depth
    below: dict[tuple[str, ...], str] = {}
    depth_count = len(levels)
    for depth in range(depth_count - 1, -1, -1):
        tier = depth_count - depth
        key = levels[depth]
        tier_name = key.rsplit("/", 1)[-1]
        groups: dict[tuple[str, ...], list[NodeName]] = {}
        for node, labels in nodes.items():
            path = tuple(labels.get(k, "") for k in levels[: depth + 1])
            if all(path):
                groups.setdefault(path, []).append(node)
        by_value: dict[str, int] = {}
        for path in groups:
            by_value[path[-1]] = by_value.get(path[-1], 0) + 1
        names = {p: p[-1] if by_value[p[-1]] == 1 else "-".join(p) for p in groups}
        for path, members in sorted(groups.items()):
            if depth == depth_count - 1:
                chosen = tuple(Member(type="Node", exact=n) for n in sorted(members))
            else:
                chosen = tuple(
                    Member(type="HyperNode", exact=below[p])
                    for p in sorted(below)
                    if p[: depth + 1] == path
                )
            made.append(HyperNode(name=names[path], tier=tier, tier_name=tier_name, members=chosen))
        below = {p: names[p] for p in groups}
    return made


# --- the tree --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Domain:
    """One HyperNode as placement reads it: its tier and every node under it."""

    name: str
    tier: int
    tier_name: str
    nodes: frozenset[NodeName]

    def title(self) -> str:
        """``tier-1 HyperNode (rack)``: how messages name its tier."""
        named = f" ({self.tier_name})" if self.tier_name else ""
        return f"tier-{self.tier} HyperNode{named}"


@dataclass(slots=True)
class Fabric:
    """The domains of a cluster (empty: no HyperNodes, topology is not applied)."""

    domains: dict[str, Domain] = field(default_factory=dict)
    tiers: dict[int, list[Domain]] = field(default_factory=dict)
    """Each tier's domains, in name order; tiers ascending."""
    problems: dict[str, str] = field(default_factory=dict)
    """HyperNode → why part of it was left out (a cycle, a member naming itself)."""
    of_node: dict[NodeName, tuple[str, ...]] = field(default_factory=dict)
    """Each node's chain of domains, lowest tier first."""

    def tier_of(self, name: str) -> int | None:
        """The tier of the HyperNodes whose ``tierName`` is ``name`` (None: none has it)."""
        found = [d.tier for d in self.domains.values() if d.tier_name == name]
        return min(found) if found else None

    def tier_names(self) -> set[str]:
        """Every ``tierName`` written."""
        return {d.tier_name for d in self.domains.values() if d.tier_name}


def build(hypernodes: Iterable[HyperNode], nodes: Mapping[NodeName, Mapping[str, str]]) -> Fabric:
    """The tree of ``hypernodes`` over ``nodes`` (each node's labels): which nodes each
    HyperNode holds, through its members and theirs. A HyperNode reached again while
    its own members are resolved (a cycle, itself included) contributes nothing there,
    and every HyperNode on the cycle is named in ``problems``."""
    specs = {h.name: h for h in hypernodes}
    fabric = Fabric()
    resolved: dict[str, frozenset[NodeName]] = {}
    children: dict[str, list[str]] = {}
    for h in specs.values():
        children[h.name] = [
            other
            for m in h.members
            if m.type == "HyperNode"
            for other in ([m.exact] if m.exact else sorted(specs))
            if other in specs and other != h.name and m.matches(other)
        ]

    def resolve(name: str, path: list[str]) -> frozenset[NodeName]:
        done = resolved.get(name)
        if done is not None:
            return done
        if name in path:
            cycle = path[path.index(name) :]
            for on in cycle:
                fabric.problems.setdefault(
                    on, "HyperNodes form a cycle: " + " → ".join([*cycle, name])
                )
            return frozenset()
        h = specs[name]
        found: set[NodeName] = set()
        for m in h.members:
            if m.type != "Node":
                continue
            if m.exact:
                if m.exact in nodes:
                    found.add(NodeName(m.exact))
                continue
            found.update(n for n, labels in nodes.items() if m.matches(n, labels))
        for child in children[name]:
            found |= resolve(child, [*path, name])
        made = resolved[name] = frozenset(found)
        return made

    for name in sorted(specs):
        resolved_nodes = resolve(name, [])
        h = specs[name]
        fabric.domains[name] = Domain(name, h.tier, h.tier_name, resolved_nodes)
    for d in sorted(fabric.domains.values(), key=lambda d: (d.tier, d.name)):
        fabric.tiers.setdefault(d.tier, []).append(d)
        for n in d.nodes:
            fabric.of_node[n] = (*fabric.of_node.get(n, ()), d.name)
    return fabric


# --- placing a gang --------------------------------------------------------------------


def room(placer: Placer, request: PodRequest, *, empty: bool = False) -> dict[NodeName, int]:
    """Per node, how many pods of ``request``'s shape its free devices could take now
    (``empty``: were all its devices free). An estimate from the first device request:
    cpu, memory and node filters are the placement's to check. Now is read from the
    ledger's device index, so it costs the free devices, not every device; ``empty``
    costs every device (asked only of a gang no domain has room for)."""
    primary = next((r for c in request.containers for r in c.devices), None)
    counts: dict[NodeName, int] = {}
    if primary is None:
        return counts
    count = max(primary.count, 1)
    for pool, family in placer.routes(primary, request):
        index = placer.ledger.pools.get(pool)
        if index is None:
            continue
        mem, cores = family.demand(primary, index)
        if empty:
            for name, node in placer.ledger.nodes.items():
                devs = node.pools.get(pool)
                if not devs:
                    continue
                if count > 1 or primary.exclusive or not mem:
                    total = len(devs)
                else:
                    total = sum(max(d.total_mem // mem, 1) for d in devs)
                counts[name] = counts.get(name, 0) + total // count
            continue
        free: dict[NodeName, int] = {}
        for dev, (_, dev_mem, dev_cores) in index.where.items():
            if dev_mem < mem or dev_cores < cores:
                continue
            copies = 1 if primary.exclusive else dev.slots - dev.used_slots
            if mem:
                copies = min(copies, dev_mem // mem)
            if cores:
                copies = min(copies, dev_cores // cores)
            if copies > 0:
                name = dev.node.name
                free[name] = free.get(name, 0) + (copies if count == 1 else 1)
        for name, n in free.items():
            counts[name] = counts.get(name, 0) + n // count
    return counts


@dataclass(slots=True)
class _Need:
    """The gang's pods by request shape (those asking devices), and each shape's room
    per node now; the room of empty nodes is counted when first asked."""

    placer: Placer
    shapes: list[tuple[PodRequest, int, dict[NodeName, int]]]
    """(the shape, its pods, room now per node)."""
    _empty: list[dict[NodeName, int]] | None = None

    @property
    def devices(self) -> bool:
        return bool(self.shapes)

    def fits(self, nodes: frozenset[NodeName]) -> int:
        """How many of the gang's pods the domain holding ``nodes`` has room for now."""
        return sum(min(n, _sum(now, nodes)) for _, n, now in self.shapes)

    def could(self, nodes: frozenset[NodeName]) -> int:
        """How many it could hold, empty."""
        if self._empty is None:
            self._empty = [room(self.placer, r, empty=True) for r, _, _ in self.shapes]
        return sum(
            min(n, _sum(ever, nodes))
            for (_, n, _), ever in zip(self.shapes, self._empty, strict=True)
        )


def _sum(per_node: dict[NodeName, int], nodes: frozenset[NodeName]) -> int:
    if len(nodes) < len(per_node):
        return sum(per_node.get(n, 0) for n in nodes)
    return sum(v for n, v in per_node.items() if n in nodes)


def _need(placer: Placer, members: Sequence[GangMember]) -> _Need:
    shapes: dict[PodRequest, int] = {}
    for m in members:
        if m.request.wants_devices:
            shapes[m.request] = shapes.get(m.request, 0) + 1
    return _Need(placer, [(r, n, room(placer, r)) for r, n in shapes.items()])


def limit(fabric: Fabric, topology: NetworkTopology) -> int | Status:
    """The highest tier the gang may span (a soft gang: every tier), or why it cannot
    be known (a ``highestTierName`` no HyperNode has)."""
    top = max(fabric.tiers, default=0)
    if topology.highest_tier_name:
        tier = fabric.tier_of(topology.highest_tier_name)
        if tier is None:
            known = ", ".join(sorted(fabric.tier_names())) or "none"
            why = (
                f'networkTopology.highestTierName "{topology.highest_tier_name}" names no '
                f"HyperNode's tierName (known: {known})"
            )
            return fail(Reason(kind="network-topology", detail=why, plugin=PLUGIN))
        return tier
    if topology.highest_tier is not None:
        return topology.highest_tier
    return top


def place_gang(
    placer: Placer,
    fabric: Fabric,
    topology: NetworkTopology | None,
    members: Sequence[GangMember],
    min_member: int,
    *,
    owner: GangKey | None = None,
    statement: Statement | None = None,
    fragmentation_guard: int | None = None,
    subgroups: SubGroups | None = None,
) -> GangResult:
    """``Placer.place_gang`` inside one network domain as ``topology`` asks (None, or a
    cluster without HyperNodes: as ``Placer.place_gang`` alone). See the module
    docstring for the order domains are tried in."""

    def place(within: frozenset[NodeName] | None, count: int = min_member) -> GangResult:
        placer.within = within
        try:
            return placer.place_gang(
                members,
                count,
                owner=owner,
                statement=statement,
                fragmentation_guard=fragmentation_guard,
                subgroups=subgroups,
            )
        finally:
            placer.within = None

    if topology is None or not fabric.tiers or not members:
        return place(None)
    highest = limit(fabric, topology)
    if isinstance(highest, Status):
        if topology.mode == "soft":
            return place(None)
        return _refusal(members, highest)
    tiers = (
        [t for t in fabric.tiers if t <= highest] if topology.mode == "hard" else list(fabric.tiers)
    )
    required = min(max(min_member, 1), len(members))
    need = _need(placer, members[:required])
    best: tuple[int, Domain] | None = None
    last: GangResult | None = None
    for tier in sorted(tiers):
        candidates = []
        for domain in fabric.tiers[tier]:
            if not domain.nodes:
                continue
            if not need.devices:
                candidates.append((len(domain.nodes), domain))
                continue
            fits = need.fits(domain.nodes)
            if best is None or fits > best[0]:
                best = (fits, domain)
            if fits >= required:
                candidates.append((fits, domain))
        # Binpack of domains: the one the gang fills best (least room left) first.
        candidates.sort(key=lambda c: (c[0], c[1].name))
        for _, domain in candidates[:TRIES]:
            result = place(domain.nodes)
            if result.ok:
                return result
            last = result
    if topology.mode == "soft":
        return place(None)
    return _refusal(members, _refused(fabric, highest, required, need, best, last))


def _refusal(members: Sequence[GangMember], status: Status) -> GangResult:
    """The gang not placed, every member told ``status``."""
    return GangResult(status=status, failures=[Failure(pod=m.pod, status=status) for m in members])


def _refused(
    fabric: Fabric,
    highest: int,
    required: int,
    need: _Need,
    best: tuple[int, Domain] | None,
    last: GangResult | None,
) -> Status:
    """Why a hard gang waits (or can never be placed) in one domain of tier ≤ ``highest``."""
    allowed = [d for t, ds in fabric.tiers.items() if t <= highest for d in ds]
    if not allowed:
        tiers = ", ".join(str(t) for t in sorted(fabric.tiers))
        why = f"networkTopology allows tiers up to {highest}; no HyperNode has one (tiers: {tiers})"
        return Status(
            code=UNRESOLVABLE,
            reasons=(
                Reason(kind="network-topology", code=UNRESOLVABLE, detail=why, plugin=PLUGIN),
            ),
        )
    top = max(d.tier for d in allowed)
    title = next(d for d in allowed if d.tier == top).title()
    largest: tuple[int, Domain] | None = None
    for d in allowed if need.devices else ():
        could = need.could(d.nodes)
        if largest is None or could > largest[0]:
            largest = (could, d)
    if need.devices and (largest is None or largest[0] < required):
        held = (
            f"the largest, {largest[1].name}, holds {largest[0]}" if largest else "none holds any"
        )
        why = (
            f"the gang's {required} pods are more than any {title} or below holds: {held} "
            "(networkTopology mode hard)"
        )
        return Status(
            code=UNRESOLVABLE,
            reasons=(
                Reason(kind="network-topology", code=UNRESOLVABLE, detail=why, plugin=PLUGIN),
            ),
        )
    if best is not None and best[0] < required:
        why = (
            f"no {title} or below has room for all {required} pods of the gang: the best, "
            f"{best[1].name}, fits {best[0]}"
        )
    else:
        why = f"no {title} or below could take all {required} pods of the gang"
        if last is not None:
            why += f" (the last tried: {last.message})"
    return fail(Reason(kind="network-topology", detail=why, plugin=PLUGIN))
