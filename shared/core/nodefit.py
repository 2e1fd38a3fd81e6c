"""Node fit: kube-scheduler's filters and scores, for every pod, on every node.

:class:`Hosts` is the host side of the allocator's cache: each node's spec (labels,
taints, allocatable, cordon) and every pod on it, of any scheduler, with running totals
and the indexes the filters need so that none of them scans every node or pod per
placement: nodes by label, pods by (namespace, label), pods with required
anti-affinity, per-constraint topology domains and, per pod shape, the nodes its
Node-only filters rule out (both cached until a node changes).

:meth:`Hosts.prepare` is kube-scheduler's PreFilter for one pod; the
:class:`Prepared` it returns runs the Filter plugins on any node, in kube-scheduler's
order, answering the first failure's :class:`~shared.core.status.Status` with the same
reasons (text and resolvability) as the pinned release:

    NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts,
    NodeResourcesFit, VolumeBinding, VolumeZone, PodTopologySpread, InterPodAffinity,
    DynamicResources

(VolumeBinding, VolumeZone and DynamicResources on the pod's bound volumes and
allocated resource claims, as shared/core/claims.py read them: ``PodSpec.claims``, whose
``wait`` is their PreFilter verdict) and scores a window of feasible nodes
(``Prepared.score``). The differential test (bench/parity.py) compares this module node
by node with kube-scheduler itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from msgspec.structs import replace

from shared.core.hosts import (
    CPU,
    EPHEMERAL,
    GA_LABELS,
    HOSTNAME,
    MEMORY,
    PODS,
    UNSCHEDULABLE_TAINT,
    ZONE_LABELS,
    AffinityTerm,
    Claims,
    HostPort,
    NodeSpec,
    PodSpec,
    Selector,
    SpreadConstraint,
    Taint,
)
from shared.core.model import NodeName, PodUID
from shared.core.status import UNRESOLVABLE, UNSCHEDULABLE, Code, Reason, Status, fail

# kube-scheduler's reasons, each as one constant Status (a node's first failure).
NODE_UNSCHEDULABLE = fail(Reason(kind="node-unschedulable", code=UNRESOLVABLE))
NODE_NAME = fail(Reason(kind="node-name", code=UNRESOLVABLE))
TAINTED = fail(Reason(kind="taint", code=UNRESOLVABLE))
NODE_AFFINITY = fail(Reason(kind="node-affinity", code=UNRESOLVABLE))
OUTSIDE_NODE_SET = fail(Reason(kind="node-set", code=UNRESOLVABLE))
NODE_PORTS = fail(Reason(kind="node-ports"))
SPREAD = fail(Reason(kind="spread"))
SPREAD_LABEL = fail(Reason(kind="spread-label", code=UNRESOLVABLE))
POD_AFFINITY = fail(Reason(kind="pod-affinity", code=UNRESOLVABLE))
POD_ANTI_AFFINITY = fail(Reason(kind="pod-anti-affinity"))
EXISTING_ANTI_AFFINITY = fail(Reason(kind="existing-anti-affinity"))
TOO_MANY_PODS = Reason(kind="too-many-pods")
VOLUME_NODE = fail(Reason(kind="volume-node", code=UNRESOLVABLE))
VOLUME_MISSING = fail(Reason(kind="volume-missing", code=UNRESOLVABLE))
VOLUME_ZONE = fail(Reason(kind="volume-zone", code=UNRESOLVABLE))
CLAIM_NODE = fail(Reason(kind="claim-node", code=UNRESOLVABLE))

_UNSCHEDULABLE = Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")
_NONE_RULED_OUT: frozenset[NodeName] = frozenset()
RULED_OUT_SHAPES = 256
"""Pod shapes whose ruled-out nodes ``Hosts`` keeps at once (then it starts again)."""
_BASIC = (CPU, MEMORY, EPHEMERAL)


class HostNode:
    """One node's host side: its spec (None until its Node object is known) and the
    pods on it, with their summed requests and ports."""

    __slots__ = (
        "count",
        "full",
        "name",
        "nonzero_cpu",
        "nonzero_memory",
        "pods",
        "ports",
        "requested",
        "spec",
    )

    def __init__(self, name: NodeName) -> None:
        self.name = name
        self.spec: NodeSpec | None = None
        self.pods: dict[PodUID, PodSpec] = {}
        self.requested: dict[str, int] = {}
        self.nonzero_cpu = 0
        self.nonzero_memory = 0
        self.count = 0
        self.ports: list[HostPort] = []
        self.full = False
        """No pod seen so far would fit its cpu, memory or pod slots (``Hosts.floors``):
        its devices leave the placement index until that changes."""

    @property
    def labels(self) -> Mapping[str, str]:
        return self.spec.labels if self.spec is not None else _NO_LABELS

    def _add(self, pod: PodSpec, sign: int) -> None:
        req = self.requested
        for k, v in pod.requests.items():
            req[k] = req.get(k, 0) + sign * v
        self.nonzero_cpu += sign * pod.nonzero_cpu
        self.nonzero_memory += sign * pod.nonzero_memory
        self.count += sign
        if pod.ports:
            if sign > 0:
                self.ports.extend(pod.ports)
            else:
                for p in pod.ports:
                    self.ports.remove(p)


_NO_LABELS: Mapping[str, str] = {}


class Hosts:
    """Every node's host side and every pod on a node (see the module docstring).

    Idempotent like the ledger: adding a pod twice or removing an unknown one is a
    no-op, so replayed events cannot count a pod twice.
    """

    def __init__(self) -> None:
        self.nodes: dict[NodeName, HostNode] = {}
        self.pods: dict[PodUID, tuple[NodeName, PodSpec]] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        """Namespace labels (for namespace selectors); unknown namespaces have
        ``kubernetes.io/metadata.name`` only."""
        self.label_nodes: dict[str, dict[str, set[NodeName]]] = {}
        """key → value → nodes carrying that label."""
        self.pod_labels: dict[tuple[str, str, str], dict[PodUID, NodeName]] = {}
        """(namespace, key, value) → pods carrying that label."""
        self.ns_pods: dict[str, dict[PodUID, NodeName]] = {}
        self.anti_pods: dict[PodUID, NodeName] = {}
        """Pods with required anti-affinity: they may keep the next pod off a node."""
        self.affine_pods: dict[PodUID, NodeName] = {}
        """Pods with any pod (anti-)affinity: their terms weigh in scoring."""
        self.version = 0
        """Bumped on every node spec change: cached domains are dropped."""
        self.prefer_not: set[NodeName] = set()
        """Nodes with a PreferNoSchedule taint (scores matter for every pod then)."""
        self.restricted: set[NodeName] = set()
        """Nodes cordoned or with a NoSchedule or NoExecute taint (some pods may not go
        there whatever they ask)."""
        self.floors: dict[str, int] = {}
        """The smallest cpu and memory any pod placed so far asked for: a node with less
        free than that is ``full`` (what keeps a walk of the device index from passing
        the same exhausted nodes for every pod). Only ever lowered."""
        self.full: set[NodeName] = set()
        self.refill: set[NodeName] = set()
        """Nodes whose fullness changed since the ledger last re-filed their devices."""
        self._domains: dict[
            tuple[object, ...], tuple[dict[str, set[NodeName]], dict[NodeName, str]]
        ] = {}
        self._ruled_out: dict[tuple[object, ...], frozenset[NodeName]] = {}
        """Per pod shape: the nodes its Node-only filters rule out (``Prepared.ruled_out``),
        until a node changes."""

    # --- nodes -------------------------------------------------------------------------

    def node(self, name: NodeName) -> HostNode:
        host = self.nodes.get(name)
        if host is None:
            host = self.nodes[name] = HostNode(name)
        return host

    def set_spec(self, spec: NodeSpec) -> None:
        """A node's labels, taints, allocatable and cordon (its Node object)."""
        name = NodeName(spec.name)
        host = self.node(name)
        if host.spec == spec:
            return
        self._index_labels(host, -1)
        host.spec = spec
        self._index_labels(host, 1)
        if any(t.effect == "PreferNoSchedule" for t in spec.taints):
            self.prefer_not.add(name)
        else:
            self.prefer_not.discard(name)
        if spec.unschedulable or any(t.effect != "PreferNoSchedule" for t in spec.taints):
            self.restricted.add(name)
        else:
            self.restricted.discard(name)
        self._check_full(host)
        self._node_changed()

    def _node_changed(self) -> None:
        """A node's spec came, changed or went: what was derived from specs is stale."""
        self.version += 1
        self._domains.clear()
        self._ruled_out.clear()

    def drop_spec(self, name: NodeName) -> None:
        """The Node object is gone: the node takes no pods (its pods stay counted)."""
        host = self.nodes.get(name)
        if host is None or host.spec is None:
            return
        self._index_labels(host, -1)
        host.spec = None
        self.prefer_not.discard(name)
        self.restricted.discard(name)
        self._check_full(host)
        if not host.pods:
            del self.nodes[name]
        self._node_changed()

    def _index_labels(self, host: HostNode, sign: int) -> None:
        if host.spec is None:
            return
        for k, v in host.spec.labels.items():
            by_value = self.label_nodes.setdefault(k, {})
            nodes = by_value.setdefault(v, set())
            if sign > 0:
                nodes.add(host.name)
            else:
                nodes.discard(host.name)
                if not nodes:
                    del by_value[v]
                    if not by_value:
                        del self.label_nodes[k]

    def selected(self, selector: Mapping[str, str]) -> set[NodeName] | None:
        """The nodes carrying every label of a node selector (None: no selector)."""
        found: set[NodeName] | None = None
        for key, value in selector.items():
            nodes = self.label_nodes.get(key, {}).get(value, set())
            found = set(nodes) if found is None else found & nodes
            if not found:
                return set()
        return found

    def set_namespace(self, name: str, labels: Mapping[str, str]) -> None:
        self.namespaces[name] = dict(labels)

    def namespace_labels(self, name: str) -> Mapping[str, str]:
        known = self.namespaces.get(name)
        return known if known is not None else {"kubernetes.io/metadata.name": name}

    # --- pods --------------------------------------------------------------------------

    def add_pod(self, uid: PodUID, node: NodeName, pod: PodSpec) -> bool:
        """A pod on ``node`` (bound, or assumed by a placement). False if known."""
        if uid in self.pods:
            return False
        self.pods[uid] = (node, pod)
        host = self.node(node)
        host._add(pod, 1)
        self._index_pod(uid, node, pod, 1)
        self._check_full(host)
        return True

    def observe(self, pod: PodSpec) -> None:
        """A pod is about to be placed: lower the floors to its requests (nodes that
        could take it are no longer ``full``)."""
        for name in (CPU, MEMORY):
            want = pod.requests.get(name, 0)
            floor = self.floors.get(name)
            if floor is None or want < floor:
                self.floors[name] = want
                for node in list(self.full):
                    self._check_full(self.nodes[node])

    def _check_full(self, host: HostNode) -> None:
        spec = host.spec
        full = False
        if spec is not None and self.floors:
            alloc, used = spec.allocatable, host.requested
            full = host.count >= alloc.get(PODS, 0) or any(
                alloc.get(k, 0) - used.get(k, 0) < floor
                for k, floor in self.floors.items()
                if floor > 0
            )
        if full != host.full:
            host.full = full
            if full:
                self.full.add(host.name)
            else:
                self.full.discard(host.name)
            self.refill.add(host.name)

    def remove_pod(self, uid: PodUID) -> tuple[NodeName, PodSpec] | None:
        held = self.pods.pop(uid, None)
        if held is None:
            return None
        node, pod = held
        host = self.nodes[node]
        host._add(pod, -1)
        self._index_pod(uid, node, pod, -1)
        if not host.count and host.spec is None:
            del self.nodes[node]
        else:
            self._check_full(host)
        return held

    def _index_pod(self, uid: PodUID, node: NodeName, pod: PodSpec, sign: int) -> None:
        host = self.nodes[node]
        keys = [(pod.namespace, k, v) for k, v in pod.labels.items()]
        if sign > 0:
            host.pods[uid] = pod
            for key in keys:
                self.pod_labels.setdefault(key, {})[uid] = node
            self.ns_pods.setdefault(pod.namespace, {})[uid] = node
            if pod.anti_affinity:
                self.anti_pods[uid] = node
            if _affine(pod):
                self.affine_pods[uid] = node
            return
        del host.pods[uid]
        for key in keys:
            holders = self.pod_labels[key]
            del holders[uid]
            if not holders:
                del self.pod_labels[key]
        in_ns = self.ns_pods[pod.namespace]
        del in_ns[uid]
        if not in_ns:
            del self.ns_pods[pod.namespace]
        self.anti_pods.pop(uid, None)
        self.affine_pods.pop(uid, None)

    def matching(self, namespaces: Iterable[str], selector: Selector) -> Iterator[PodUID]:
        """Pods in ``namespaces`` that may match ``selector`` (a superset, from the label
        index when the selector pins a label; every pod of those namespaces else)."""
        if selector.nothing:
            return
        pinned = next((r for r in selector.requirements if r.op == "In"), None)
        for ns in namespaces:
            if pinned is None:
                yield from self.ns_pods.get(ns, ())
                continue
            for value in pinned.values:
                yield from self.pod_labels.get((ns, pinned.key, value), ())

    def term_namespaces(self, term: AffinityTerm) -> Iterable[str]:
        """Every namespace an affinity term may match pods in (for the index walk)."""
        if term.namespace_selector.nothing:
            return term.namespaces
        return self.ns_pods.keys()

    # --- prefilter -------------------------------------------------------------------

    def prepare(self, pod: PodSpec) -> Prepared | Status:
        """kube-scheduler's PreFilter for ``pod``: what its filters need, computed once;
        or the unresolvable status that rejects every node at once."""
        prep = Prepared(self, pod)
        names: set[str] | None = None
        for term in pod.node_affinity or ():
            if not term.pinned:
                names = None
                break
            chosen = set(term.pinned[0])
            for values in term.pinned[1:]:
                chosen &= set(values)
            names = chosen if names is None else names | chosen
        if names is not None:
            if not names:
                return Status(
                    code=Code.UNRESOLVABLE,
                    reasons=(Reason(kind="affinity-conflict", code=UNRESOLVABLE, nodes=0),),
                    nodes=sum(1 for h in self.nodes.values() if h.spec is not None),
                )
            prep.names = names
        if pod.claims is not None and pod.claims.wait is not None:
            return Status(
                code=Code.UNRESOLVABLE,
                reasons=(pod.claims.wait,),
                nodes=sum(1 for h in self.nodes.values() if h.spec is not None),
            )
        prep.spread = tuple(self._spread(pod, c) for c in pod.spread if c.hard)
        self._affinity(prep)
        return prep

    def _domains_of(
        self, pod: PodSpec, c: SpreadConstraint
    ) -> tuple[dict[str, set[NodeName]], dict[NodeName, str]]:
        """Topology domains of ``c.topology_key`` over the nodes ``pod`` counts on: those
        with every hard constraint's key, passing the inclusion policies. Cached per pod
        shape until a node changes."""
        keys = tuple(sorted({x.topology_key for x in pod.spread if x.hard}))
        sig = (
            c.topology_key,
            keys,
            c.honor_affinity and (tuple(sorted(pod.node_selector.items())), pod.node_affinity),
            c.honor_taints and pod.tolerations,
        )
        cached = self._domains.get(sig)
        if cached is not None:
            return cached
        found: dict[str, set[NodeName]] = {}
        values = self.label_nodes.get(c.topology_key, {})
        for value, nodes in values.items():
            for name in nodes:
                labels = self.nodes[name].labels
                if any(k not in labels for k in keys):
                    continue
                if c.honor_affinity and not pod.matches_node(name, labels):
                    continue
                spec = self.nodes[name].spec
                if c.honor_taints and spec is not None and pod.tolerates(spec.taints) is not None:
                    continue
                found.setdefault(value, set()).add(name)
        member = {n: v for v, nodes in found.items() for n in nodes}
        self._domains[sig] = (found, member)
        return found, member

    def _spread(self, pod: PodSpec, c: SpreadConstraint) -> _Spread:
        domains, member = self._domains_of(pod, c)
        counts = dict.fromkeys(domains, 0)
        if not c.selector.everything:
            reqs = c.selector.requirements
            # One pinned label: the index hands exactly its pods, no need to match again.
            exact = len(reqs) == 1 and reqs[0].op == "In" and len(reqs[0].values) == 1
            pods = self.pods
            for uid in self.matching((pod.namespace,), c.selector):
                node, other = pods[uid]
                value = member.get(node)
                if (
                    value is not None
                    and not other.terminating
                    and (exact or c.selector.matches(other.labels))
                ):
                    counts[value] += 1
        low = min(counts.values()) if len(counts) >= c.min_domains else 0
        return _Spread(c, counts, low, 1 if c.selector.matches(pod.labels) else 0)

    def _affinity(self, prep: Prepared) -> None:
        pod = prep.pod
        ns_labels = self.namespace_labels(pod.namespace)
        existing: dict[tuple[str, str], int] = {}
        for uid, node in self.anti_pods.items():
            labels = self.nodes[node].labels
            for t in self.pods[uid][1].anti_affinity:
                if t.topology_key in labels and t.matches(pod.namespace, pod.labels, ns_labels):
                    key = (t.topology_key, labels[t.topology_key])
                    existing[key] = existing.get(key, 0) + 1
        prep.existing_anti = existing
        if not pod.affinity and not pod.anti_affinity:
            return
        affinity = [self._resolve(t) for t in pod.affinity]
        anti = [self._resolve(t) for t in pod.anti_affinity]
        aff: dict[tuple[str, str], int] = {}
        if affinity:
            seen: set[PodUID] = set()
            for t in affinity:
                for uid in self.matching(self.term_namespaces(t), t.selector):
                    if uid in seen:
                        continue
                    seen.add(uid)
                    node, other = self.pods[uid]
                    if all(x.matches(other.namespace, other.labels, None) for x in affinity):
                        labels = self.nodes[node].labels
                        for x in affinity:
                            if x.topology_key in labels:
                                key = (x.topology_key, labels[x.topology_key])
                                aff[key] = aff.get(key, 0) + 1
        against: dict[tuple[str, str], int] = {}
        for t in anti:
            for uid in set(self.matching(self.term_namespaces(t), t.selector)):
                node, other = self.pods[uid]
                labels = self.nodes[node].labels
                if t.topology_key in labels and t.matches(other.namespace, other.labels, None):
                    key = (t.topology_key, labels[t.topology_key])
                    against[key] = against.get(key, 0) + 1
        prep.affinity, prep.anti = affinity, anti
        prep.affinity_counts, prep.anti_counts = aff, against
        prep.self_affine = not aff and all(
            t.matches(pod.namespace, pod.labels, None) for t in affinity
        )

    def _resolve(self, term: AffinityTerm) -> AffinityTerm:
        """The incoming pod's term with its namespace selector resolved to namespaces, as
        kube-scheduler does: the selector still applies, against an empty label set (so
        a selector of only NotIn/DoesNotExist matches pods in every namespace)."""
        sel = term.namespace_selector
        if sel.nothing or sel.everything:
            return term
        names = {n for n, labels in self.namespaces.items() if sel.matches(labels)}
        names |= {
            n
            for n in self.ns_pods
            if n not in self.namespaces and sel.matches(self.namespace_labels(n))
        }
        if not names - set(term.namespaces):
            return term
        return replace(term, namespaces=tuple(sorted({*term.namespaces, *names})))


def _affine(pod: PodSpec) -> bool:
    return bool(
        pod.affinity or pod.anti_affinity or pod.preferred_affinity or pod.preferred_anti_affinity
    )


@dataclass(slots=True)
class _Spread:
    """One hard spread constraint, prepared: matching pods per domain and the minimum."""

    c: SpreadConstraint
    counts: dict[str, int]
    low: int
    own: int


@dataclass(slots=True)
class Prepared:
    """One pod's PreFilter results; :meth:`filter` answers for any node."""

    hosts: Hosts
    pod: PodSpec
    names: set[str] | None = None
    """Only these nodes may take it (``matchFields`` on ``metadata.name``)."""
    spread: tuple[_Spread, ...] = ()
    affinity: list[AffinityTerm] = field(default_factory=list)
    anti: list[AffinityTerm] = field(default_factory=list)
    affinity_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    anti_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    existing_anti: dict[tuple[str, str], int] = field(default_factory=dict)
    self_affine: bool = False
    _taints: dict[tuple[Taint, ...], bool] = field(default_factory=dict)
    _ruled_out: frozenset[NodeName] | None = None

    def soft(self) -> bool:
        """Do scores matter for this pod beyond the device policy's order: soft
        preferences of its own, or nodes that would rather not take it?"""
        pod = self.pod
        return bool(
            pod.preferred_nodes
            or pod.preferred_affinity
            or pod.preferred_anti_affinity
            or any(not c.hard for c in pod.spread)
            or self.hosts.prefer_not
        )

    def filter(self, host: HostNode) -> Status | None:
        """The first filter ``host`` fails, in kube-scheduler's order; None if it fits.
        A node whose Node object is unknown yet takes the pod only on device terms (and
        what its volumes and resource claims allow of a node without labels)."""
        spec = host.spec
        pod = self.pod
        claims = pod.claims
        if spec is None:
            if claims is None:
                return None
            return _volumes(claims, _NO_LABELS) or _devices(claims, host.name, _NO_LABELS)
        static = self._node_only(host.name, spec)
        if static is not None:
            return static
        if pod.ports and _port_conflict(pod.ports, host.ports):
            return NODE_PORTS
        short = _resources(pod, host, spec)
        if short is not None:
            return short
        if claims is not None and (refused := _volumes(claims, spec.labels)) is not None:
            return refused
        for s in self.spread:
            key = s.c.topology_key
            value = spec.labels.get(key)
            if value is None:
                return SPREAD_LABEL
            low = s.low if len(s.counts) >= s.c.min_domains else 0
            if s.counts.get(value, 0) + s.own - low > s.c.max_skew:
                return SPREAD
        refused = self._inter_pod(spec.labels)
        if refused is not None or claims is None:
            return refused
        return _devices(claims, host.name, spec.labels)

    def _node_only(self, name: str, spec: NodeSpec) -> Status | None:
        """The filters that read the Node object alone (not what runs on it), in
        kube-scheduler's order: the node set of ``matchFields``, NodeUnschedulable,
        NodeName, TaintToleration, NodeAffinity."""
        pod = self.pod
        if self.names is not None and name not in self.names:
            return OUTSIDE_NODE_SET
        if spec.unschedulable and not any(t.tolerates(_UNSCHEDULABLE) for t in pod.tolerations):
            return NODE_UNSCHEDULABLE
        if pod.node_name and pod.node_name != name:
            return NODE_NAME
        if spec.taints:
            ok = self._taints.get(spec.taints)
            if ok is None:
                ok = self._taints[spec.taints] = pod.tolerates(spec.taints) is None
            if not ok:
                return TAINTED
        if (pod.node_selector or pod.node_affinity is not None) and not pod.matches_node(
            name, spec.labels
        ):
            return NODE_AFFINITY
        return None

    def ruled_out(self) -> frozenset[NodeName]:
        """The nodes :meth:`_node_only` rules out, whatever they come to hold: a walk of
        the device index skips them instead of fitting each (a pod selecting one pool
        of ten passes nine nodes for each it may take). Kept per pod shape (node name,
        tolerations, selector, required affinity) until a node changes; not computed
        for a pod pinned to named nodes (a DaemonSet's: one shape per node, and the
        walk finds its few nodes quickly by itself), nor while no node taints, cordons
        or is selected."""
        if self._ruled_out is None:  # a pod's walks (both ends of the index) share it
            self._ruled_out = self._find_ruled_out()
        return self._ruled_out

    def _find_ruled_out(self) -> frozenset[NodeName]:
        pod = self.pod
        if self.names is not None or pod.node_name:
            return _NONE_RULED_OUT
        if not (pod.node_selector or pod.node_affinity is not None or self.hosts.restricted):
            return _NONE_RULED_OUT
        hosts = self.hosts
        sig = (
            pod.tolerations,
            tuple(sorted(pod.node_selector.items())),
            pod.node_affinity,
        )
        found = hosts._ruled_out.get(sig)
        if found is None:
            if len(hosts._ruled_out) >= RULED_OUT_SHAPES:
                hosts._ruled_out.clear()
            found = hosts._ruled_out[sig] = frozenset(
                h.name
                for h in hosts.nodes.values()
                if h.spec is not None and self._node_only(h.name, h.spec) is not None
            )
        return found

    def _inter_pod(self, labels: Mapping[str, str]) -> Status | None:
        counts = self.affinity_counts
        exist = True
        for t in self.affinity:
            value = labels.get(t.topology_key)
            if value is None:
                return POD_AFFINITY
            if counts.get((t.topology_key, value), 0) <= 0:
                exist = False
        if not exist and not self.self_affine:
            return POD_AFFINITY
        if self.anti_counts:
            for t in self.anti:
                value = labels.get(t.topology_key)
                if value is not None and self.anti_counts.get((t.topology_key, value), 0) > 0:
                    return POD_ANTI_AFFINITY
        if self.existing_anti:
            for item in labels.items():
                if self.existing_anti.get(item, 0) > 0:
                    return EXISTING_ANTI_AFFINITY
        return None

    # --- scoring ---------------------------------------------------------------------

    def score(self, hosts: list[HostNode], policy: str) -> list[float]:
        """kube-scheduler's weighted scores of the feasible ``hosts`` (0..1500 at most):
        resources (least allocated for spread, most for binpack), balance, untolerated
        PreferNoSchedule taints, preferred node affinity, preferred pod (anti-)affinity
        and ScheduleAnyway spread."""
        pod = self.pod
        total = [_fit_score(pod, h, most=policy == "binpack") + _balance(pod, h) for h in hosts]
        taints = [
            sum(
                1
                for t in (h.spec.taints if h.spec else ())
                if t.effect == "PreferNoSchedule"
                and not any(
                    x.tolerates(t) for x in pod.tolerations if x.effect in ("", "PreferNoSchedule")
                )
            )
            for h in hosts
        ]
        _add_normalised(total, taints, 3, reverse=True)
        if pod.preferred_nodes:
            raw = [
                sum(w.weight for w in pod.preferred_nodes if w.term.matches(h.name, h.labels))
                for h in hosts
            ]
            _add_normalised(total, raw, 2)
        _add_spread_scores(self, hosts, total)
        _add_affinity_scores(self, hosts, total)
        return total


def _volumes(claims: Claims, labels: Mapping[str, str]) -> Status | None:
    """VolumeBinding's filter on the pod's bound volumes (the first volume that exists
    nowhere or whose node affinity the node's labels miss), then VolumeZone's (each
    zone label of its volumes, on a node with any zone or region label)."""
    for volume in claims.volumes:
        if volume.missing:
            return VOLUME_MISSING
        terms = volume.affinity
        if terms is not None and not any(t.matches_labels(labels) for t in terms):
            return VOLUME_NODE
    if claims.zones and any(k in labels for k in ZONE_LABELS):
        for zone in claims.zones:
            value = labels.get(zone.key)
            if value is None:
                value = labels.get(GA_LABELS.get(zone.key, zone.key))
            if value is None or value not in zone.values:
                return VOLUME_ZONE
    return None


def _devices(claims: Claims, name: str, labels: Mapping[str, str]) -> Status | None:
    """DynamicResources' filter: every allocated claim's node selector takes the node."""
    for terms in claims.devices:
        if not any(t.matches(name, labels) for t in terms):
            return CLAIM_NODE
    return None


def _port_conflict(wanted: tuple[HostPort, ...], used: list[HostPort]) -> bool:
    for w in wanted:
        for u in used:
            if u.port != w.port or u.protocol != w.protocol:
                continue
            if w.ip == "0.0.0.0" or u.ip == "0.0.0.0" or u.ip == w.ip:
                return True
    return False


def _resources(pod: PodSpec, host: HostNode, spec: NodeSpec) -> Status | None:
    """NodeResourcesFit: every resource short, in kube's order (pods, cpu, memory,
    storage, then the others); unresolvable when a request exceeds what the node has."""
    alloc = spec.allocatable
    reasons: list[Reason] = []
    unresolvable = False
    if host.count + 1 > alloc.get(PODS, 0):
        reasons.append(TOO_MANY_PODS)
    used = host.requested
    for name, want in pod.requests.items():
        if want <= 0:
            continue
        have = alloc.get(name, 0)
        free = have - used.get(name, 0)
        if want > free:
            big = want > have
            unresolvable = unresolvable or big
            reasons.append(
                Reason(
                    kind="insufficient",
                    code=UNRESOLVABLE if big else UNSCHEDULABLE,
                    resource=name,
                    requested=want,
                    free=free,
                    capacity=have,
                )
            )
    if not reasons:
        return None
    if len(reasons) > 1:
        order = {r: i for i, r in enumerate((PODS, *_BASIC))}
        reasons.sort(key=lambda r: order.get(r.resource or PODS, len(order)))
    return Status(
        code=Code.UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE, reasons=tuple(reasons)
    )


def _fit_score(pod: PodSpec, host: HostNode, *, most: bool) -> float:
    """NodeResourcesFit's score (LeastAllocated, or MostAllocated for binpack), cpu and
    memory weighted 1:1, on the requests scoring counts (defaults for unnamed ones)."""
    spec = host.spec
    if spec is None:
        return 0.0
    parts = []
    for have, used, want in (
        (spec.allocatable.get(CPU, 0), host.nonzero_cpu, pod.score_cpu),
        (spec.allocatable.get(MEMORY, 0), host.nonzero_memory, pod.score_memory),
    ):
        if have <= 0:
            continue
        req = used + want
        if most:
            parts.append(min(req, have) * 100 // have)
        else:
            parts.append(0 if req > have else (have - req) * 100 // have)
    return float(sum(parts) // len(parts)) if parts else 0.0


def _balance(pod: PodSpec, host: HostNode) -> float:
    """NodeResourcesBalancedAllocation (1.36: the change in balance, 50..100)."""
    spec = host.spec
    if spec is None or not (pod.requests.get(CPU) or pod.requests.get(MEMORY)):
        return 0.0
    before, after = [], []
    for name in (CPU, MEMORY):
        have = spec.allocatable.get(name, 0)
        if have <= 0:
            continue
        used = host.requested.get(name, 0)
        before.append(min(used / have, 1.0))
        after.append(min((used + pod.requests.get(name, 0)) / have, 1.0))

    def bal(fr: list[float]) -> int:
        std = abs(fr[0] - fr[1]) / 2 if len(fr) == 2 else 0.0
        return int((1 - std) * 100)

    return float(50 + (50 + bal(after) - bal(before)) // 2)


def _add_normalised(
    total: list[float], raw: list[int], weight: int, *, reverse: bool = False
) -> None:
    top = max(raw, default=0)
    for i, r in enumerate(raw):
        if top <= 0:
            score = 100 if reverse else 0
        else:
            score = 100 * r // top
            score = 100 - score if reverse else score
        total[i] += weight * score


def _add_spread_scores(prep: Prepared, hosts: list[HostNode], total: list[float]) -> None:
    """PodTopologySpread's ScheduleAnyway constraints: fewer matching pods in a node's
    domain score higher (kube's weighting by the log of the domain count)."""
    soft = [c for c in prep.pod.spread if not c.hard]
    if not soft:
        return
    pod = prep.pod
    raw: list[float] = []
    keys = {c.topology_key for c in soft}
    # domains counted over the feasible nodes carrying every key (the node count for
    # the hostname key), as kube weighs them: bench/parity.py's scored cases
    scored = [h.labels for h in hosts if all(k in h.labels for k in keys)]
    sizes = {k: len(scored) if k == HOSTNAME else len({x[k] for x in scored}) for k in keys}
    for h in hosts:
        labels = h.labels
        if any(k not in labels for k in keys):
            raw.append(-1.0)
            continue
        score = 0.0
        for c in soft:
            counted = prep.hosts._spread(pod, c)
            weight = math.log((sizes[c.topology_key] or 1) + 2)
            score += counted.counts.get(labels[c.topology_key], 0) * weight + (c.max_skew - 1)
        raw.append(float(round(score)))
    valid = [r for r in raw if r >= 0]
    low = min(valid, default=0.0)
    high = max([*valid, 0.0])
    for i, r in enumerate(raw):
        if r < 0:
            continue
        total[i] += 2 * (100 if high == 0 else 100 * (high + low - r) // high)


def _add_affinity_scores(prep: Prepared, hosts: list[HostNode], total: list[float]) -> None:
    """InterPodAffinity's preferred terms (the pod's own, and existing pods' towards it)."""
    pod = prep.pod
    own = [(w.weight, w.term) for w in pod.preferred_affinity] + [
        (-w.weight, w.term) for w in pod.preferred_anti_affinity
    ]
    index = prep.hosts
    if not own and not index.affine_pods:
        return
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
        return
    raw = [sum(by_domain.get(item, 0.0) for item in h.labels.items()) for h in hosts]
    low, high = min(raw), max(raw)
    for i, r in enumerate(raw):
        total[i] += 2 * (int(100 * (r - low) / (high - low)) if high > low else 0)
