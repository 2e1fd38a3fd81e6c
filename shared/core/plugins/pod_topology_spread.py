"""PodTopologySpread: a ``DoNotSchedule`` constraint keeps the matching pods' count per
topology domain within ``maxSkew`` of the least loaded domain; ``ScheduleAnyway``
constraints prefer the less loaded domains."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin, ScorePlugin
from shared.core.hosts import HOSTNAME, PodSpec, SpreadConstraint
from shared.core.model import NodeName
from shared.core.status import UNRESOLVABLE, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "PodTopologySpread"
SPREAD = fail(Reason(kind="spread", plugin=NAME))
SPREAD_LABEL = fail(Reason(kind="spread-label", code=UNRESOLVABLE, plugin=NAME))


@dataclass(slots=True)
class Spread:
    """One constraint, prepared: matching pods per domain, the minimum, and whether the
    pod itself matches (it counts where it goes)."""

    c: SpreadConstraint
    counts: dict[str, int]
    low: int
    own: int


class PodTopologySpread(FilterPlugin, ScorePlugin):
    """PreFilter: each hard constraint's counts per domain. Filter: the node carries the
    key and its domain stays within the skew. Score: soft constraints, weight 2."""

    name = NAME
    reads = "spread"
    weight = 2

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """Count the matching pods of each hard constraint's domains."""
        pod = prep.pod
        prep.spread = tuple(spread(hosts, pod, c) for c in pod.spread if c.hard)
        return bool(prep.spread)

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """Each hard constraint on the node's domain."""
        labels = host.labels
        for s in prep.spread:
            value = labels.get(s.c.topology_key)
            if value is None:
                return SPREAD_LABEL
            low = s.low if len(s.counts) >= s.c.min_domains else 0
            if s.counts.get(value, 0) + s.own - low > s.c.max_skew:
                return SPREAD
        return None

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """Fewer matching pods in a node's domain score higher, each constraint weighed
        by the log of its domain count (kube-scheduler's formula)."""
        soft = [c for c in prep.pod.spread if not c.hard]
        if not soft:
            return None
        pod = prep.pod
        raw: list[float] = []
        keys = {c.topology_key for c in soft}
        # domains counted over the feasible nodes carrying every key (the node count
        # for the hostname key), as kube weighs them: bench/parity.py's scored cases
        scored = [h.labels for h in hosts if all(k in h.labels for k in keys)]
        sizes = {k: len(scored) if k == HOSTNAME else len({x[k] for x in scored}) for k in keys}
        for h in hosts:
            labels = h.labels
            if any(k not in labels for k in keys):
                raw.append(-1.0)
                continue
            score = 0.0
            for c in soft:
                counted = spread(prep.hosts, pod, c)
                weight = math.log((sizes[c.topology_key] or 1) + 2)
                score += counted.counts.get(labels[c.topology_key], 0) * weight + (c.max_skew - 1)
            raw.append(float(round(score)))
        valid = [r for r in raw if r >= 0]
        low = min(valid, default=0.0)
        high = max([*valid, 0.0])
        return [
            0.0 if r < 0 else 100.0 if high == 0 else 100 * (high + low - r) // high for r in raw
        ]


def domains_of(
    hosts: Hosts, pod: PodSpec, c: SpreadConstraint
) -> tuple[dict[str, set[NodeName]], dict[NodeName, str]]:
    """Topology domains of ``c.topology_key`` over the nodes ``pod`` counts on: those
    with every hard constraint's key, passing the inclusion policies. Cached per pod
    shape until a node changes (``Hosts.domains``)."""
    keys = tuple(sorted({x.topology_key for x in pod.spread if x.hard}))
    sig = (
        c.topology_key,
        keys,
        c.honor_affinity and (tuple(sorted(pod.node_selector.items())), pod.node_affinity),
        c.honor_taints and pod.tolerations,
    )
    cached = hosts.domains.get(sig)
    if cached is not None:
        return cached
    found: dict[str, set[NodeName]] = {}
    values = hosts.label_nodes.get(c.topology_key, {})
    for value, nodes in values.items():
        for name in nodes:
            labels = hosts.nodes[name].labels
            if any(k not in labels for k in keys):
                continue
            if c.honor_affinity and not pod.matches_node(name, labels):
                continue
            spec = hosts.nodes[name].spec
            if c.honor_taints and spec is not None and pod.tolerates(spec.taints) is not None:
                continue
            found.setdefault(value, set()).add(name)
    member = {n: v for v, nodes in found.items() for n in nodes}
    hosts.domains[sig] = (found, member)
    return found, member


def spread(hosts: Hosts, pod: PodSpec, c: SpreadConstraint) -> Spread:
    """``c`` prepared for ``pod``: the matching pods of each domain (terminating pods
    not counted) and the minimum over the domains (0 below ``minDomains``)."""
    domains, member = domains_of(hosts, pod, c)
    counts = dict.fromkeys(domains, 0)
    if not c.selector.everything:
        reqs = c.selector.requirements
        # One pinned label: the index hands exactly its pods, no need to match again.
        exact = len(reqs) == 1 and reqs[0].op == "In" and len(reqs[0].values) == 1
        pods = hosts.pods
        for uid in hosts.matching((pod.namespace,), c.selector):
            node, other = pods[uid]
            value = member.get(node)
            if (
                value is not None
                and not other.terminating
                and (exact or c.selector.matches(other.labels))
            ):
                counts[value] += 1
    low = min(counts.values()) if len(counts) >= c.min_domains else 0
    return Spread(c, counts, low, 1 if c.selector.matches(pod.labels) else 0)
