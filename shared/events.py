"""Every event the five services exchange, with its NATS subject: the public contract.

Each event is a frozen, tagged msgspec Struct; the wire format is JSON so any client can
read it, and ``tessera schema`` publishes the JSON Schema (docs/events.schema.json).
Subjects are ``tessera.v1.<area>.<verb>[.<key>]``; ``tessera.v1.allocation.*`` is the
API external tools subscribe to.

Evolution: a new field gets a default; no field is renamed or retyped; a breaking change
is a new event type on a ``v2`` subject. Unknown fields are ignored when decoding, so an
old service reads a newer event.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any, ClassVar

import msgspec

from shared.core.model import (
    ContainerGrant,
    DeviceInfo,
    NodeName,
    PodRef,
    PodRequest,
    RequestError,
)

SUBJECT_PREFIX = "tessera.v1"
STREAM_SUBJECTS = f"{SUBJECT_PREFIX}.>"


def subject_token(value: str) -> str:
    """Make ``value`` safe as one NATS subject token.

    Node names may hold dots (DNS subdomains), which NATS reads as token separators;
    ``*``, ``>`` and whitespace are wildcards or invalid. Percent-encode those (and
    ``%`` itself) so the mapping is reversible and a subscriber can filter by key.
    """
    out = []
    for ch in value:
        if ch in ".*>%" or ch.isspace():
            out.append(f"%{ord(ch):02X}")
        else:
            out.append(ch)
    return "".join(out) or "%00"


def _now() -> float:
    return time.time()


def new_id() -> str:
    """A fresh event id (a re-announcement needs one, or de-duplication drops it)."""
    return uuid.uuid4().hex


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """Base of every event: a unique id and the wall-clock time it was emitted."""

    SUBJECT: ClassVar[str] = ""
    event_id: str = msgspec.field(default_factory=new_id)
    emitted_at: float = msgspec.field(default_factory=_now)

    def subject(self) -> str:
        """The subject this event is published on."""
        return self.SUBJECT

    def dedup_id(self) -> str:
        """JetStream de-duplication id (``Nats-Msg-Id``): a retried publish is stored once."""
        return self.event_id


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


class ReasonCount(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How many nodes rejected a placement for one reason, as kube-scheduler counts them."""

    reason: str
    nodes: int


# --- pods ---------------------------------------------------------------------------


class PodPending(Event, frozen=True, kw_only=True, tag="pod.pending"):
    """A pod of one of our schedulers waits for placement; its request is parsed and valid."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.pod.pending"
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

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.pod.namespace)}"


class PodUpdated(Event, frozen=True, kw_only=True, tag="pod.updated"):
    """A pod we placed changed (bound, phase moved, grant annotations seen)."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.pod.updated"
    pod: PodRef
    node: NodeName | None = None
    phase: str = "Pending"
    grants: tuple[ContainerGrant, ...] = ()
    resource_version: str = ""

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.pod.namespace)}"


class PodDeleted(Event, frozen=True, kw_only=True, tag="pod.deleted"):
    """A pod is gone (or finished): whatever it held can be released."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.pod.deleted"
    pod: PodRef
    node: NodeName | None = None
    grants: tuple[ContainerGrant, ...] = ()

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.pod.namespace)}"


class PodRejected(Event, frozen=True, kw_only=True, tag="pod.rejected"):
    """A pod's request is invalid as written; no retry helps until the pod changes."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.pod.rejected"
    pod: PodRef
    errors: tuple[RequestError, ...]

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.pod.namespace)}"


# --- nodes --------------------------------------------------------------------------


class NodeInventory(Event, frozen=True, kw_only=True, tag="node.inventory"):
    """A node agent's full device inventory (also kept in the inventory KV bucket)."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.node.inventory"
    node: NodeName
    devices: tuple[DeviceInfo, ...]
    config_hash: str
    """Hash of the config the agent runs with; the allocator refuses a mismatch."""
    agent: str = ""
    """Agent identity (host and version) for diagnostics."""
    seq: int = 0
    """Increases with every report of one agent; stale reports are ignored."""
    device_plugin: bool = False
    """The agent serves the kubelet's device-plugin API: a pod bound here is "admitting"
    until the agent reports ``allocation.admitted`` (see shared/core/admission.py)."""

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.node)}"


class NodeUpdated(Event, frozen=True, kw_only=True, tag="node.updated"):
    """What the Node object says about its devices: cordoned or unhealthy UUIDs
    (``hami.io/device-cordon``, ``volcano.sh/gpu-unhealthy-ids``) and node cordon."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.node.updated"
    node: NodeName
    cordoned_devices: tuple[str, ...] = ()
    unschedulable: bool = False

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.node)}"


class NodeDeleted(Event, frozen=True, kw_only=True, tag="node.deleted"):
    """A Node object was deleted: nothing more may be placed on it."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.node.deleted"
    node: NodeName

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.node)}"


# --- Volcano batch objects -----------------------------------------------------------


class PodGroupUpdated(Event, frozen=True, kw_only=True, tag="podgroup.updated"):
    """A Volcano PodGroup as the watcher read it: who belongs together and how many."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.podgroup.updated"
    namespace: str
    name: str
    uid: str = ""
    min_member: int = 1
    min_task_member: dict[str, int] = msgspec.field(default_factory=dict)
    queue: str = "default"
    priority_class: str = ""
    min_resources: dict[str, str] = msgspec.field(default_factory=dict)

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.namespace)}"


class PodGroupDeleted(Event, frozen=True, kw_only=True, tag="podgroup.deleted"):
    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.podgroup.deleted"
    namespace: str
    name: str

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.namespace)}"


class QueueUpdated(Event, frozen=True, kw_only=True, tag="queue.updated"):
    """A Volcano Queue: weight, capability, guarantee, reclaimable, priority, state."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.queue.updated"
    name: str
    weight: int = 1
    capability: dict[str, str] = msgspec.field(default_factory=dict)
    guarantee: dict[str, str] = msgspec.field(default_factory=dict)
    reclaimable: bool = True
    priority: int = 0
    state: str = "Open"


class QueueDeleted(Event, frozen=True, kw_only=True, tag="queue.deleted"):
    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.queue.deleted"
    name: str


class JobUpdated(Event, frozen=True, kw_only=True, tag="job.updated"):
    """A Volcano Job (``batch.volcano.sh/v1alpha1``); ``spec`` is the object's spec as is."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.job.updated"
    namespace: str
    name: str
    uid: str
    spec: dict[str, Any] = msgspec.field(default_factory=dict)

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.namespace)}"


class JobDeleted(Event, frozen=True, kw_only=True, tag="job.deleted"):
    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.job.deleted"
    namespace: str
    name: str
    uid: str = ""

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.namespace)}"


# --- gangs --------------------------------------------------------------------------


class VictimUnit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Bound pods that may be evicted for a gang, all together (a lone pod, a gang's
    member beyond its ``minMember``, or a whole gang: never cut below ``minMember``)."""

    pods: tuple[PodRef, ...]
    why: str
    """Why they may go, for the Events: lower priority, or a queue over its share."""


class GangReady(Event, frozen=True, kw_only=True, tag="gang.ready"):
    """A gang has at least ``min_member`` pending pods: place them all or none."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.gang.ready"
    gang: GangRef
    min_member: int
    members: tuple[PodPending, ...]
    attempt: int = 1
    victims: tuple[VictimUnit, ...] = ()
    """If the gang does not fit: what may be preempted for it, cheapest first."""
    hold: bool = False
    """The gang has waited past ``scheduler.starvationGuardS``: if it does not fit, hold
    the nodes it would fit on once their pods finish, so smaller gangs stop taking them."""

    def dedup_id(self) -> str:
        # A group may be sent in parts (a queue's share admits some members now): the
        # members are part of the identity, or JetStream would drop the second part.
        members = hashlib.sha1(",".join(sorted(m.pod.uid for m in self.members)).encode())
        return f"{self.gang.namespace}/{self.gang.name}:{self.attempt}:{members.hexdigest()[:12]}"


# --- allocations (the public API) ----------------------------------------------------


class AllocationDecided(Event, frozen=True, kw_only=True, tag="allocation.decided"):
    """The allocator placed one pod and reserved its devices; the binder writes it."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.allocation.decided"
    pod: PodRef
    node: NodeName
    grants: tuple[ContainerGrant, ...]
    gang: GangRef | None = None
    attempt: int = 1

    def dedup_id(self) -> str:
        return f"decided:{self.pod.uid}:{self.attempt}"


class AllocationFailed(Event, frozen=True, kw_only=True, tag="allocation.failed"):
    """No placement for these pods now; ``message`` aggregates per-node reasons."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.allocation.failed"
    pods: tuple[PodRef, ...]
    message: str
    reasons: tuple[ReasonCount, ...] = ()
    gang: GangRef | None = None
    attempt: int = 1
    unresolvable: bool = False
    """True when no change of the cluster's load can help (only a new node or pod spec)."""

    def dedup_id(self) -> str:
        first = self.pods[0].uid if self.pods else ""
        return f"failed:{first}:{self.attempt}"


class PreemptionDecided(Event, frozen=True, kw_only=True, tag="allocation.preempting"):
    """Pods to evict so that ``gang`` fits; the binder evicts them and the allocator keeps
    what they free for the gang."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.allocation.preempting"
    gang: GangRef
    preemptor: tuple[PodRef, ...]
    victims: tuple[VictimUnit, ...]
    nodes: tuple[NodeName, ...]
    """Where the gang will go once the victims are gone."""
    attempt: int = 1

    def dedup_id(self) -> str:
        return f"preempting:{self.gang.namespace}/{self.gang.name}:{self.attempt}"


class AllocationBound(Event, frozen=True, kw_only=True, tag="allocation.bound"):
    """The Binding with the grant annotations was written: the grant is durable."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.allocation.bound"
    pod: PodRef
    node: NodeName
    grants: tuple[ContainerGrant, ...]
    attempt: int = 1

    def dedup_id(self) -> str:
        return f"bound:{self.pod.uid}:{self.attempt}"

    def subject(self) -> str:  # per node: each node agent reads its own
        return f"{self.SUBJECT}.{subject_token(self.node)}"


class BindFailed(Event, frozen=True, kw_only=True, tag="allocation.bind-failed"):
    """The Binding write failed for good; the reservation must be released."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.allocation.bind-failed"
    pod: PodRef
    node: NodeName
    error: str
    attempt: int = 1

    def dedup_id(self) -> str:
        return f"bind-failed:{self.pod.uid}:{self.attempt}"


class AllocationReleased(Event, frozen=True, kw_only=True, tag="allocation.released"):
    """A pod's grant was returned to the ledger (pod deleted, finished, or bind failed)."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.allocation.released"
    pod: PodRef
    node: NodeName
    reason: str

    def dedup_id(self) -> str:
        return f"released:{self.pod.uid}:{self.node}"

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.node)}"


class AllocationAdmitted(Event, frozen=True, kw_only=True, tag="allocation.admitted"):
    """The node's kubelet took the pod's devices (every ``Allocate`` for it was answered
    with its own grant); another pod of its admission key may now bind to the node."""

    SUBJECT: ClassVar[str] = f"{SUBJECT_PREFIX}.allocation.admitted"
    pod: PodRef
    node: NodeName

    def dedup_id(self) -> str:
        return f"admitted:{self.pod.uid}:{self.node}"

    def subject(self) -> str:
        return f"{self.SUBJECT}.{subject_token(self.node)}"


AnyEvent = (
    PodPending
    | PodUpdated
    | PodDeleted
    | PodRejected
    | NodeInventory
    | NodeUpdated
    | NodeDeleted
    | PodGroupUpdated
    | PodGroupDeleted
    | QueueUpdated
    | QueueDeleted
    | JobUpdated
    | JobDeleted
    | GangReady
    | AllocationDecided
    | AllocationFailed
    | AllocationBound
    | PreemptionDecided
    | BindFailed
    | AllocationReleased
    | AllocationAdmitted
)
"""The tagged union of every event; decoding yields the concrete type."""

EVENT_TYPES: tuple[type[Event], ...] = (
    PodPending,
    PodUpdated,
    PodDeleted,
    PodRejected,
    NodeInventory,
    NodeUpdated,
    NodeDeleted,
    PodGroupUpdated,
    PodGroupDeleted,
    QueueUpdated,
    QueueDeleted,
    JobUpdated,
    JobDeleted,
    GangReady,
    AllocationDecided,
    AllocationFailed,
    AllocationBound,
    PreemptionDecided,
    BindFailed,
    AllocationReleased,
    AllocationAdmitted,
)

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    """JSON bytes of one event, tag included."""
    return _encoder.encode(event)


def decode(data: bytes) -> AnyEvent:
    """Decode any event from its JSON; raises ``msgspec.ValidationError`` on bad input."""
    return _decoder.decode(data)


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
