"""InterPodAffinity: required pod affinity and anti-affinity (the pod's, and existing
pods' anti-affinity towards it) per topology domain; preferred terms in the score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from msgspec.structs import replace

from shared.core.framework import FilterPlugin, ScorePlugin
from shared.core.hosts import AffinityTerm
from shared.core.model import NodeName, PodUID
from shared.core.status import UNRESOLVABLE, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "InterPodAffinity"
POD_AFFINITY = fail(Reason(kind="pod-affinity", code=UNRESOLVABLE, plugin=NAME))
POD_ANTI_AFFINITY = fail(Reason(kind="pod-anti-affinity", plugin=NAME))
EXISTING_ANTI_AFFINITY = fail(Reason(kind="existing-anti-affinity", plugin=NAME))


class InterPodAffinity(FilterPlugin, ScorePlugin):
    """PreFilter: matching pods per domain for each of the pod's required terms, and
    existing pods' anti-affinity terms that match it. Filter: a domain with the pods its
    affinity asks for (or none anywhere and the pod matches itself), none its
    anti-affinity excludes, none whose anti-affinity excludes it. Score: preferred
    terms both ways, weight 2."""

    name = NAME
    weight = 2

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """Count the domains of every required term, the pod's and the others'."""
        pod = prep.pod
        if not hosts.anti_pods and not pod.affinity and not pod.anti_affinity:
            return False  # no term either way (the common pod)
        ns_labels = hosts.namespace_labels(pod.namespace)
        existing: dict[tuple[str, str], int] = {}
        for uid, node in hosts.anti_pods.items():
            labels = hosts.nodes[node].labels
            for t in hosts.pods[uid][1].anti_affinity:
                if t.topology_key in labels and t.matches(pod.namespace, pod.labels, ns_labels):
                    key = (t.topology_key, labels[t.topology_key])
                    existing[key] = existing.get(key, 0) + 1
        prep.existing_anti = existing
        if not pod.affinity and not pod.anti_affinity:
            return bool(existing)
        affinity = [_resolve(hosts, t) for t in pod.affinity]
        anti = [_resolve(hosts, t) for t in pod.anti_affinity]
        aff: dict[tuple[str, str], int] = {}
        if affinity:
            seen: set[PodUID] = set()
            for t in affinity:
                for uid in hosts.matching(hosts.term_namespaces(t), t.selector):
                    if uid in seen:
                        continue
                    seen.add(uid)
                    node, other = hosts.pods[uid]
                    if all(x.matches(other.namespace, other.labels, None) for x in affinity):
                        labels = hosts.nodes[node].labels
                        for x in affinity:
                            if x.topology_key in labels:
                                key = (x.topology_key, labels[x.topology_key])
                                aff[key] = aff.get(key, 0) + 1
        against: dict[tuple[str, str], int] = {}
        for t in anti:
            for uid in set(hosts.matching(hosts.term_namespaces(t), t.selector)):
                node, other = hosts.pods[uid]
                labels = hosts.nodes[node].labels
                if t.topology_key in labels and t.matches(other.namespace, other.labels, None):
                    key = (t.topology_key, labels[t.topology_key])
                    against[key] = against.get(key, 0) + 1
        prep.affinity, prep.anti = affinity, anti
        prep.affinity_counts, prep.anti_counts = aff, against
        prep.self_affine = not aff and all(
            t.matches(pod.namespace, pod.labels, None) for t in affinity
        )
        return True

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """The node's domains against the counts."""
        labels = host.labels
        counts = prep.affinity_counts
        exist = True
        for t in prep.affinity:
            value = labels.get(t.topology_key)
            if value is None:
                return POD_AFFINITY
            if counts.get((t.topology_key, value), 0) <= 0:
                exist = False
        if not exist and not prep.self_affine:
            return POD_AFFINITY
        if prep.anti_counts:
            for t in prep.anti:
                value = labels.get(t.topology_key)
                if value is not None and prep.anti_counts.get((t.topology_key, value), 0) > 0:
                    return POD_ANTI_AFFINITY
        if prep.existing_anti:
            for item in labels.items():
                if prep.existing_anti.get(item, 0) > 0:
                    return EXISTING_ANTI_AFFINITY
        return None

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """The pod's preferred terms, and existing pods' terms towards it (required
        affinity counts 1, preferred its weight, anti-affinity negative), summed over
        each node's domains and normalised between the lowest and the highest."""
        pod = prep.pod
        own = [(w.weight, w.term) for w in pod.preferred_affinity] + [
            (-w.weight, w.term) for w in pod.preferred_anti_affinity
        ]
        index = prep.hosts
        if not own and not index.affine_pods:
            return None
        by_domain: dict[tuple[str, str], float] = {}

        def add(term: AffinityTerm, node: NodeName, weight: float) -> None:
            labels = index.nodes[node].labels
            value = labels.get(term.topology_key)
            if value is not None:
                key = (term.topology_key, value)
                by_domain[key] = by_domain.get(key, 0.0) + weight

        ns_labels = index.namespace_labels(pod.namespace)
        for weight, term in own:
            for uid in set(index.matching(index.term_namespaces(term), term.selector)):
                node, other = index.pods[uid]
                if term.matches(other.namespace, other.labels, None):
                    add(term, node, weight)
        for uid, node in index.affine_pods.items():
            other = index.pods[uid][1]
            for term in other.affinity:
                if term.matches(pod.namespace, pod.labels, ns_labels):
                    add(term, node, 1)
            for w in other.preferred_affinity:
                if w.term.matches(pod.namespace, pod.labels, ns_labels):
                    add(w.term, node, w.weight)
            for w in other.preferred_anti_affinity:
                if w.term.matches(pod.namespace, pod.labels, ns_labels):
                    add(w.term, node, -w.weight)
        if not by_domain:
            return None
        raw = [sum(by_domain.get(item, 0.0) for item in h.labels.items()) for h in hosts]
        low, high = min(raw), max(raw)
        return [float(int(100 * (r - low) / (high - low))) if high > low else 0.0 for r in raw]


def _resolve(hosts: Hosts, term: AffinityTerm) -> AffinityTerm:
    """The incoming pod's term with its namespace selector resolved to namespaces, as
    kube-scheduler does: the selector still applies, against an empty label set (so a
    selector of only NotIn/DoesNotExist matches pods in every namespace)."""
    sel = term.namespace_selector
    if sel.nothing or sel.everything:
        return term
    names = {n for n, labels in hosts.namespaces.items() if sel.matches(labels)}
    names |= {
        n
        for n in hosts.ns_pods
        if n not in hosts.namespaces and sel.matches(hosts.namespace_labels(n))
    }
    if not names - set(term.namespaces):
        return term
    return replace(term, namespaces=tuple(sorted({*term.namespaces, *names})))
