"""What node filters read of a pod and of a node, parsed once from the API objects.

A :class:`PodSpec` holds the parts of a pod kube-scheduler's filters and scores read:
its effective resource request, host ports, node selector and affinity, tolerations,
pod (anti-)affinity terms and topology spread constraints, labels and namespace. A
:class:`NodeSpec` holds a node's labels, taints, allocatable resources and cordon. The
watcher parses them (:func:`pod_spec`, :func:`node_spec`) and they travel on the bus;
shared/core/nodefit.py applies them. The rules are kube-scheduler's (the pinned
release of tools/go.mod); where the API server would have defaulted or merged
something before the scheduler saw it, the parser does the same, so a pod read from
any source means what it means to kube-scheduler.

Device resources Tessera manages (every configured name) are left out of the request:
the device families place them; the rest (cpu, memory, ephemeral-storage, hugepages-*,
other extended resources) is fitted against the node's allocatable.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Literal

import msgspec

from shared.core.quantity import parse_nano
from shared.core.status import Reason

CPU, MEMORY, EPHEMERAL, PODS = "cpu", "memory", "ephemeral-storage", "pods"
DEFAULT_MILLI_CPU = 100
"""What scoring assumes a container without a cpu request uses (kube-scheduler's)."""
DEFAULT_MEMORY = 200 * 1024 * 1024
"""What scoring assumes a container without a memory request uses (kube-scheduler's)."""
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
ZONE_LABELS = (
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    ZONE,
    REGION,
)
"""The node and volume labels VolumeZone compares, in its order."""
GA_LABELS = {ZONE_LABELS[0]: ZONE, ZONE_LABELS[1]: REGION}
"""The GA twin of each beta zone label (a node may carry either)."""
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


class Requirement(msgspec.Struct, frozen=True, array_like=True):
    """One ``key op values`` requirement of a label or node selector."""

    key: str
    op: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """kube's ``Requirement.Matches``: ``Gt``/``Lt`` compare base-10 int64 values, and a value
        that is not one never matches."""
        value = labels.get(self.key)
        op = self.op
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None:
            return False
        have = go_int64(value)  # Gt / Lt: both sides base-10 int64 (the bound checked at parse)
        bound = go_int64(self.values[0]) if len(self.values) == 1 else None
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound


_INT64 = re.compile(r"[+-]?[0-9]+")


def go_int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: digits with an optional sign, in range; None
    otherwise (Python's int() also takes spaces, underscores and any size, and raises on
    more than 4300 digits: past 19 significant ones a value is out of int64 anyway)."""
    if not _INT64.fullmatch(text):
        return None
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 19:
        return None
    value = int(digits or "0")
    if text.startswith("-"):
        value = -value
    return value if -(2**63) <= value < 2**63 else None


class Selector(msgspec.Struct, frozen=True, omit_defaults=True):
    """A label selector: every requirement must hold. ``nothing`` is a nil selector
    (it matches no pod); no requirements at all match everything."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether every requirement holds for ``labels``; a nil selector matches nothing."""
        if self.nothing:
            return False
        return all(r.matches(labels) for r in self.requirements)

    @property
    def everything(self) -> bool:
        """An empty, non-nil selector: it matches every set of labels."""
        return not self.nothing and not self.requirements


NOTHING = Selector(nothing=True)
EVERYTHING = Selector()


class NodeTerm(msgspec.Struct, frozen=True, omit_defaults=True):
    """One ``nodeSelectorTerm``: label requirements AND ``metadata.name`` requirements.
    ``invalid`` terms (an operator with the wrong values) never match, as upstream."""

    labels: tuple[Requirement, ...] = ()
    names: tuple[Requirement, ...] = ()
    invalid: bool = False
    pinned: tuple[tuple[str, ...], ...] = ()
    """The values of each ``metadata.name In`` field, as written: kube-scheduler's
    PreFilter narrows the nodes to them (see shared/core/nodefit.py)."""

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether the node (its name and labels) meets every requirement; an invalid term never
        matches."""
        if self.invalid:
            return False
        field = {"metadata.name": name}
        return all(r.matches(labels) for r in self.labels) and all(
            r.matches(field) for r in self.names
        )

    def matches_labels(self, labels: Mapping[str, str]) -> bool:
        """The term on a node known by its labels alone, as a PersistentVolume's node
        affinity is checked: kube's node selector then leaves ``metadata.name`` fields
        unchecked (a node without a name has no fields)."""
        return not self.invalid and all(r.matches(labels) for r in self.labels)


class WeightedNodeTerm(msgspec.Struct, frozen=True, array_like=True):
    """A preferred node affinity term and its weight, summed by NodeAffinity's score."""

    weight: int
    term: NodeTerm


class Toleration(msgspec.Struct, frozen=True, omit_defaults=True):
    """One toleration of a pod, as written (an empty key with ``Exists`` tolerates every taint)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """kube's ``ToleratesTaint`` (comparison operators are off by default: never)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


class Taint(msgspec.Struct, frozen=True, array_like=True):
    """One taint of a node: a pod that does not tolerate it is kept off by ``NoSchedule`` and
    ``NoExecute``, and scored lower by ``PreferNoSchedule``."""

    key: str
    value: str
    effect: str


class AffinityTerm(msgspec.Struct, frozen=True, omit_defaults=True):
    """A pod (anti-)affinity term: pods matched by ``selector`` in ``namespaces`` (or in
    namespaces matched by ``namespace_selector``), counted per ``topology_key`` domain."""

    topology_key: str
    selector: Selector = NOTHING
    namespaces: tuple[str, ...] = ()
    namespace_selector: Selector = NOTHING

    def matches(
        self, namespace: str, labels: Mapping[str, str], ns_labels: Mapping[str, str] | None
    ) -> bool:
        """kube's ``AffinityTerm.Matches`` for a pod in ``namespace`` whose namespace's
        labels are ``ns_labels`` (an empty set when unknown)."""
        in_ns = namespace in self.namespaces or self.namespace_selector.matches(ns_labels or {})
        return in_ns and self.selector.matches(labels)


class WeightedAffinityTerm(msgspec.Struct, frozen=True, array_like=True):
    """A preferred pod (anti-)affinity term and its weight, summed by InterPodAffinity's score."""

    weight: int
    term: AffinityTerm


class SpreadConstraint(msgspec.Struct, frozen=True, omit_defaults=True):
    """A topology spread constraint, with the API server's and the scheduler's defaults
    applied (``matchLabelKeys`` merged into the selector)."""

    max_skew: int
    topology_key: str
    hard: bool
    """DoNotSchedule (filters) rather than ScheduleAnyway (scores)."""
    selector: Selector = NOTHING
    min_domains: int = 1
    honor_affinity: bool = True
    """``nodeAffinityPolicy: Honor`` (the default): only nodes matching the pod's node
    selector and affinity form domains and hold counted pods."""
    honor_taints: bool = False
    """``nodeTaintsPolicy: Honor``: likewise for nodes whose taints the pod tolerates."""


class HostPort(msgspec.Struct, frozen=True, array_like=True):
    """A host port a container asks (NodePorts' filter): ``0.0.0.0`` when it names no host IP, TCP
    when it names no protocol."""

    ip: str
    protocol: str
    port: int


class VolumeZone(msgspec.Struct, frozen=True, array_like=True):
    """A zone or region label of a bound PersistentVolume: the node's label ``key`` (or
    its GA twin, for a beta key) must hold one of ``values`` (VolumeZone's filter)."""

    key: str
    values: tuple[str, ...]


class BoundVolume(msgspec.Struct, frozen=True, omit_defaults=True):
    """The PersistentVolume of one bound claim of a pod, as VolumeBinding's filter reads
    it: its required node affinity, or that it does not exist."""

    affinity: tuple[NodeTerm, ...] | None = None
    """One of these terms must match the node's labels; None: any node."""
    missing: bool = False


class DraClaim(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ResourceClaim of the pod that is not allocated yet: Tessera's allocator
    allocates it (services/device_allocator/dra.py) and its binder writes the allocation
    (services/binder/claims.py)."""

    namespace: str
    name: str
    uid: str
    devices: dict[str, Any] = msgspec.field(default_factory=dict)
    """Its ``spec.devices`` as the API server holds it (read by shared/core/dra/read.py)."""
    allocation: dict[str, Any] | None = None
    """Its ``status.allocation``, for a claim allocated (by anyone) but not reserved for
    the pod yet: the binder adds the pod to ``reservedFor`` (``Claims.reserve``)."""
    mappings: tuple[tuple[str, str, str], ...] = ()
    """For the claim of the pod's extended resources (``Claims.extended``): each
    (container, resource name, request name); the binder creates the claim (its name
    and UID empty until then) and writes them in ``status.extendedResourceClaimStatus``."""


class Claims(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where the objects a pod claims let it run: its PersistentVolumeClaims' volumes and
    its DRA ResourceClaims' allocations. shared/core/claims.py makes it from the API
    objects (the watcher holds them); shared/core/nodefit.py applies it."""

    wait: Reason | None = None
    """Why no node may take the pod now, whatever the node (a PreFilter's verdict: an
    unbound claim, one not found...); None when the nodes decide."""
    volumes: tuple[BoundVolume, ...] = ()
    """Each bound PersistentVolumeClaim's volume, in the pod's order (VolumeBinding)."""
    zones: tuple[VolumeZone, ...] = ()
    """The bound volumes' zone and region labels (VolumeZone)."""
    devices: tuple[tuple[NodeTerm, ...], ...] = ()
    """Each allocated ResourceClaim's node selector: one of its terms must match the
    node (DynamicResources); a claim allocated for every node adds none."""
    allocate: tuple[DraClaim, ...] = ()
    """The pod's ResourceClaims not allocated yet, in the pod's order: the allocator
    allocates them on the node it chooses (DynamicResources' place)."""
    reserve: tuple[DraClaim, ...] = ()
    """The pod's ResourceClaims allocated but not reserved for it: the binder reserves
    them for the pod before its Binding, as DynamicResources' PreBind does."""
    classes: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    """The DeviceClasses those claims name, as API objects, by name (one that does not
    exist is absent: the pod is refused with its name)."""
    extended: DraClaim | None = None
    """The claim the pod's extended resources become on a node that serves them through
    DRA (shared/core/dra/extended.py); None when no DeviceClass maps them."""
    mapped: tuple[str, ...] = ()
    """The resource names ``extended`` serves."""
    counts: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    """What each of its ResourceClaims counts in its queue, by claim UID, per DeviceClass
    (shared/core/claimed.py): asked, for one not allocated; held, for one allocated (by
    anyone, reserved for the pod or not)."""


class PodSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What kube-scheduler's filters and scores read of one pod (see the module doc)."""

    namespace: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    requests: dict[str, int] = msgspec.field(default_factory=dict)
    """The effective request, without Tessera's device names: cpu in millicores, memory
    and storage in bytes, extended resources in their units. A name present with 0 is
    kept (it checks nothing)."""
    nonzero_cpu: int = DEFAULT_MILLI_CPU
    nonzero_memory: int = DEFAULT_MEMORY
    """cpu and memory as scoring counts them (a container naming neither gets defaults)."""
    score_cpu: int = DEFAULT_MILLI_CPU
    score_memory: int = DEFAULT_MEMORY
    """The same, as NodeResourcesFit's score counts the pod to place: its containers'
    requests, pod-level ones ignored (kube-scheduler v1.36.3; bench/parity.py's scored
    cases), where the node's sum counts them."""
    ports: tuple[HostPort, ...] = ()
    node_name: str = ""
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)
    node_affinity: tuple[NodeTerm, ...] | None = None
    """Required node affinity's terms (any one must match); None when there is none."""
    preferred_nodes: tuple[WeightedNodeTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    affinity: tuple[AffinityTerm, ...] = ()
    anti_affinity: tuple[AffinityTerm, ...] = ()
    preferred_affinity: tuple[WeightedAffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[WeightedAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    terminating: bool = False
    """Being deleted: counts for resources, ports and affinity, not for spread."""
    claims: Claims | None = None
    """What its volumes and resource claims allow (the watcher adds it to a pending pod
    that has any); None: none, or not read (a pod on a node)."""
    images: tuple[str, ...] = ()
    """The images its init containers, containers and image volumes run, one per use,
    each with ``:latest`` when it names no tag (ImageLocality)."""
    containers: int = 0
    """How many init and app containers it has (ImageLocality's ceiling grows with it)."""

    def matches_node(self, name: str, labels: Mapping[str, str]) -> bool:
        """The node selector and required node affinity (NodeAffinity's filter)."""
        for key, value in self.node_selector.items():
            if labels.get(key) != value:
                return False
        terms = self.node_affinity
        return terms is None or any(t.matches(name, labels) for t in terms)

    def tolerates(self, taints: Iterable[Taint]) -> Taint | None:
        """The first NoSchedule/NoExecute taint no toleration tolerates, or None."""
        for taint in taints:
            if taint.effect in ("NoSchedule", "NoExecute") and not any(
                t.tolerates(taint) for t in self.tolerations
            ):
                return taint
        return None


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What kube-scheduler's filters and scores read of one node."""

    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: dict[str, int] = msgspec.field(default_factory=dict)
    """cpu in millicores, memory and storage in bytes, ``pods``, scalar resources."""
    unschedulable: bool = False
    images: dict[str, int] = msgspec.field(default_factory=dict)
    """The images the node holds (``status.images``): each name in bytes."""


# --- parsing ------------------------------------------------------------------------------


def _amount(name: str, nano: int) -> int:
    """A summed quantity in the unit kube-scheduler counts: cpu in millicores, the rest
    whole, both rounded up after summing (as ``MilliValue`` and ``Value`` do)."""
    return -(-nano // 10**6) if name == CPU else -(-nano // 10**9)


def is_scalar(name: str) -> bool:
    """Resources NodeResourcesFit checks beyond cpu, memory and storage (kube's
    ``IsScalarResourceName``): extended resources, hugepages, ``kubernetes.io/`` names."""
    if name.startswith(("hugepages-", "attachable-volumes-")) or "kubernetes.io/" in name:
        return True
    return "/" in name


def _counted(name: str, managed: Collection[str]) -> bool:
    return name not in managed and (name in (CPU, MEMORY, EPHEMERAL) or is_scalar(name))


def _quantities(raw: Mapping[str, Any] | None) -> dict[str, int]:
    """Quantities in billionths (see quantity.parse_nano)."""
    out: dict[str, int] = {}
    for name, value in (raw or {}).items():
        try:
            out[str(name)] = parse_nano(value)
        except ValueError:
            continue  # the API server never stores one; a hand-made object is skipped
    return out


def _container_requests(c: Mapping[str, Any]) -> dict[str, int]:
    """A container's requests, defaulted from its limits as the API server does."""
    resources = c.get("resources") or {}
    out = _quantities(resources.get("limits"))
    out.update(_quantities(resources.get("requests")))
    return out


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, 0) + v


def _max(total: dict[str, int], more: Mapping[str, int]) -> None:
    for k, v in more.items():
        if k not in total or v > total[k]:
            total[k] = v


_NONZERO = {CPU: DEFAULT_MILLI_CPU * 10**6, MEMORY: DEFAULT_MEMORY * 10**9}


def pod_requests(
    spec: Mapping[str, Any], *, nonzero: bool = False, pod_level: bool = True
) -> dict[str, int]:
    """kube's ``PodRequests``, in billionths: app containers summed, init containers as
    the largest step (restartable "sidecar" ones run beside everything after them),
    pod-level requests overriding (unless not ``pod_level``), overhead added.
    ``nonzero``: containers naming no cpu or memory count the scoring defaults instead."""

    def req(c: Mapping[str, Any]) -> dict[str, int]:
        r = _container_requests(c)
        if nonzero:
            for k, v in _NONZERO.items():
                r.setdefault(k, v)
        return r

    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        _add(total, req(c))
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c in spec.get("initContainers") or ():
        r = req(c)
        if c.get("restartPolicy") == "Always":
            _add(total, r)
            _add(sidecars, r)
            step = dict(sidecars)
        else:
            step = dict(r)
            _add(step, sidecars)
        _max(init_max, step)
    _max(total, init_max)
    resources = spec.get("resources") or {}
    pod_wide = _quantities(resources.get("limits"))  # requests default to limits
    pod_wide.update(_quantities(resources.get("requests")))
    for k, v in pod_wide.items():
        if (k in (CPU, MEMORY) and pod_level) or k.startswith("hugepages-"):
            total[k] = v
    _add(total, _quantities(spec.get("overhead")))
    return total


def _selector(raw: Mapping[str, Any] | None) -> Selector:
    """A ``metav1.LabelSelector``: nil matches nothing, ``{}`` everything."""
    if raw is None:
        return NOTHING
    reqs = [Requirement(str(k), "In", (str(v),)) for k, v in (raw.get("matchLabels") or {}).items()]
    for e in raw.get("matchExpressions") or ():
        op = e.get("operator")
        values = tuple(str(v) for v in e.get("values") or ())
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return NOTHING
        if (op in ("In", "NotIn")) != bool(values):
            return NOTHING  # the API server refuses these; never match one
        reqs.append(Requirement(str(e.get("key", "")), op, values))
    return Selector(tuple(reqs))


def label_selector(raw: Mapping[str, Any] | None) -> Selector:
    """A ``metav1.LabelSelector`` of another object (a PodDisruptionBudget's), read as a
    pod's affinity terms read theirs: nil matches nothing, ``{}`` everything."""
    return _selector(raw)


def _node_requirement(e: Mapping[str, Any]) -> Requirement | None:
    """A node selector requirement, or None when it cannot be parsed (its term then
    never matches, as upstream)."""
    op = e.get("operator")
    values = tuple(str(v) for v in e.get("values") or ())
    key = str(e.get("key", ""))
    if op in ("In", "NotIn"):
        return Requirement(key, op, values) if values else None
    if op in ("Exists", "DoesNotExist"):
        return None if values else Requirement(key, op)
    if op in ("Gt", "Lt"):
        if len(values) != 1 or go_int64(values[0]) is None:
            return None
        return Requirement(key, op, values)
    return None


def _node_term(raw: Mapping[str, Any]) -> NodeTerm:
    """A ``nodeSelectorTerm``; an empty one never matches (upstream drops it)."""
    exprs = raw.get("matchExpressions") or ()
    fields = raw.get("matchFields") or ()
    pinned = tuple(
        tuple(str(v) for v in f.get("values") or ())
        for f in fields
        if f.get("key") == "metadata.name" and f.get("operator") == "In"
    )
    if not exprs and not fields:
        return NodeTerm(invalid=True)
    labels = [_node_requirement(e) for e in exprs]
    names: list[Requirement | None] = []
    for f in fields:
        r = _node_requirement(f)
        ok = (
            r is not None
            and f.get("key") == "metadata.name"
            and r.op in ("In", "NotIn")
            and len(r.values) == 1
        )
        names.append(r if ok else None)
    if any(r is None for r in (*labels, *names)):
        return NodeTerm(invalid=True, pinned=pinned)
    return NodeTerm(
        labels=tuple(r for r in labels if r is not None),
        names=tuple(r for r in names if r is not None),
        pinned=pinned,
    )


def node_terms(selector: Mapping[str, Any] | None) -> tuple[NodeTerm, ...]:
    """The terms of a ``v1.NodeSelector`` (a pod's required node affinity, a
    PersistentVolume's, a ResourceClaim allocation's): one must match."""
    return tuple(_node_term(t) for t in (selector or {}).get("nodeSelectorTerms") or ())


def _merge_keys(
    selector: Selector, labels: Mapping[str, str], keys: Iterable[str], op: str
) -> Selector:
    """The API server's merge of ``matchLabelKeys`` (op In) or ``mismatchLabelKeys``
    (op NotIn) into a selector, for keys the pod itself carries."""
    if selector.nothing:
        return selector
    extra = [Requirement(k, op, (labels[k],)) for k in keys if k in labels]  # type: ignore[arg-type]
    return Selector((*selector.requirements, *extra)) if extra else selector


def _affinity_term(
    raw: Mapping[str, Any], namespace: str, labels: Mapping[str, str]
) -> AffinityTerm:
    selector = _selector(raw.get("labelSelector"))
    selector = _merge_keys(selector, labels, raw.get("matchLabelKeys") or (), "In")
    selector = _merge_keys(selector, labels, raw.get("mismatchLabelKeys") or (), "NotIn")
    namespaces = tuple(str(n) for n in raw.get("namespaces") or ())
    ns_raw = raw.get("namespaceSelector")
    if not namespaces and ns_raw is None:
        namespaces = (namespace,)
    return AffinityTerm(
        topology_key=str(raw.get("topologyKey", "")),
        selector=selector,
        namespaces=namespaces,
        namespace_selector=_selector(ns_raw),
    )


def _affinity_terms(
    section: Mapping[str, Any], namespace: str, labels: Mapping[str, str]
) -> tuple[tuple[AffinityTerm, ...], tuple[WeightedAffinityTerm, ...]]:
    required = tuple(
        _affinity_term(t, namespace, labels)
        for t in section.get("requiredDuringSchedulingIgnoredDuringExecution") or ()
    )
    preferred = tuple(
        WeightedAffinityTerm(
            int(w.get("weight") or 0),
            _affinity_term(w.get("podAffinityTerm") or {}, namespace, labels),
        )
        for w in section.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    )
    return required, preferred


def _spread(raw: Mapping[str, Any], labels: Mapping[str, str]) -> SpreadConstraint:
    selector = _merge_keys(
        _selector(raw.get("labelSelector")), labels, raw.get("matchLabelKeys") or (), "In"
    )
    return SpreadConstraint(
        max_skew=int(raw.get("maxSkew") or 1),
        topology_key=str(raw.get("topologyKey", "")),
        hard=raw.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule",
        selector=selector,
        min_domains=int(raw.get("minDomains") or 1),
        honor_affinity=raw.get("nodeAffinityPolicy", "Honor") != "Ignore",
        honor_taints=raw.get("nodeTaintsPolicy", "Ignore") == "Honor",
    )


def _ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """Host ports of app containers and restartable init containers."""
    containers = [
        *(spec.get("containers") or ()),
        *(c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"),
    ]
    host_network = bool(spec.get("hostNetwork"))
    out = []
    for c in containers:
        for p in c.get("ports") or ():
            port = int(p.get("hostPort") or 0)
            if host_network and not port:
                port = int(p.get("containerPort") or 0)  # defaulted by the API server
            if port > 0:
                out.append(
                    HostPort(
                        str(p.get("hostIP") or "0.0.0.0"), str(p.get("protocol") or "TCP"), port
                    )
                )
    return tuple(out)


def pod_spec(obj: Mapping[str, Any], managed: Collection[str] = ()) -> PodSpec:
    """The :class:`PodSpec` of a pod object; ``managed`` are Tessera's device names."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    namespace = str(meta.get("namespace") or "default")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    requests = {k: _amount(k, v) for k, v in pod_requests(spec).items() if _counted(k, managed)}
    nonzero = pod_requests(spec, nonzero=True)
    scored = pod_requests(spec, nonzero=True, pod_level=False) if spec.get("resources") else nonzero
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[NodeTerm, ...] | None = None
    if required is not None:
        terms = node_terms(required)
    preferred = []
    for w in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ():
        preference = w.get("preference") or {}
        weight = int(w.get("weight") or 0)
        if weight and (preference.get("matchExpressions") or preference.get("matchFields")):
            preferred.append(WeightedNodeTerm(weight, _node_term(preference)))
    aff, pref_aff = _affinity_terms(affinity.get("podAffinity") or {}, namespace, labels)
    anti, pref_anti = _affinity_terms(affinity.get("podAntiAffinity") or {}, namespace, labels)
    return PodSpec(
        namespace=namespace,
        labels=labels,
        requests=requests,
        nonzero_cpu=_amount(CPU, nonzero.get(CPU, 0)),
        nonzero_memory=_amount(MEMORY, nonzero.get(MEMORY, 0)),
        score_cpu=_amount(CPU, scored.get(CPU, 0)),
        score_memory=_amount(MEMORY, scored.get(MEMORY, 0)),
        ports=_ports(spec),
        node_name=str(spec.get("nodeName") or ""),
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        node_affinity=terms,
        preferred_nodes=tuple(preferred),
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in spec.get("tolerations") or ()
        ),
        affinity=aff,
        anti_affinity=anti,
        preferred_affinity=pref_aff,
        preferred_anti_affinity=pref_anti,
        spread=tuple(_spread(c, labels) for c in spec.get("topologySpreadConstraints") or ()),
        terminating=bool(meta.get("deletionTimestamp")),
        images=_images(spec),
        containers=len(spec.get("initContainers") or ()) + len(spec.get("containers") or ()),
    )


def image_name(name: str) -> str:
    """An image reference as nodes list it: ``:latest`` added when it names no tag."""
    return name if name.rfind(":") > name.rfind("/") else f"{name}:latest"


def _images(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The pod's images in kube-scheduler's order: init containers, containers, then
    image volumes (``volumes[].image.reference``)."""
    found = [
        image_name(str(c.get("image") or ""))
        for key in ("initContainers", "containers")
        for c in spec.get(key) or ()
    ]
    for v in spec.get("volumes") or ():
        image = v.get("image")
        if isinstance(image, Mapping):
            found.append(image_name(str(image.get("reference") or "")))
    return tuple(found)


def node_spec(obj: Mapping[str, Any]) -> NodeSpec:
    """The :class:`NodeSpec` of a node object (allocatable defaults to capacity)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    raw = status.get("allocatable") or status.get("capacity") or {}
    allocatable = {
        k: _amount(k, v)
        for k, v in _quantities(raw).items()
        if k in (CPU, MEMORY, EPHEMERAL, PODS) or is_scalar(k)
    }
    return NodeSpec(
        name=str(meta.get("name", "")),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in spec.get("taints") or ()
        ),
        allocatable=allocatable,
        unschedulable=bool(spec.get("unschedulable")),
        images={
            str(name): int(image.get("sizeBytes") or 0)
            for image in status.get("images") or ()
            for name in image.get("names") or ()
        },
    )
