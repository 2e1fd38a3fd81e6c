"""What the running scheduler shows of itself: live views answered over NATS request/reply.

The device-allocator holds the ledger and the gang-coordinator the queues; people and
tools ask them (``tessera get``, ``tessera explain``, ``tessera top``, the dashboard)
rather than decoding pod annotations. Only the active replica of each answers (it
subscribes when it takes its lease), so a view is the state that places pods now,
reservations included.

- ``tessera.ctl.view.ledger`` (device-allocator): :class:`LedgerView`, every node with
  its devices and the grants on each. An empty request asks for all nodes; a
  :class:`LedgerQuery` may name some.
- ``tessera.ctl.view.queues`` (gang-coordinator): :class:`QueuesView`, every queue's
  weight, deserved, allocated and request, and every gang still waiting with why.
- ``tessera.ctl.view.explain`` (device-allocator): an :class:`ExplainQuery` (a pod's
  request, parsed by the asker as the watcher parses it) answered by an
  :class:`ExplainView`: every node's verdict on the pod now, with the structured
  reasons and what would make it fit.

With allocator shards (docs/sharding.md) every shard answers the ledger and explain
views for its own nodes, saying which shard it is and which shards there are
(``shard``, ``shards``); the asker gathers one answer per shard and merges them
(:func:`merged`), so a view reads as one allocator's (shared/bus.py ``ask``).

The ``reader`` bus user (external tools, the dashboard) may send these requests and
subscribe to ``tessera.v1.allocation.>``; nothing else (shared/busauth.py).

Views are JSON like the events (any client can read them) and evolve by the same rule:
new fields get defaults.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from shared.core.hosts import PodSpec
from shared.core.model import PodRef, PodRequest
from shared.core.status import Reason, Status, combined

VIEW_SUBJECT_PREFIX = "tessera.ctl.view"
VIEW_LEDGER_SUBJECT = f"{VIEW_SUBJECT_PREFIX}.ledger"
VIEW_QUEUES_SUBJECT = f"{VIEW_SUBJECT_PREFIX}.queues"
VIEW_EXPLAIN_SUBJECT = f"{VIEW_SUBJECT_PREFIX}.explain"
VIEW_SUBJECTS = f"{VIEW_SUBJECT_PREFIX}.>"


class _View(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


# --- the ledger --------------------------------------------------------------------------


class LedgerQuery(_View, frozen=True, kw_only=True):
    """Which nodes to show (all when empty)."""

    nodes: tuple[str, ...] = ()


class GrantView(_View, frozen=True, kw_only=True):
    """One container's share of one device."""

    namespace: str
    pod: str
    uid: str
    container: str
    memory_mib: int = 0
    cores: int = 0
    exclusive: bool = False
    mig_profile: str | None = None
    vnpu_template: str | None = None
    bound: bool = False
    """Bound (the pod holds it) or only reserved (decided, the binder not yet through)."""
    group: str | None = None
    """The PodGroup of the pod, ``namespace/name``."""


class DeviceView(_View, frozen=True, kw_only=True):
    """One device: its capacity as the ledger counts it (after node overrides), its use."""

    uuid: str
    index: int
    vendor: str
    model: str
    mode: str
    """hami-core, mig, mps, vnpu, ... (the device's sharing mode)."""
    memory_mib: int
    cores: int
    slots: int
    """How many containers may share it (``deviceSplitCount``)."""
    used_memory_mib: int = 0
    used_cores: int = 0
    used_slots: int = 0
    healthy: bool = True
    cordoned: bool = False
    mps: str = ""
    """MPS daemon state on an MPS card (``running``, ``unavailable``), else empty."""
    grants: tuple[GrantView, ...] = ()


class NodeView(_View, frozen=True, kw_only=True):
    """One node: its devices and what the ledger counts on it besides devices."""

    name: str
    devices: tuple[DeviceView, ...] = ()
    pods: int = 0
    """Pods on it (of any scheduler) and Tessera's reserved ones."""
    unschedulable: bool = False
    refused: str = ""
    """Why the allocator places nothing there (another config), else empty."""


class LedgerView(_View, frozen=True, kw_only=True):
    """The allocator's ledger now."""

    nodes: tuple[NodeView, ...] = ()
    instance: str = ""
    """The allocator replica that answered (replicas, comma-separated, once merged)."""
    taken_at: float = 0.0
    shard: str = ""
    """The shard that answered (none unsharded, or once merged)."""
    shards: tuple[str, ...] = ()
    """Every shard: the asker waits for an answer from each."""


# --- queues and gangs ----------------------------------------------------------------------


class QueueView(_View, frozen=True, kw_only=True):
    """One Volcano Queue as the coordinator shares the cluster (resource vectors over
    ``<vendor>.count|memory|cores``, see shared/core/queues.py)."""

    name: str
    state: str = "Open"
    weight: float = 1.0
    priority: int = 0
    capability: dict[str, float] | None = None
    deserved: dict[str, float] = msgspec.field(default_factory=dict)
    allocated: dict[str, float] = msgspec.field(default_factory=dict)
    """Bound, placed and in flight."""
    request: dict[str, float] = msgspec.field(default_factory=dict)
    """Allocated plus what its waiting pods ask."""
    podgroups: dict[str, int] = msgspec.field(default_factory=dict)
    """PodGroups by phase (Pending, Inqueue, Running)."""
    parent: str = ""
    """``capacity``: its parent queue (``root`` for a top-level one)."""
    guarantee: dict[str, float] = msgspec.field(default_factory=dict)
    real_capability: dict[str, float] | None = None
    """``capacity``: what it may hold at most, its siblings' guarantees and its
    ancestors' capabilities counted (None: unlimited)."""
    refused: str = ""
    """``capacity``: why the tree refuses it (a missing parent, a cycle): its pods wait."""
    usage: dict[str, float] = msgspec.field(default_factory=dict)
    """Its past use, decayed by ``scheduler.usage.halfLifeS``, over the cluster's
    capacity over the same time (0.25: a quarter of the cluster, of late): per
    dimension (shared/core/usage.py). A parent's is its children's together."""


class GangView(_View, frozen=True, kw_only=True):
    """A gang with pods not yet bound."""

    namespace: str
    name: str
    queue: str = "default"
    lone: bool = False
    min_member: int = 1
    pods: dict[str, int] = msgspec.field(default_factory=dict)
    """Its pods by state (pending, inflight, placed, bound, parked)."""
    waiting_s: float = 0.0
    """How long its oldest pod has waited."""
    why: str = ""
    """The last thing it was told (the allocator's message, or the queue's refusal)."""
    unresolvable: bool = False
    reason: str = ""
    """The kind of the allocator's reason found on most nodes (``device-insufficient``,
    ``taint``... shared/core/status.py), when it answered."""


class QueuesView(_View, frozen=True, kw_only=True):
    """The coordinator's queues and waiting gangs now, with the replica that answered and when (Unix
    seconds)."""

    queues: tuple[QueueView, ...] = ()
    gangs: tuple[GangView, ...] = ()
    plugin: str = "proportion"
    """``scheduler.queuePlugin``: the ``capacity`` tree shows each queue's parent,
    guarantee and real capability."""
    instance: str = ""
    taken_at: float = 0.0


# --- explain ---------------------------------------------------------------------------------


class ExplainQuery(_View, frozen=True, kw_only=True):
    """A pod to try on every node now, without placing it."""

    pod: PodRef
    request: PodRequest
    spec: PodSpec | None = None
    group: str | None = None


class NodeVerdict(_View, frozen=True, kw_only=True):
    """One node's answer: it fits, or why not and what would make it fit."""

    node: str
    fits: bool = False
    reasons: tuple[Reason, ...] = ()
    texts: tuple[str, ...] = ()
    """The reasons as people read them (as Events say them)."""
    hints: tuple[str, ...] = ()
    """What would make it fit, one per reason."""


class ExplainView(_View, frozen=True, kw_only=True):
    """Every node's verdict on one pod, tried without placing it (``tessera explain``)."""

    pod: PodRef
    message: str = ""
    """kube-scheduler's one line (``0/N nodes are available: ...``), or that it fits."""
    unresolvable: bool = False
    nodes: tuple[NodeVerdict, ...] = ()
    """Every node, those that fit first."""
    error: str = ""
    """The request could not be tried (one line), else empty."""
    status: Status | None = None
    """Why no node takes it (None when some node does): the message's reasons."""
    shard: str = ""
    shards: tuple[str, ...] = ()
    """As in :class:`LedgerView`."""

    @classmethod
    def of(
        cls, pod: PodRef, verdicts: Iterable[NodeVerdict], status: Status | None, error: str = ""
    ) -> ExplainView:
        """The view of every node's verdict (those that fit first, then by name) and why
        no node takes the pod (None: some node does)."""
        nodes = tuple(sorted(verdicts, key=lambda v: (not v.fits, v.node)))
        fits = sum(v.fits for v in nodes)
        return cls(
            pod=pod,
            message=status.message()
            if status is not None
            else f"{fits}/{len(nodes)} nodes would take it now",
            unresolvable=status is not None and status.unresolvable,
            nodes=nodes,
            error=error,
            status=status,
        )


Sharded = LedgerView | ExplainView


def merged(parts: list[Sharded]) -> Sharded:
    """One view from every shard's answer, as one allocator over all nodes would give
    it: nodes together (those that fit first, for explain); explain's message counted
    over every shard's nodes (shared/core/status.py ``combined``)."""
    first = parts[0]
    if isinstance(first, LedgerView):
        ledgers = [p for p in parts if isinstance(p, LedgerView)]
        return LedgerView(
            nodes=tuple(sorted((n for p in ledgers for n in p.nodes), key=lambda n: n.name)),
            instance=",".join(p.instance for p in ledgers if p.instance),
            taken_at=min(p.taken_at for p in ledgers),
        )
    explains = [p for p in parts if isinstance(p, ExplainView)]
    verdicts = [v for p in explains for v in p.nodes]
    errors = [p.error for p in explains if p.error]
    statuses = [p.status for p in explains if p.status is not None]
    fits = any(v.fits for v in verdicts)
    status = combined(statuses) if statuses and not fits else None
    return ExplainView.of(first.pod, verdicts, status, errors[0] if errors else "")
