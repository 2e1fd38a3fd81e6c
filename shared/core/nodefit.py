"""Node fit: kube-scheduler's filters and scores, for every pod, on every node.

:class:`Hosts` is the host side of the allocator's cache: each node's spec (labels,
taints, allocatable, cordon) and every pod on it, of any scheduler, with running totals
and the indexes the filters need so that none of them scans every node or pod per
placement: nodes by label, pods by (namespace, label), pods with required
anti-affinity, per-constraint topology domains and, per pod shape, the nodes its
Node-only filters rule out (both cached until a node changes).

:meth:`Hosts.prepare` runs the PreFilter of each filter plugin of the profile
(shared/core/framework.py; the plugins are in shared/core/plugins/) once per pod; the
:class:`Prepared` it returns is the pod's cycle state and runs the Filters that did not
skip the pod on any node, in the profile's order, answering the first failure's
:class:`~shared.core.status.Status`, with the same reasons (text and resolvability) as
the pinned release and the deciding plugin's name. By default these are
kube-scheduler's, in its order:

    NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts,
    NodeResourcesFit, VolumeRestrictions, VolumeBinding, VolumeZone, PodTopologySpread,
    InterPodAffinity, DynamicResources

(VolumeRestrictions, VolumeBinding, VolumeZone and DynamicResources on the pod's bound volumes and
allocated resource claims, as shared/core/claims.py read them: ``PodSpec.claims``, whose
``wait`` is their PreFilter verdict). ``Prepared.score`` weighs a window of feasible
nodes by the profile's scores. The differential test (bench/parity.py) compares this
node by node with kube-scheduler itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.core.framework import Check, Profile
from shared.core.hosts import (
    CPU,
    MEMORY,
    PODS,
    AffinityTerm,
    HostPort,
    NodeSpec,
    PodSpec,
    Selector,
    Taint,
)
from shared.core.model import NodeName, PodUID
from shared.core.plugins.node_affinity import OUTSIDE_NODE_SET
from shared.core.plugins.pod_topology_spread import Spread
from shared.core.status import Status

if TYPE_CHECKING:
    from shared.core.plugins.dynamic_resources import Claimed, PodClaims

Reserve = Callable[["Prepared", PodUID, NodeName], Callable[[], None] | None]
"""A plugin's ``reserve``, bound: the pod placed on the node; its Unreserve, or None."""

_NONE_RULED_OUT: frozenset[NodeName] = frozenset()
RULED_OUT_SHAPES = 256
"""Pod shapes whose ruled-out nodes ``Hosts`` keeps at once (then it starts again)."""
"""kube-scheduler's default filters and scores (shared/core/framework.py)."""


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
        """The node's labels; none while its Node object is unknown."""
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
        self.cordoned: set[NodeName] = set()
        self.tainted: set[NodeName] = set()
        """Nodes cordoned, and nodes with a NoSchedule or NoExecute taint: some pods may
        not go there whatever they ask (NodeUnschedulable and TaintToleration have
        nothing to check while there are none)."""
        self.floors: dict[str, int] = {}
        """The smallest cpu and memory any pod placed so far asked for: a node with less
        free than that is ``full`` (what keeps a walk of the device index from passing
        the same exhausted nodes for every pod). Only ever lowered."""
        self.full: set[NodeName] = set()
        self.refill: set[NodeName] = set()
        """Nodes whose fullness changed since the ledger last re-filed their devices."""
        self.images: dict[str, tuple[int, int]] = {}
        """Image name → (its size, how many nodes hold it): the size the first node to
        list it gave (kube-scheduler's image states)."""
        self.known = 0
        """Nodes whose Node object is known."""
        self.profile = Profile.default()
        """The filters and scores every pod meets (the allocator sets the config's)."""
        self.dra: Claimed | None = None
        """DRA as the allocator sees it, and what the attempt's placed pods took
        (shared/core/plugins/dynamic_resources.py); None: claims to allocate are not
        checked."""
        self.domains: dict[
            tuple[object, ...], tuple[dict[str, set[NodeName]], dict[NodeName, str]]
        ] = {}
        """PodTopologySpread's domains per pod shape, until a node changes."""
        self._ruled_out: dict[tuple[object, ...], frozenset[NodeName]] = {}
        """Per pod shape: the nodes its Node-only filters rule out (``Prepared.ruled_out``),
        until a node changes."""

    # --- nodes -------------------------------------------------------------------------

    def node(self, name: NodeName) -> HostNode:
        """The node's entry, made empty (no spec, no pods) on first mention."""
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
        self._index_images(host, -1)
        if host.spec is None:
            self.known += 1
        host.spec = spec
        self._index_labels(host, 1)
        self._index_images(host, 1)
        if any(t.effect == "PreferNoSchedule" for t in spec.taints):
            self.prefer_not.add(name)
        else:
            self.prefer_not.discard(name)
        for marked, on in (
            (self.cordoned, spec.unschedulable),
            (self.tainted, any(t.effect != "PreferNoSchedule" for t in spec.taints)),
        ):
            if on:
                marked.add(name)
            else:
                marked.discard(name)
        self._check_full(host)
        self._node_changed()

    def _node_changed(self) -> None:
        """A node's spec came, changed or went: what was derived from specs is stale."""
        self.version += 1
        self.domains.clear()
        self._ruled_out.clear()

    def drop_spec(self, name: NodeName) -> None:
        """The Node object is gone: the node takes no pods (its pods stay counted)."""
        host = self.nodes.get(name)
        if host is None or host.spec is None:
            return
        self._index_labels(host, -1)
        self._index_images(host, -1)
        self.known -= 1
        host.spec = None
        self.prefer_not.discard(name)
        self.cordoned.discard(name)
        self.tainted.discard(name)
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

    def _index_images(self, host: HostNode, sign: int) -> None:
        if host.spec is None:
            return
        images = self.images
        for name, size in host.spec.images.items():
            held = images.get(name)
            if sign > 0:
                images[name] = (size, 1) if held is None else (held[0], held[1] + 1)
            elif held is not None:
                if held[1] > 1:
                    images[name] = (held[0], held[1] - 1)
                else:
                    del images[name]

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
        """A namespace's labels (namespace selectors of affinity terms read them)."""
        self.namespaces[name] = dict(labels)

    def namespace_labels(self, name: str) -> Mapping[str, str]:
        """A namespace's labels; one not seen yet carries only ``kubernetes.io/metadata.name``, as
        the API server labels every namespace."""
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
        """Take a pod off its node (deleted, or a placement undone): its requests and ports are
        freed; returns where it was and what it asked, None if unknown."""
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
        """kube-scheduler's PreFilter for ``pod``: each filter of the profile prepares
        what it reads, once, and says whether it has anything to check; or the
        unresolvable status that rejects every node at once."""
        prep = Prepared(self, pod)
        checks = prep.checks
        for reads, pre, check in self.profile.steps:
            if reads and not getattr(pod, reads):
                continue
            if pre is not None:
                answer = pre(self, prep)
                if answer is not True:
                    if answer is False:
                        continue
                    return answer
            checks.append(check)
        return prep


def _affine(pod: PodSpec) -> bool:
    return bool(
        pod.affinity or pod.anti_affinity or pod.preferred_affinity or pod.preferred_anti_affinity
    )


@dataclass(slots=True)
class Prepared:
    """One pod's cycle state: what the PreFilters computed, and the filters that have
    something to check for it; :meth:`filter` answers for any node."""

    hosts: Hosts
    pod: PodSpec
    checks: list[Check] = field(default_factory=list)
    """The ``filter`` of each of the profile's filters that does not skip this pod, in
    order (bound: the per-node loop calls them)."""
    names: set[str] | None = None
    """Only these nodes may take it (NodeAffinity: ``matchFields`` on
    ``metadata.name``)."""
    spread: tuple[Spread, ...] = ()
    """PodTopologySpread: the hard constraints, counted."""
    affinity: Sequence[AffinityTerm] = ()
    """InterPodAffinity: the required terms (namespaces resolved) and their counts per
    (topology key, value); ``existing_anti``: other pods' anti-affinity against it
    (the terms replaced whole by its PreFilter, never changed in place: the empty
    default is shared)."""
    anti: Sequence[AffinityTerm] = ()
    affinity_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    anti_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    existing_anti: dict[tuple[str, str], int] = field(default_factory=dict)
    self_affine: bool = False
    tolerated: dict[tuple[Taint, ...], bool] | None = None
    """TaintToleration: per distinct set of node taints, whether the pod tolerates it."""
    dra: PodClaims | None = None
    """DynamicResources: the claims to allocate, prepared, and what each node offered."""
    reserves: tuple[Reserve, ...] = ()
    """Reserve (kube-scheduler's point): what plugins hold for the pod once it is placed
    on a node, each answering the Unreserve that gives it back (the placement records it
    in its statement: shared/core/placement.py)."""
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
        """The first filter ``host`` fails, in the profile's order; None if it fits. A
        node whose Node object is unknown yet takes the pod only on device terms (and
        what its volumes and resource claims allow of a node without labels)."""
        if host.spec is None:
            return self._some(host, labels_only=True)
        if self.names is not None and host.name not in self.names:
            return OUTSIDE_NODE_SET
        for check in self.checks:
            refused = check(self, host)
            if refused is not None:
                return refused
        return None

    def _some(self, host: HostNode, *, labels_only: bool) -> Status | None:
        """The first refusal of the filters that answer on labels alone (a node whose
        Node object is unknown yet), or of those that read the Node object alone
        (``ruled_out``, never asked for a pod pinned to named nodes)."""
        for plugin in self.hosts.profile.filters:
            if (plugin.labels_only if labels_only else plugin.node_only) and (
                plugin.filter in self.checks
            ):
                refused = plugin.filter(self, host)
                if refused is not None:
                    return refused
        return None

    def ruled_out(self) -> frozenset[NodeName]:
        """The nodes the filters that read the Node object alone rule out, whatever they
        come to hold (:meth:`_some`): a walk of the device index skips them instead of
        fitting each (a pod selecting one pool of ten passes nine nodes for each it may
        take). Kept per pod shape (node name, tolerations, selector, required affinity)
        until a node changes; not computed for a pod pinned to named nodes (a
        DaemonSet's: one shape per node, and the walk finds its few nodes quickly by
        itself), nor while no node taints, cordons or is selected."""
        if self._ruled_out is None:  # a pod's walks (both ends of the index) share it
            self._ruled_out = self._find_ruled_out()
        return self._ruled_out

    def _find_ruled_out(self) -> frozenset[NodeName]:
        pod = self.pod
        if self.names is not None or pod.node_name:
            return _NONE_RULED_OUT
        hosts = self.hosts
        restricted = hosts.cordoned or hosts.tainted
        if not (pod.node_selector or pod.node_affinity is not None or restricted):
            return _NONE_RULED_OUT
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
                if h.spec is not None and self._some(h, labels_only=False) is not None
            )
        return found

    # --- scoring ---------------------------------------------------------------------

    def score(self, hosts: list[HostNode], policy: str) -> list[float]:
        """The profile's weighted scores of the feasible ``hosts``: each score plugin's
        0 to 100 per node times its weight, summed in the profile's order."""
        total = [0.0] * len(hosts)
        for plugin, weight in self.hosts.profile.scores:
            scores = plugin.score(self, hosts, policy)
            if scores is None:
                continue
            for i, score in enumerate(scores):
                total[i] += weight * score
        return total
