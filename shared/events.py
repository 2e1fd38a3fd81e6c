"""Every event the services exchange, with its NATS subject: the public contract.

Each event is a frozen, tagged msgspec Struct; the wire format is JSON so any client can
read it, and ``tessera schema`` publishes the JSON Schema (docs/events.schema.json).
An event's subject is ``tessera.v1.<its tag>``, followed for events keyed by namespace or
node (``KEY``) by that key as one more token, so a consumer can filter on it;
``tessera.v1.allocation.>`` is the API external tools subscribe to, one event per
message; events of a ``BATCHED`` type may travel several to a message (a JSON array with
the header ``Tessera-Batch``: shared/bus.py, docs/architecture.md).

Evolution: a new field gets a default; no field is renamed or retyped; a breaking change
is a new event type on a ``v2`` subject. Unknown fields are ignored when decoding, so an
old service reads a newer event.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Self, get_args

import msgspec

from shared.core.disruption import Budget
from shared.core.hosts import NodeSpec, PodSpec
from shared.core.model import (
    ContainerGrant,
    DeviceInfo,
    GangKey,
    Movable,
    NodeName,
    NonNegInt,
    PodRef,
    PodRequest,
    PodUID,
    PosInt,
    RequestError,
    VictimUnit,
)
from shared.core.network import HyperNode, NetworkTopology
from shared.core.status import Status
from shared.core.subgroups import SubGroupPolicy, SubGroups

SUBJECT_PREFIX = "tessera.v1"
STREAM_SUBJECTS = f"{SUBJECT_PREFIX}.>"


_UNSAFE = re.compile(r"[.*>%\s]")
"""What a subject token may not hold as it is (see ``subject_token``)."""


def subject_token(value: str) -> str:
    """Make ``value`` safe as one NATS subject token.

    Node names may hold dots (DNS subdomains), which NATS reads as token separators;
    ``*``, ``>`` and whitespace are wildcards or invalid. Percent-encode those (and
    ``%`` itself) so the mapping is reversible and a subscriber can filter by key.
    """
    if not _UNSAFE.search(value):  # the usual name: nothing to encode
        return value or "%00"
    return _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", value)


def _key(path: str) -> Callable[[Any], str]:
    """The subject key of an event: the value at ``path`` (``pod.namespace``, ``node``)."""
    first, _, rest = path.partition(".")
    if rest:
        return lambda e: str(getattr(getattr(e, first), rest))
    return lambda e: str(getattr(e, first))


def _now() -> float:
    return time.time()


def new_id() -> str:
    """A fresh event id (a re-announcement needs one, or de-duplication drops it)."""
    return uuid.uuid4().hex


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """Base of every event: a unique id and the wall-clock time it was emitted."""

    SUBJECT: ClassVar[str] = ""
    """``tessera.v1.<tag>`` (set for every event type below the definitions)."""
    KEY: ClassVar[Callable[[Any], str | tuple[str, ...]] | None] = None
    """The subject's last token for events keyed per namespace or node (a subscriber
    filters on it): ``SUBJECT.<token>``, or several (pods: ``SUBJECT.<namespace>.<owner>``);
    None for events on ``SUBJECT`` itself."""
    KEY_TOKENS: ClassVar[int] = 1
    """How many tokens ``KEY`` gives."""
    BATCHED: ClassVar[bool] = False
    """Several of these on one subject, published together, may travel as one message
    (a JSON array of the events, header ``Tessera-Batch``; shared/bus.py): only events
    no external tool reads (never ``allocation.*``), which come in bursts."""
    event_id: str = msgspec.field(default_factory=new_id)
    emitted_at: float = msgspec.field(default_factory=_now)

    def subject(self) -> str:
        """The subject this event is published on."""
        key = type(self).KEY
        if key is None:
            return self.SUBJECT
        value = key(self)
        if isinstance(value, tuple):
            return ".".join((self.SUBJECT, *map(subject_token, value)))
        return f"{self.SUBJECT}.{subject_token(value)}"

    @classmethod
    def filter_subject(cls, key: str | None = None) -> str:
        """What a consumer of this event filters on: every key, or only ``key``."""
        if cls.KEY is None:
            return cls.SUBJECT
        if key is None:
            return f"{cls.SUBJECT}.>"
        return f"{cls.SUBJECT}.{subject_token(key)}" + ".*" * (cls.KEY_TOKENS - 1)

    DEDUP: ClassVar[tuple[str, ...]] = ()
    """The fields (dotted paths) that identify a repeat of this event, e.g. the pod and
    the attempt of a decision; none: every event is new (its ``event_id``)."""

    def dedup_id(self) -> str:
        """JetStream de-duplication id (``Nats-Msg-Id``): a retried publish is stored once."""
        if not self.DEDUP:
            return self.event_id
        parts = [self.__struct_config__.tag]
        for path in self.DEDUP:
            value: Any = self
            for name in path.split("."):
                value = getattr(value, name)
            parts.append(str(value))
        return ":".join(str(p) for p in parts)


def changed(old: Event | None, new: Event) -> bool:
    """Did anything but the event's identity and time change? (A re-announcement of an
    unchanged object is news only to a consumer that does not know it yet.)"""
    if old is None:
        return True
    same = msgspec.structs.replace(old, event_id=new.event_id, emitted_at=new.emitted_at)
    return same != new


class GangRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A PodGroup (``scheduling.k8s.io/group-name``); a lone pod is a gang of one."""

    namespace: str
    name: str
    queue: str = "default"
    lone: bool = False
    """A lone pod (``name`` is the pod's): no PodGroup."""

    @property
    def key(self) -> GangKey:
        """The gang's key in the coordinator's and the allocator's tables."""
        return GangKey(namespace=self.namespace, name=self.name, lone=self.lone)


# --- pods ---------------------------------------------------------------------------


class PodPending(Event, frozen=True, kw_only=True, tag="pod.pending"):
    """A pod of one of our schedulers waits for placement; its request is parsed and valid."""

    BATCHED = True

    KEY = _key("pod.namespace")
    pod: PodRef
    request: PodRequest
    scheduler_name: str
    group: str | None = None
    """PodGroup name from ``scheduling.k8s.io/group-name``, or None for a lone pod."""
    task: str | None = None
    """The pod's task role in its Volcano Job (``volcano.sh/task-spec``), for minTaskMember."""
    priority: int = 0
    created_at: float = 0.0
    resource_version: str = ""
    spec: PodSpec | None = None
    """What node filters read of the pod (requests, selectors, affinity, tolerations,
    ports, spread); None from a watcher older than node fit (devices only then)."""
    preemption_policy: str = ""
    """``spec.preemptionPolicy`` (``Never``: it evicts no one; usually set from its
    PriorityClass)."""
    owner: str = ""
    """Its controller ``ownerReference`` as ``Kind/name`` ("" for a bare pod): only a pod
    that a controller recreates is ever moved, and a recreated pod takes the place
    reserved for the one it replaces (shared/core/consolidation.py)."""
    preemptable: bool = False
    """Marked ``volcano.sh/preemptable: "true"`` (label or annotation): consolidation may
    move it."""


VOLCANO_JOB = "vcjob"
"""The owner token of a pod event whose pod a Volcano Job controls (``NO_OWNER``
otherwise): the job-controller reads only those (``SUBJECT.*.vcjob``), not every pod's."""
NO_OWNER = "-"


def _pod_key(event: PodUpdated | PodDeleted) -> tuple[str, str]:
    return (event.pod.namespace, VOLCANO_JOB if event.job else NO_OWNER)


class PodUpdated(Event, frozen=True, kw_only=True, tag="pod.updated"):
    """A pod is on a node (any scheduler's: its requests and labels count there), or a
    pod on a node changed (labels, deletion started, grant annotations seen)."""

    BATCHED = True

    KEY = _pod_key
    KEY_TOKENS = 2
    pod: PodRef
    node: NodeName | None = None
    phase: str = "Pending"
    grants: tuple[ContainerGrant, ...] = ()
    resource_version: str = ""
    spec: PodSpec | None = None
    scheduler_name: str = ""
    signature: str = ""
    """The grant's ``tessera.io/grant-signature``: a grant without a valid one is not
    Tessera's and holds no device (shared/core/annotations.py)."""
    job: str = ""
    """The Volcano Job that controls the pod (its controller ``ownerReference``), if any."""
    started_at: float = 0.0
    """When it was scheduled (its ``PodScheduled`` condition's ``lastTransitionTime``,
    Unix seconds); 0: not known. Preemption protection counts from here."""
    cooldown_s: float = 0.0
    """Volcano's ``volcano.sh/cooldown-time`` (label, else annotation): no preemption or
    reclaim takes it before ``started_at`` plus this."""


class PodDeleted(Event, frozen=True, kw_only=True, tag="pod.deleted"):
    """A pod is gone (or finished): whatever it held can be released."""

    BATCHED = True

    KEY = _pod_key
    KEY_TOKENS = 2
    pod: PodRef
    node: NodeName | None = None
    grants: tuple[ContainerGrant, ...] = ()
    phase: str = ""
    """``Succeeded`` or ``Failed`` when the pod finished rather than was deleted."""
    job: str = ""
    """The Volcano Job that controlled the pod, if any."""


class PodRejected(Event, frozen=True, kw_only=True, tag="pod.rejected"):
    """A pod's request is invalid as written; no retry helps until the pod changes."""

    KEY = _key("pod.namespace")
    pod: PodRef
    errors: tuple[RequestError, ...]


# --- nodes --------------------------------------------------------------------------


class NodeInventory(Event, frozen=True, kw_only=True, tag="node.inventory"):
    """A node agent's full device inventory (also kept in the inventory KV bucket)."""

    KEY = _key("node")
    node: NodeName
    devices: tuple[DeviceInfo, ...]
    config_hash: str
    """Hash of the config the agent runs with; the allocator refuses a mismatch."""
    agent: str = ""
    """Agent identity (host and version) for diagnostics."""
    seq: NonNegInt = 0
    """Increases with every report of one agent; stale reports are ignored."""
    device_plugin: bool = False
    """The agent serves the kubelet's device-plugin API: a pod bound here is "admitting"
    until the agent reports ``allocation.admitted`` (see shared/core/admission.py)."""
    dra: bool = False
    """The node offers its devices through DRA (``deviceApi: dra``): ResourceClaims get
    them, not extended resources, so Tessera's allocator places no grant here
    (services/device_allocator/nodes.py) until it allocates claims itself."""


class NodeUpdated(Event, frozen=True, kw_only=True, tag="node.updated"):
    """What the Node object says: its labels, taints, allocatable and cordon (``spec``)
    and its devices cordoned or unhealthy (``hami.io/device-cordon``,
    ``volcano.sh/gpu-unhealthy-ids``)."""

    KEY = _key("node")
    node: NodeName
    cordoned_devices: tuple[str, ...] = ()
    unschedulable: bool = False
    spec: NodeSpec | None = None


DraKind = Literal["slice", "claim"]


class DraObject(Event, frozen=True, kw_only=True, tag="dra.object"):
    """A DRA object the allocator reads (services/device_allocator/dra.py), as the watcher
    saw it: a ResourceSlice (``slice``, by name) or a ResourceClaim's allocation
    (``claim``, by ``namespace/name``: only ``metadata`` and ``status.allocation``).
    ``obj`` None: deleted, or a claim no longer allocated."""

    kind: DraKind
    key: str
    obj: dict[str, Any] | None = None


class NamespaceUpdated(Event, frozen=True, kw_only=True, tag="namespace.updated"):
    """A namespace's labels (pod affinity terms may select namespaces by label)."""

    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class NodeDeleted(Event, frozen=True, kw_only=True, tag="node.deleted"):
    """A Node object was deleted: nothing more may be placed on it."""

    KEY = _key("node")
    node: NodeName


# --- Volcano batch objects -----------------------------------------------------------


class PodGroupUpdated(Event, frozen=True, kw_only=True, tag="podgroup.updated"):
    """A Volcano PodGroup as the watcher read it: who belongs together and how many."""

    KEY = _key("namespace")
    namespace: str
    name: str
    uid: str = ""
    min_member: PosInt = 1
    min_task_member: dict[str, NonNegInt] = msgspec.field(default_factory=dict)
    queue: str = "default"
    priority_class: str = ""
    min_resources: dict[str, str] = msgspec.field(default_factory=dict)
    sub_group_policy: tuple[SubGroupPolicy, ...] = ()
    """``spec.subGroupPolicy``: gangs of gangs (shared/core/subgroups.py)."""
    invalid: str = ""
    """Why ``spec.subGroupPolicy`` or ``spec.networkTopology`` breaks a rule (the fields
    named): its pods wait, told this; "" when it is valid."""
    network_topology: NetworkTopology | None = None
    """``spec.networkTopology`` (or its annotations): its gang inside one HyperNode
    (shared/core/network.py); None: anywhere."""


class HyperNodeUpdated(Event, frozen=True, kw_only=True, tag="hypernode.updated"):
    """A Volcano HyperNode (``topology.volcano.sh/v1alpha1``) as the watcher read it: one
    network domain of the fabric (shared/core/network.py)."""

    hypernode: HyperNode
    invalid: str = ""
    """Why its spec breaks a rule (the fields named; what could be read is kept)."""


class HyperNodeDeleted(Event, frozen=True, kw_only=True, tag="hypernode.deleted"):
    """A HyperNode is gone: its domain with it."""

    name: str


class PodGroupDeleted(Event, frozen=True, kw_only=True, tag="podgroup.deleted"):
    """A PodGroup is gone: its pods wait as if it were never created."""

    KEY = _key("namespace")
    namespace: str
    name: str


class PdbUpdated(Event, frozen=True, kw_only=True, tag="pdb.updated"):
    """A PodDisruptionBudget as preemption reads it: which pods it covers and the
    disruptions it allows now (the watcher's reading, shared/core/disruption.py)."""

    KEY = _key("budget.namespace")
    budget: Budget


class PdbDeleted(Event, frozen=True, kw_only=True, tag="pdb.deleted"):
    """A PodDisruptionBudget is gone: the pods it covered may be preempted freely."""

    KEY = _key("namespace")
    namespace: str
    name: str


class QueueUpdated(Event, frozen=True, kw_only=True, tag="queue.updated"):
    """A Volcano Queue: weight, capability, guarantee, reclaimable, priority, state, and
    for the ``capacity`` plugin its parent and deserved share."""

    name: str
    weight: NonNegInt = 1
    capability: dict[str, str] = msgspec.field(default_factory=dict)
    guarantee: dict[str, str] = msgspec.field(default_factory=dict)
    reclaimable: bool = True
    priority: int = 0
    state: str = "Open"
    parent: str = ""
    """``spec.parent``: empty for a child of the root queue."""
    deserved: dict[str, str] = msgspec.field(default_factory=dict)
    uid: str = ""
    """Its ``metadata.uid`` (an Event about the Queue names it)."""
    preempt_min_runtime_s: float | None = None
    """``spec.preemptMinRuntime`` (KAI's): its pods run at least this long before a pod
    of their own queue preempts them; None: not written (an ancestor's, else the
    config's)."""
    reclaim_min_runtime_s: float | None = None
    """``spec.reclaimMinRuntime`` (KAI's): the same before another queue reclaims them."""


class QueueDeleted(Event, frozen=True, kw_only=True, tag="queue.deleted"):
    """A Queue is gone: gangs naming it wait and are told why."""

    name: str


class JobUpdated(Event, frozen=True, kw_only=True, tag="job.updated"):
    """A Volcano Job (``batch.volcano.sh/v1alpha1``); ``spec`` is the object's spec as is."""

    KEY = _key("namespace")
    namespace: str
    name: str
    uid: str
    spec: dict[str, Any] = msgspec.field(default_factory=dict)


class JobDeleted(Event, frozen=True, kw_only=True, tag="job.deleted"):
    """A Volcano Job is gone: its controller deletes its pods, PodGroup and Service."""

    KEY = _key("namespace")
    namespace: str
    name: str
    uid: str = ""


# --- gangs --------------------------------------------------------------------------


class SpanPart(msgspec.Struct, frozen=True, kw_only=True):
    """The pods of a gang one allocator shard holds for it, uncommitted."""

    shard: str
    pods: tuple[PodRef, ...]


UNSHARDED = "all"
"""The subject key of a gang for the one allocator of an unsharded cluster."""


class GangReady(Event, frozen=True, kw_only=True, tag="gang.ready"):
    """A gang has at least ``min_member`` pending pods: place them all or none.

    Published on ``gang.ready.<shard>`` (``all`` unsharded); with allocator shards
    (shared/core/shards.py) a shard that cannot place it passes it on along ``route``.
    """

    BATCHED = True

    KEY = lambda e: e.shard or UNSHARDED  # noqa: E731 (a class attribute)
    gang: GangRef
    min_member: NonNegInt
    members: tuple[PodPending, ...]
    attempt: int = 1
    victims: tuple[VictimUnit, ...] = ()
    """If the gang does not fit: what may be preempted for it, cheapest first (those
    that would break a PodDisruptionBudget last)."""
    budgets: dict[str, int] = msgspec.field(default_factory=dict)
    """What each PodDisruptionBudget (``namespace/name``) ``victims`` count against
    allows now."""
    hold: bool = False
    """The gang has waited past ``scheduler.starvationGuardS``: if it does not fit, hold
    the nodes it would fit on once their pods finish, so smaller gangs stop taking them."""
    protected_s: float = 0.0
    """Pods that would have been offered in ``victims`` have not run their minimum
    runtime yet: the first may be evicted in this many seconds (0: none held back)."""
    subgroups: SubGroups | None = None
    """Its PodGroup's subgroups among ``members``: each placed whole or not at all, and
    how many of each policy are required (None: no ``subGroupPolicy``, a plain gang)."""
    network_topology: NetworkTopology | None = None
    """Its PodGroup's ``networkTopology``: placed inside one HyperNode
    (shared/core/network.py); None: anywhere."""
    movable: tuple[Movable, ...] = ()
    """If the gang does not fit: the shared-GPU pods that may be moved to other nodes to
    make room (``scheduler.consolidation``; shared/core/consolidation.py)."""

    shard: str = ""
    """The allocator shard it is offered to ("": the one allocator, unsharded)."""
    route: tuple[str, ...] = ()
    """The shards to offer it to next, in order, if this one cannot place it."""
    offered: tuple[str, ...] = ()
    """Every shard it is offered to, in order (the second pass goes through them)."""
    tried: Status | None = None
    """What the shards it was offered to before said (shared/core/status.py
    ``combined``): the last one tells the pods what every shard found."""
    spanning: tuple[SpanPart, ...] | None = None
    """Set in the second pass, when no shard could place the gang whole: what earlier
    shards hold of it (``members`` are the pods still to place)."""

    def dedup_id(self) -> str:
        """The gang, its attempt and a digest of its members, then the shard it is passed to and the
        parts earlier shards hold: one message per part and per shard, a redelivery the same."""
        # A group may be sent in parts (a queue's share admits some members now): the
        # members are part of the identity, or JetStream would drop the second part.
        # A copy passed on to a shard is another message than the one it came from;
        # passed on again (a redelivery), it is the same.
        members = hashlib.sha1(",".join(sorted(m.pod.uid for m in self.members)).encode())
        ident = f"{self.gang.namespace}/{self.gang.name}:{self.attempt}:{members.hexdigest()[:12]}"
        if self.shard:
            ident += f":{self.shard}"
        if self.spanning is not None:
            ident += ":span:" + ",".join(f"{p.shard}={len(p.pods)}" for p in self.spanning)
        return ident


class GangSpan(Event, frozen=True, kw_only=True, tag="gang.span"):
    """A gang placed across allocator shards is committed (each shard holding a part
    reserves it and publishes its decisions) or aborted (each releases its part)."""

    DEDUP = ("gang.namespace", "gang.name", "attempt")
    gang: GangRef
    attempt: int
    commit: bool
    parts: tuple[SpanPart, ...]


# --- allocations (the public API) ----------------------------------------------------


class ClaimAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """A ResourceClaim the allocator allocated for a pod: the binder writes
    ``allocation`` as its ``status.allocation``, with the pod in ``status.reservedFor``,
    before the Binding (services/binder/claims.py)."""

    namespace: str
    name: str
    uid: str
    allocation: dict[str, Any]
    reserve_only: bool = False
    """Allocated before (by anyone): only the pod is added to ``reservedFor``, and a
    failed Binding leaves the allocation as it was."""
    mappings: tuple[tuple[str, str, str], ...] = ()
    """The claim of the pod's extended resources (docs/dra.md), its name and UID empty:
    the binder creates it with ``devices`` as its ``spec.devices`` and writes these
    (container, resource name, request name) in the pod's
    ``status.extendedResourceClaimStatus``; a failed Binding deletes it."""
    devices: dict[str, Any] = msgspec.field(default_factory=dict)


class AllocationDecided(Event, frozen=True, kw_only=True, tag="allocation.decided"):
    """The allocator placed one pod and reserved its devices; the binder writes it."""

    DEDUP = ("pod.uid", "attempt")
    pod: PodRef
    node: NodeName
    grants: tuple[ContainerGrant, ...]
    gang: GangRef | None = None
    attempt: int = 1
    created_at: float = 0.0
    """The pod's creation (its PodPending's): the binder measures creation to bind."""
    claims: tuple[ClaimAllocation, ...] = ()
    """The pod's ResourceClaims Tessera allocated: written before the Binding."""


class ReasonCount(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How many nodes rejected a placement for one reason, as kube-scheduler counts them."""

    reason: str
    nodes: NonNegInt


class Refusal(Event, frozen=True, kw_only=True):
    """Pods not placed now, and why: ``status`` (code, reasons with resource, requested,
    free, capacity and node counts); ``message``, ``reasons`` and ``unresolvable`` are its
    rendering, kept for readers of the first version. The binder tells each pod."""

    pods: tuple[PodRef, ...]
    message: str
    reasons: tuple[ReasonCount, ...] = ()
    gang: GangRef | None = None
    attempt: int = 1
    unresolvable: bool = False
    """True when no change of the cluster's load can help (only a new node or pod spec)."""
    status: Status | None = None

    @classmethod
    def of(
        cls,
        pods: tuple[PodRef, ...],
        status: Status,
        *,
        gang: GangRef | None = None,
        attempt: int = 1,
    ) -> Self:
        """The event for ``status``, with its rendered fields filled in."""
        return cls(
            pods=pods,
            message=status.message(),
            reasons=tuple(ReasonCount(reason=r.text(), nodes=r.nodes) for r in status.reasons),
            gang=gang,
            attempt=attempt,
            unresolvable=status.unresolvable,
            status=status,
        )

    def dedup_id(self) -> str:
        """Its tag, first pod, attempt and a digest of its message: a repeat is stored once, a new
        message to the same pods is not dropped."""
        first = self.pods[0].uid if self.pods else ""
        said = hashlib.blake2b(self.message.encode(), digest_size=6).hexdigest()
        return f"{self.__struct_config__.tag}:{first}:{self.attempt}:{said}"


class AllocationFailed(Refusal, frozen=True, kw_only=True, tag="allocation.failed"):
    """The allocator found no placement for these pods (published by it alone)."""

    nominated: dict[PodUID, NodeName] = msgspec.field(default_factory=dict)
    """kube-scheduler's ``status.nominatedNodeName`` for these pods, which the binder
    writes: where each goes once the victims of its preemption are gone, or "" to clear
    what was written before (no room is made for it any more). A pod not named keeps
    what it has."""


class PodWaiting(Refusal, frozen=True, kw_only=True, tag="pod.waiting"):
    """The coordinator holds these pods back before placement: their queue is closed or
    over its share, their PodGroup is missing or has too few members (published by it
    alone; ``allocation.failed`` is the allocator's)."""


class AllocationPreempting(Event, frozen=True, kw_only=True, tag="allocation.preempting"):
    """Pods to evict so that ``gang`` fits; the binder evicts them and the allocator keeps
    what they free for the gang."""

    DEDUP = ("gang.namespace", "gang.name", "attempt")
    gang: GangRef
    preemptor: tuple[PodRef, ...]
    victims: tuple[VictimUnit, ...]
    nodes: tuple[NodeName, ...]
    """Where the gang will go once the victims are gone."""
    attempt: int = 1
    moves: dict[PodUID, NodeName] = msgspec.field(default_factory=dict)
    """Victims that are moved, not evicted for good (consolidation): the node where a
    place is reserved for each one's recreated self."""
    reserved_s: float = 0.0
    """How long those places wait for the recreated pods."""


class AllocationBound(Event, frozen=True, kw_only=True, tag="allocation.bound"):
    """The Binding with the grant annotations was written: the grant is durable."""

    DEDUP = ("pod.uid", "attempt")
    KEY = _key("node")
    pod: PodRef
    node: NodeName
    grants: tuple[ContainerGrant, ...]
    attempt: int = 1


BindCause = Literal["transient", "refused", "gated", "gone", "taken"]
"""Why a Binding failed, as the binder read the API server's answer and the pod
(services/binder/service.py), and so what the gang-coordinator does next:
``transient``, the API server out of reach or overloaded through the binder's retries
(placed again at once); ``refused``, any other refusal (placed again after the pod's
backoff, which freed capacity does not cut short); ``gated``, the pod has scheduling gates
(not placed until the watcher announces it again, ungated); ``gone``, deleted, being
deleted or replaced by a namesake (never placed again); ``taken``, already bound to
another node (the watcher's ``PodUpdated`` settles it)."""


class AllocationBindFailed(Event, frozen=True, kw_only=True, tag="allocation.bind-failed"):
    """The Binding write failed for good; the reservation must be released."""

    DEDUP = ("pod.uid", "attempt")
    pod: PodRef
    node: NodeName
    error: str
    """What the API server answered, or why the write was not made."""
    attempt: int = 1
    cause: BindCause = "transient"
    """Why, as the binder read it (:data:`BindCause`); an older binder's event reads
    ``transient``, placed again at once as it always was."""


class AllocationAdmitted(Event, frozen=True, kw_only=True, tag="allocation.admitted"):
    """The node's kubelet took the pod's devices (every ``Allocate`` for it was answered
    with its own grant); another pod of its admission key may now bind to the node."""

    KEY = _key("node")
    DEDUP = ("pod.uid", "node")
    pod: PodRef
    node: NodeName


class AllocationReleased(Event, frozen=True, kw_only=True, tag="allocation.released"):
    """A pod's grant was returned to the ledger (pod deleted, finished, or bind failed)."""

    DEDUP = ("pod.uid", "node")
    KEY = _key("node")
    pod: PodRef
    node: NodeName
    reason: str


AnyEvent = (
    PodPending
    | PodUpdated
    | PodDeleted
    | PodRejected
    | NodeInventory
    | NodeUpdated
    | NodeDeleted
    | NamespaceUpdated
    | DraObject
    | PodGroupUpdated
    | PodGroupDeleted
    | HyperNodeUpdated
    | HyperNodeDeleted
    | PdbUpdated
    | PdbDeleted
    | QueueUpdated
    | QueueDeleted
    | JobUpdated
    | JobDeleted
    | GangReady
    | GangSpan
    | AllocationDecided
    | AllocationFailed
    | PodWaiting
    | AllocationBound
    | AllocationPreempting
    | AllocationBindFailed
    | AllocationReleased
    | AllocationAdmitted
)
"""The tagged union of every event; decoding yields the concrete type."""

EVENT_TYPES: tuple[type[Event], ...] = get_args(AnyEvent)
"""Every event type, in the order of the union."""

for _type in EVENT_TYPES:  # one rule: an event's subject is the prefix and its tag
    _type.SUBJECT = f"{SUBJECT_PREFIX}.{_type.__struct_config__.tag}"

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    """JSON bytes of one event, tag included; ``msgspec.EncodeError`` when it cannot be
    (values nested too deep: a Job's spec is carried as is)."""
    try:
        return _encoder.encode(event)
    except RecursionError:
        raise msgspec.EncodeError(
            f"{type(event).__name__} cannot be encoded: values nested too deep"
        ) from None


def decode(data: bytes) -> AnyEvent:
    """Decode any event from its JSON; raises ``msgspec.DecodeError`` (or its subclass
    ``msgspec.ValidationError``), with the reason, on any bad input: what shared/bus.py
    drops. Strings that are not UTF-8 and values nested too deep for the decoder are
    among them."""
    try:
        return _decoder.decode(data)
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"not an event: a string is not UTF-8 ({exc.reason})") from None
    except RecursionError:
        raise msgspec.DecodeError("not an event: values nested too deep") from None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of every event, for subscribers that generate types."""
    schemas, components = msgspec.json.schema_components(EVENT_TYPES, ref_template="#/$defs/{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Tessera events (tessera.v1)",
        "description": (
            "Every event Tessera publishes on NATS. The 'type' field names the event; "
            "subjects: " + ", ".join(sorted({t.SUBJECT for t in EVENT_TYPES}))
        ),
        "oneOf": schemas,
        "$defs": components,
    }


# --- control (core NATS request/reply, outside the stream) ---------------------------

CONTROL_PING_SUBJECT = "tessera.ctl.ping"
"""Every running service answers a request here with its :class:`ServiceHello`."""

CONTROL_RESYNC_SUBJECT = "tessera.ctl.resync"
"""A request here makes the watcher re-announce every pending pod (a coordinator that
restarted asks, so it learns the pods it lost)."""


class ServiceHello(msgspec.Struct, frozen=True, kw_only=True):
    """A live service's answer to a ping: who it is and which config it runs."""

    service: str
    instance: str
    config_hash: str
    started_at: float
    version: str = ""
