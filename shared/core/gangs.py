"""Which gangs go to the allocator, when, and in what order: the coordinator's decisions.

:class:`Gangs` is the gang-coordinator's state and judgement with no I/O: the service
tells it what happened (a pod is pending, was placed, failed, bound, deleted; a
PodGroup, Queue or node changed) and asks :meth:`Gangs.dispatch` what to send now.

Readiness. A lone pod is a gang of one and is ready at once. Pods of a PodGroup
(``scheduling.k8s.io/group-name``) wait until the PodGroup is known (as Volcano's do),
then go together once ``minMember`` of them (and ``minTaskMember`` per task role) are
pending or already placed. A PodGroup with ``subGroupPolicy`` also waits for
``minSubGroups`` whole subgroups of each policy, and its queue admits whole subgroups
only (shared/core/subgroups.py).

Queues (Volcano's). With queues known, the pods of a gang whose queue is missing or
not Open wait and are told why. Each queue gets its deserved share of the cluster's
devices (shared/core/queues.py); a gang whose queue's allocated + in-flight + gang
would pass its capability (always) or its deserved share (while another queue has a
gang waiting) waits while the others are served; a PodGroup not yet started counts as
at least its ``minResources`` there (Volcano's enqueue check). A group may be sent in part: the
members its queue allows, if they reach ``minMember``. Under ``capacity`` the tree's real
capabilities bound a queue always, and its fair share (``hierarchy.fair``: deserved up to
what it asks, plus its part of what others leave) while another queue below its own has
a gang waiting: what it borrowed beyond would be reclaimed as soon as that queue got
room (bench/fairness.py counted most of the tree's evictions there). A gang its queue's
capability holds back is told so. A pod's DRA claims count in its queue per DeviceClass
(shared/core/claimed.py), each once per queue however many of its pods name it.

Order. Ready gangs go by queue priority, then the queue furthest below its share, then
pod priority, then age.

Retries. A gang the allocator could not place is parked and retried when something
could help (a node changed, a grant was released) or after a backoff doubling up to a
minute; an unresolvable one waits for a node change, or for the pod to change (its
request, or what node filters read of it: its spec, the verdict on its volumes and
resource claims). One that fails after such a change came while it was in flight is
retried at once (the allocator may not have seen it). One
the allocator did not answer in ``INFLIGHT_TIMEOUT_S`` is sent again (the allocator
repeats a decision it made). A pod whose Binding failed is sent again at once when the
API server was out of reach, after its backoff when it refused the Binding
(``bind_failed``), and not until it is announced again when the refusal was for its
scheduling gates (``withdraw``).
A gang that failed for lack of room is sent with the bound pods that may be preempted
for it (shared/core/preemption.py ``victims``: under ``capacity``, those of queues over
their fair share, and once it has waited past the starvation guard within its deserved
share, also of queues over their deserved), and once it has waited past the starvation
guard with ``hold`` (under ``capacity``, only within its deserved share).

Per pod::

    pending --dispatch--> inflight --decided--> placed --bound--> bound --deleted--> (gone)
       ^                      |  failed             |  bind failed
       +------ retry ------ parked <----------------+
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from shared.core.claimed import is_claimed
from shared.core.consolidation import movable, moved_allowances
from shared.core.disruption import Budget
from shared.core.hierarchy import (
    ROOT,
    QueueTree,
    TreeQueue,
    build,
    fair,
    may_reclaim,
    order_key,
    over_capability,
    rolled_up,
)
from shared.core.hierarchy import share as fair_ratio
from shared.core.model import (
    DeviceInfo,
    GangKey,
    Movable,
    NodeName,
    PodRef,
    PodRequest,
    PodUID,
    VictimUnit,
)
from shared.core.preemption import Protection, allowances, victims
from shared.core.queues import (
    EPS,
    GroupSpec,
    QueueShare,
    QueueSpec,
    Resources,
    accumulate,
    add,
    cluster_capacity,
    deserved,
    request_vector,
    within,
)
from shared.core.status import UNRESOLVABLE, Code, Reason, Status
from shared.core.subgroups import Shaped, SubGroups, shape
from shared.core.usage import UsageMemory, UsageParams

MAX_BACKOFF_S = 60.0
INFLIGHT_TIMEOUT_S = 20.0
"""A gang the allocator has not answered in this time is sent again (it may have been
published before the allocator's consumer existed); the allocator answers a pod it
already placed by repeating its decision, so a resend never places twice."""

State = Literal["pending", "inflight", "placed", "bound", "parked"]


@dataclass(slots=True)
class Member:
    """One pod of a gang, as the coordinator tracks it (see the module's state chart)."""

    pod: PodRef
    key: GangKey
    request: PodRequest
    priority: int = 0
    created_at: float = 0.0
    task: str | None = None
    """Its task role in a Volcano Job (``minTaskMember`` counts per role)."""
    since: float = 0.0
    """When it started to wait (monotonic): the starvation guard counts from here."""
    state: State = "pending"
    attempt: int = 0
    retry_at: float = 0.0
    sent_at: float = 0.0
    sent_helps: tuple[int, int] = (0, 0)
    """``Gangs.helps`` when it was last sent."""
    unresolvable: bool = False
    failed: bool = False
    """The allocator's last answer was "does not fit now": preemption may help."""
    refused: bool = False
    """Parked because the API server refused its Binding: only its backoff brings it back."""
    queue: str = "default"
    vector: Resources = field(default_factory=dict)
    """What it takes of its queue: estimated from the request, exact once placed; its
    devices (``own``) and the claims it counts (``counted``)."""
    own: Resources = field(default_factory=dict)
    """What its devices take (device-plugin resources): its request's, then its grant's."""
    claims: Mapping[str, Resources] = field(default_factory=dict)
    """Its DRA ResourceClaims by UID, each as it counts (shared/core/claimed.py): what it
    asks, then once allocated what it holds."""
    counted: frozenset[str] = frozenset()
    """The claims it counts in its queue: a claim named by several pods of one queue
    counts once, in the first of them known (``Gangs._recount``)."""
    told: str = ""
    """What it was last told by the coordinator (queue closed...): said once."""
    preemption_policy: str = ""
    """``spec.preemptionPolicy`` (``Never``: it evicts no one; shared/core/preemption.py)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Its labels, for the PodDisruptionBudgets that cover it once bound."""
    started: float | None = None
    """When it was scheduled (the ``since`` clock), once bound; None: not known."""
    cooldown_s: float = 0.0
    """Volcano's ``volcano.sh/cooldown-time``: no eviction before ``started`` + this."""
    owner: str = ""
    """Its controller (``Kind/name``), "" for a bare pod (never moved)."""
    preemptable: bool = False
    """Marked ``volcano.sh/preemptable: "true"``: consolidation may move it."""


@dataclass(frozen=True, slots=True)
class ReadyGang:
    """A gang to send now: the members to place, ``min_member`` of them all together."""

    key: GangKey
    queue: str
    members: tuple[Member, ...]
    min_member: int
    attempt: int
    victims: tuple[VictimUnit, ...] = ()
    budgets: Mapping[str, int] = field(default_factory=dict)
    """What each PodDisruptionBudget ``victims`` count against allows now."""
    hold: bool = False
    protected_s: float = 0.0
    """Pods that would have been offered as victims are protected by their minimum
    runtime: the first protection ends in this many seconds (0: none)."""
    subgroups: SubGroups | None = None
    """Its PodGroup's subgroups among ``members`` (None: it has no ``subGroupPolicy``)."""
    movable: tuple[Movable, ...] = ()
    """Shared-GPU pods that may be moved to make room for it (shared/core/consolidation.py)."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What :meth:`Gangs.dispatch` decided: gangs to send, in order, and pods to tell why
    they wait (each once)."""

    ready: tuple[ReadyGang, ...] = ()
    told: tuple[tuple[Member, Status], ...] = ()


@dataclass(frozen=True, slots=True)
class Policy:
    """The coordinator's knobs (``scheduler:`` in the config)."""

    retry_backoff_s: float = 1.0
    starvation_guard_s: float = 300.0
    preemption: bool = True
    consolidation: bool = False
    """``scheduler.consolidation.enabled``: offer movable pods to a gang that failed."""
    queue_plugin: Literal["proportion", "capacity"] = "proportion"
    """``scheduler.queuePlugin``: flat shares, or the ``capacity`` tree."""
    ancestor_reclaim_level: int = -1
    preempt_min_runtime_s: float = 0.0
    """``scheduler.preemptMinRuntimeS``: the default minimum runtime before preemption."""
    reclaim_min_runtime_s: float = 0.0
    """``scheduler.reclaimMinRuntimeS``: the default before reclaim."""
    usage: UsageParams = field(default_factory=UsageParams)
    """``scheduler.usage``: the memory of past use and how much it moves shares."""


class _Sums:
    """Per queue, the sum of its waiting members' vectors (``demand``) and of those that
    hold theirs, in flight or placed (``held``), kept as each member is set or removed.
    A queue's sums are dropped when it has no such member left, so what rounding leaves
    of additions and subtractions never outlives a burst."""

    __slots__ = ("_counts", "_of", "demand", "held")

    def __init__(self) -> None:
        self.demand: dict[str, Resources] = {}
        self.held: dict[str, Resources] = {}
        self._counts: dict[tuple[str, bool], int] = {}
        self._of: dict[PodUID, tuple[str, Resources, bool]] = {}
        """What each member adds now: its queue, its vector, whether it holds it."""

    def set(self, uid: PodUID, queue: str, vector: Resources, holds: bool) -> None:
        was = self._of.get(uid)
        if was is not None:
            if was[0] == queue and was[2] == holds and was[1] == vector:
                return  # nothing changed (the usual case in a dispatch's scan)
            self._take(*was)
        self._of[uid] = (queue, vector, holds)
        self._add(queue, vector, held=False)
        if holds:
            self._add(queue, vector, held=True)

    def remove(self, uid: PodUID) -> None:
        was = self._of.pop(uid, None)
        if was is not None:
            self._take(*was)

    def _take(self, queue: str, vector: Resources, holds: bool) -> None:
        self._sub(queue, vector, held=False)
        if holds:
            self._sub(queue, vector, held=True)

    def _add(self, queue: str, vector: Resources, *, held: bool) -> None:
        """Add to ``held`` (else ``demand``)."""
        self._counts[queue, held] = self._counts.get((queue, held), 0) + 1
        accumulate((self.held if held else self.demand).setdefault(queue, {}), vector)

    def _sub(self, queue: str, vector: Resources, *, held: bool) -> None:
        """Take from ``held`` (else ``demand``); a queue's sum goes with its last member."""
        sums = self.held if held else self.demand
        left = self._counts.pop((queue, held)) - 1
        if left:
            self._counts[queue, held] = left
            accumulate(sums[queue], vector, -1)
        else:
            del sums[queue]


class Gangs:
    """Every pod not yet bound, the bound ones by gang, PodGroups, Queues and capacity."""

    def __init__(
        self, policy: Policy | None = None, split: Mapping[str, int] | None = None
    ) -> None:
        self.policy = policy or Policy()
        self.split = dict(split or {})
        """Each vendor's ``deviceSplitCount``: a card counts as that many slots."""
        self.pods: dict[PodUID, Member] = {}
        """Pods not bound: pending, in flight, placed or parked."""
        self.bound: dict[GangKey, dict[PodUID, Member]] = {}
        """Bound pods by gang. Kept out of the per-dispatch scan (at 10,000 pods that scan
        was most of the coordinator's CPU); their use is summed as they come and go."""
        self.bound_pods: dict[PodUID, Member] = {}
        self.bound_use: dict[str, Resources] = {}
        """Per queue, what its bound pods hold."""
        self._waiting = _Sums()
        """Per queue, what its pods not bound add to its demand, and of that what the
        ones in flight or placed hold: kept as members change (``_account``), so a
        dispatch does not sum every waiting pod again (at a few thousand pods behind,
        that sum was most of the coordinator's CPU, and grew with the backlog)."""
        self.groups: dict[GangKey, GroupSpec] = {}
        self.queues: dict[str, QueueSpec] = {}
        self._tree: tuple[tuple[QueueSpec, ...], QueueTree] | None = None
        """The ``capacity`` tree, and the queues it was built from (rebuilt when one
        changes: see :meth:`tree`)."""
        self.budgets: dict[str, dict[str, Budget]] = {}
        """PodDisruptionBudgets by namespace, then name (victims are offered by them)."""
        self.nodes: dict[NodeName, tuple[DeviceInfo, ...]] = {}
        """Every node's devices (their inventories)."""
        self._capacity: tuple[Resources, dict[str, int]] | None = None
        """The cluster's devices as queues share them, and the largest card per vendor
        (queues.cluster_capacity). Kept until an inventory changes: summing every device
        on each dispatch was most of the coordinator's CPU at 1,000 nodes."""
        # The waiting pods by state, kept as each moves (``_move``), so that a dispatch
        # reads the pending ones, the placed ones of the gangs it sends and the parked or
        # in-flight ones that are due, not every pod behind: scanning them all on every
        # dispatch and every release was most of the coordinator's CPU in a burst, and
        # grew with the backlog.
        self._pending: dict[PodUID, Member] = {}
        self._inflight: dict[PodUID, Member] = {}
        """In the order they were sent (a resend moves a pod to the end): the ones past
        ``INFLIGHT_TIMEOUT_S`` are at the front."""
        self._placed: dict[GangKey, dict[PodUID, Member]] = {}
        self._backing_off: dict[PodUID, Member] = {}
        """Parked pods waiting out a backoff (not yet made due by ``helpful``), but for
        those whose Binding was refused (``Member.refused``: only the clock helps them)."""
        self._unresolvable: dict[PodUID, Member] = {}
        """Parked pods only a node change can help."""
        self._due: list[tuple[float, int, PodUID]] = []
        """A heap of (retry time, order, pod) for parked pods; an entry whose pod moved
        on or was parked again since is passed over."""
        self._order = itertools.count()
        self.helps = (0, 0)
        """How many times capacity may have appeared (``helpful``): for any reason, and
        because a node changed. A pod that fails after such a change came while it was
        in flight is retried at once: the allocator may have judged it before it saw the
        change (kube-scheduler's scheduling queue does the same with its move requests)."""
        self._grouped: dict[GangKey, dict[PodUID, Member]] = {}
        """The waiting pods of PodGroups (not lone pods), by gang: a group's queue may
        change under its pods."""
        self._queue_of: dict[GangKey, str] = {}
        """The queue each of those gangs' pods was last counted in."""
        self._withdrawn: dict[PodUID, int] = {}
        """The attempts of each withdrawn pod (``withdraw``), until it comes back or goes."""
        self.usage = UsageMemory(self.policy.usage)
        """Each queue's past use (shared/core/usage.py), sampled by the caller
        (:meth:`sample_usage`)."""
        self._shaped: dict[GangKey, Shaped[Member]] = {}
        """What ``readiness`` found of the gangs with subgroups it let go, for this
        dispatch's admission (shared/core/subgroups.py)."""
        self._claimants: dict[str, dict[PodUID, Member]] = {}
        """Per ResourceClaim UID, the pods (waiting or bound) that name it, first known
        first: the first of each queue counts it (``_recount``)."""

    # --- what happened ----------------------------------------------------------------

    def pending(self, m: Member, *, respec: bool = False) -> bool:
        """A pod is (still) pending. True if it is new or its request changed, or
        ``respec``: what node filters read of it did (its spec, or the verdict on its
        volumes and resource claims): a parked pod is tried again, and one in flight
        again at once if it fails (the allocator judged what it was)."""
        if m.pod.uid in self.bound_pods:
            return False  # an old announcement of a pod bound since
        known = self.pods.get(m.pod.uid)
        if known is None:
            m.attempt = max(m.attempt, self._withdrawn.pop(m.pod.uid, 0))
            self.pods[m.pod.uid] = m
            m.queue = self.queue_of(m.key)
            claims, m.claims = m.claims, {}
            self._move(m, m.state)
            self.claimed(m.pod.uid, claims)
            return True
        changed = known.request != m.request or respec or known.claims != m.claims
        if known.key != m.key:
            self._leave(known)
            known.key = m.key
            known.queue = self.queue_of(m.key)
            self._move(known, known.state)
            self._recount(known.claims)
        if known.claims != m.claims:
            self.claimed(known.pod.uid, m.claims)
        known.request, known.task = m.request, m.task
        known.priority, known.created_at = m.priority, m.created_at
        known.preemption_policy, known.labels = m.preemption_policy, m.labels
        if changed and known.state == "parked":
            known.unresolvable = False
            self._move(known, "pending")
        elif changed and known.state == "inflight":
            known.sent_helps = (-1, -1)  # a failure now may be stale: ``failed`` retries
        return changed

    def decided(
        self, uid: PodUID, vector: Resources, claims: Mapping[str, Resources] | None = None
    ) -> None:
        """The allocator placed the pod; ``vector`` is what its grant really holds,
        ``claims`` what the claims it allocated or reserves for it hold (by UID)."""
        m = self.pods.get(uid)
        if m is not None and m.state in ("inflight", "pending"):
            m.failed, m.own = False, vector
            m.vector = self._value(m)
            self._move(m, "placed")
            if claims:
                self.claimed(uid, {**m.claims, **claims})

    def claimed(self, uid: PodUID, claims: Mapping[str, Resources]) -> None:
        """The pod's DRA claims now, each as it counts (shared/core/claimed.py), by UID:
        what it asks, or what it holds once allocated (by Tessera or another)."""
        m = self.pods.get(uid) or self.bound_pods.get(uid)
        if m is None or m.claims == claims:
            return
        was = m.claims
        for gone in was.keys() - claims.keys():
            self._unclaim(gone, uid)
        m.claims = dict(claims)
        for claim in claims:
            self._claimants.setdefault(claim, {})[uid] = m
        self._recount(was.keys() | claims.keys())
        self._revalue(m)  # a claim it counts may hold another amount now

    def _unclaim(self, claim: str, uid: PodUID) -> None:
        named = self._claimants.get(claim)
        if named is not None:
            named.pop(uid, None)
            if not named:
                del self._claimants[claim]

    def _recount(self, claims: Iterable[str]) -> None:
        """Who counts each of ``claims``: in each queue, the first pod that names it."""
        for claim in claims:
            seen: set[str] = set()
            for m in list(self._claimants.get(claim, {}).values()):
                counts = m.queue not in seen
                seen.add(m.queue)
                if (claim in m.counted) != counts:
                    m.counted = m.counted ^ {claim}
                    self._revalue(m)

    def _value(self, m: Member) -> Resources:
        """What ``m`` takes of its queue: its devices and the claims it counts."""
        out = dict(m.own)
        for claim in m.counted:
            accumulate(out, m.claims.get(claim, {}))
        return out

    def _revalue(self, m: Member) -> None:
        """``m.vector`` again (its own part or its counted claims changed), and the
        queue sums it is in."""
        new = self._value(m)
        if new == m.vector:
            return
        uid = m.pod.uid
        if uid in self.bound_pods:
            use = self.bound_use.setdefault(m.queue, {})
            accumulate(use, m.vector, -1)
            accumulate(use, new)
            m.vector = new
        else:
            m.vector = new
            if uid in self.pods:
                self._account(m)

    def failed(
        self, uids: Iterable[PodUID], attempt: int, *, unresolvable: bool, now: float
    ) -> None:
        """The allocator could not place these pods (in attempt ``attempt``)."""
        for uid in uids:
            m = self.pods.get(uid)
            if m is None or m.attempt != attempt:
                continue  # a stale answer to an earlier attempt
            backoff = self._backoff(m)
            m.failed = not unresolvable
            kind = 1 if unresolvable else 0  # only a node change helps an unresolvable pod
            if self.helps[kind] > m.sent_helps[kind]:
                self._park(m, unresolvable=False, retry_at=0.0)  # a change it may have missed
            else:
                self._park(m, unresolvable=unresolvable, retry_at=now + backoff)

    def bind_failed(self, uid: PodUID, *, refused_at: float | None = None) -> None:
        """The pod's Binding failed and its reservation is released. With the API server
        out of reach through the binder's own retries (``refused_at`` None) it is sent
        again at once; refused at ``refused_at``, it waits out its backoff, which freed
        capacity or a node change does not cut short: the refusal was not about room."""
        m = self.pods.get(uid)
        if m is None:
            return
        if refused_at is None:
            self._park(m, unresolvable=False, retry_at=0.0)
            return
        backoff = self._backoff(m)
        self._park(m, unresolvable=False, retry_at=refused_at + backoff, refused=True)

    def withdraw(self, uid: PodUID) -> None:
        """The pod waits no more until it is announced again (its Binding was refused
        for its scheduling gates): out of every index, its gang's count included. Its
        attempts are remembered, so its next one is new: events are told apart by pod
        and attempt, and a repeated one is dropped as a duplicate."""
        m = self.pods.pop(uid, None)
        if m is not None:
            self._leave(m)
            self._withdrawn[uid] = m.attempt
            self._release(m)

    def bound_now(
        self, uid: PodUID, started: float | None = None, cooldown_s: float = 0.0
    ) -> GangKey | None:
        """The pod is bound (``started``: when it was scheduled, on the ``since`` clock;
        ``cooldown_s``: its ``volcano.sh/cooldown-time``); its gang's key (None if it was
        not ours to wait for)."""
        m = self.pods.pop(uid, None)
        if m is None:
            return None
        self._leave(m)
        m.state = "bound"
        m.started, m.cooldown_s = started, cooldown_s
        m.queue = self.queue_of(m.key)
        self._recount(m.claims)  # its queue may have changed: out of every sum meanwhile
        self.bound_pods[uid] = m
        self.bound.setdefault(m.key, {})[uid] = m
        accumulate(self.bound_use.setdefault(m.queue, {}), m.vector)
        return m.key

    def forget(self, uid: PodUID) -> None:
        """The pod is gone (deleted, finished, or rejected as invalid)."""
        self._withdrawn.pop(uid, None)
        m = self.pods.pop(uid, None)
        if m is not None:
            self._leave(m)
            self._release(m)
        m = self.bound_pods.pop(uid, None)
        if m is not None:
            accumulate(self.bound_use.setdefault(m.queue, {}), m.vector, -1)
            members = self.bound[m.key]
            del members[uid]
            if not members:
                del self.bound[m.key]
            self._release(m)

    def _release(self, m: Member) -> None:
        """``m`` is gone: the claims it counted pass to the next pod of its queue that
        names them."""
        for claim in m.claims:
            self._unclaim(claim, m.pod.uid)
        self._recount(m.claims)

    def set_node(self, name: NodeName, devices: tuple[DeviceInfo, ...]) -> bool:
        """A node's inventory; True if its devices changed."""
        if self.nodes.get(name) == devices:
            return False
        self.nodes[name] = devices
        self._capacity = None
        return True

    def remove_node(self, name: NodeName) -> None:
        """A node is gone: its devices no longer count in the cluster's capacity."""
        if self.nodes.pop(name, None) is not None:
            self._capacity = None

    def capacity(self) -> tuple[Resources, dict[str, int]]:
        """The cluster total as queues share it, and the largest card per vendor."""
        if self._capacity is None:
            devices = (d for node in self.nodes.values() for d in node)
            self._capacity = cluster_capacity(devices, self.split)
        return self._capacity

    def totals(self) -> Resources:
        """The cluster total as queues share it (``capacity``), with the claimed devices
        (shared/core/claimed.py) that the ``capacity`` tree's root names: the inventories
        do not say which DeviceClass a device is of, so a claimed dimension has a total
        only where the Queue named ``root`` writes one in its capability, as Volcano lets
        an administrator give one."""
        total = self.capacity()[0]
        tree = self.tree()
        root = (tree.real.get(ROOT) if tree is not None else None) or {}
        extra = {d: v for d, v in root.items() if is_claimed(d) and d not in total}
        return {**total, **extra} if extra else total

    def helpful(self, *, node_changed: bool) -> None:
        """Capacity may have appeared: retry parked pods now (unresolvable ones only when
        a node changed, since only a node can make them fit)."""
        self.helps = (self.helps[0] + 1, self.helps[1] + node_changed)
        helped = [*self._backing_off.values()]
        self._backing_off.clear()
        if node_changed:
            helped += self._unresolvable.values()
            self._unresolvable.clear()
        for m in helped:
            m.retry_at = 0.0
            heapq.heappush(self._due, (0.0, next(self._order), m.pod.uid))

    def _backoff(self, m: Member) -> float:
        """How long a pod waits after its attempt failed: doubling, up to a minute."""
        return min(self.policy.retry_backoff_s * 2.0 ** (m.attempt - 1), MAX_BACKOFF_S)

    def _park(
        self, m: Member, *, unresolvable: bool, retry_at: float, refused: bool = False
    ) -> None:
        m.unresolvable, m.refused = unresolvable, refused
        m.retry_at = math.inf if unresolvable else retry_at
        self._move(m, "parked")

    def _move(self, m: Member, state: State) -> None:
        """Put a waiting member in ``state``: its place in the indexes by state, and the
        queue sums (``m.queue`` and ``m.vector`` as they are now)."""
        self._unlist(m)
        uid = m.pod.uid
        m.state = state
        if state == "pending":
            self._pending[uid] = m
        elif state == "inflight":
            self._inflight[uid] = m
        elif state == "placed":
            self._placed.setdefault(m.key, {})[uid] = m
        elif state == "parked":
            if m.retry_at == math.inf:
                self._unresolvable[uid] = m
            else:
                if m.retry_at > 0 and not m.refused:
                    self._backing_off[uid] = m
                heapq.heappush(self._due, (m.retry_at, next(self._order), uid))
        if not m.key.lone:
            self._grouped.setdefault(m.key, {})[uid] = m
            self._queue_of.setdefault(m.key, m.queue)  # changes go by _requeue
        self._account(m)

    def _unlist(self, m: Member) -> None:
        """Take a member out of the index of its state."""
        uid = m.pod.uid
        state = m.state
        if state == "pending":
            self._pending.pop(uid, None)
        elif state == "inflight":
            self._inflight.pop(uid, None)
        elif state == "placed":
            placed = self._placed.get(m.key)
            if placed is not None:
                placed.pop(uid, None)
                if not placed:
                    del self._placed[m.key]
        elif state == "parked":
            self._backing_off.pop(uid, None)
            self._unresolvable.pop(uid, None)

    def _leave(self, m: Member) -> None:
        """A member no longer waits (bound, gone) or changes gang: out of every index."""
        self._unlist(m)
        self._waiting.remove(m.pod.uid)
        grouped = self._grouped.get(m.key)
        if grouped is not None:
            grouped.pop(m.pod.uid, None)
            if not grouped:
                del self._grouped[m.key]
                del self._queue_of[m.key]

    def _account(self, m: Member) -> None:
        """Bring the queue sums in step with a waiting member's state, queue and vector
        (after any of them changed)."""
        self._waiting.set(m.pod.uid, m.queue, m.vector, m.state in ("inflight", "placed"))

    def _requeue(self) -> None:
        """Count the pods of each PodGroup whose queue changed (the PodGroup came, went
        or moved) in their new queue."""
        for key, was in list(self._queue_of.items()):
            queue = self.queue_of(key)
            if queue != was:
                self._queue_of[key] = queue
                for m in self._grouped[key].values():
                    m.queue = queue
                    self._account(m)
                    self._recount(m.claims)

    def _stale(self, entry: tuple[float, int, PodUID]) -> bool:
        """A retry entry whose pod is no longer parked for that time."""
        m = self.pods.get(entry[2])
        return m is None or m.state != "parked" or m.retry_at != entry[0]

    def next_retry(self) -> float:
        """The earliest time a parked pod is due (``inf`` when none is)."""
        due = self._due
        while due and self._stale(due[0]):
            heapq.heappop(due)
        return due[0][0] if due else math.inf

    def queue_of(self, key: GangKey) -> str:
        """The queue of a gang: its PodGroup's, else ``default``."""
        group = None if key.lone else self.groups.get(key)
        return group.queue if group is not None else "default"

    def running(self, key: GangKey) -> int | None:
        """How many of a PodGroup's pods are bound, once that reaches ``minMember``."""
        group = self.groups.get(key)
        count = len(self.bound.get(key, {}))
        return count if group is not None and count >= group.min_member else None

    def sample_usage(self, now: float) -> None:
        """Count what each queue's bound pods hold now in its past use (``now``: the
        usage memory's clock, wall-clock seconds in the service)."""
        self.usage.sample(now, self.bound_use, self.totals())

    # --- shares -----------------------------------------------------------------------

    def shares(self) -> tuple[dict[str, Resources], dict[str, Resources], dict[str, Resources]]:
        """Per queue, what it holds (bound, placed and in flight: Volcano's
        ``allocated``), what it asks (that and its pending pods: ``request``), and its
        deserved share: by that demand (``proportion``), or as the ``capacity`` tree has
        it (no division to compute)."""
        used = {q: dict(v) for q, v in self.bound_use.items()}
        demand = {q: dict(v) for q, v in self.bound_use.items()}
        for q, v in self._waiting.held.items():
            accumulate(used.setdefault(q, {}), v)
        for q, v in self._waiting.demand.items():
            accumulate(demand.setdefault(q, {}), v)
        tree = self.tree()
        if tree is not None:
            return used, demand, dict(tree.deserved)
        open_queues = [
            QueueShare(
                name=q.name,
                weight=q.weight,
                demand=demand.get(q.name, {}),
                capability=q.capability,
                guarantee=q.guarantee,
            )
            for q in self.queues.values()
            if q.state == "Open"
        ]
        k = self.policy.usage.weight
        total = dict(self.capacity()[0])
        # claimed devices have no total (``totals``): each queue gets what it asks of
        # them, within its capability
        for asking in open_queues:
            for d, amount in asking.demand.items():
                if is_claimed(d):
                    total[d] = total.get(d, 0.0) + amount
        return used, demand, deserved(total, open_queues, self.usage.normalized, k)

    def tree(self) -> QueueTree | None:
        """The queues as the ``capacity`` plugin's tree (shared/core/hierarchy.py); None
        with the ``proportion`` plugin or no queue known. Built again only when a queue
        was set or dropped since."""
        if self.policy.queue_plugin != "capacity" or not self.queues:
            return None
        specs = tuple(self.queues.values())
        kept = self._tree
        if (
            kept is None
            or len(kept[0]) != len(specs)
            or any(a is not b for a, b in zip(kept[0], specs, strict=True))
        ):
            tree = build(
                TreeQueue(
                    name=q.name,
                    parent=q.parent,
                    deserved=q.deserved or {},
                    guarantee=q.guarantee,
                    capability=q.capability,
                    priority=q.priority,
                    weight=q.weight,
                )
                for q in specs
            )
            kept = self._tree = (specs, tree)
        return kept[1]

    # --- decisions --------------------------------------------------------------------

    def dispatch(self, now: float) -> Dispatch:
        """Every gang ready and allowed by its queue, in the order to send them; the
        members sent become in flight."""
        self._requeue()
        self._shaped.clear()
        due = self._due
        while due and due[0][0] <= now:
            entry = heapq.heappop(due)
            if not self._stale(entry):
                self._move(self.pods[entry[2]], "pending")
        timeout = INFLIGHT_TIMEOUT_S
        late = list(
            itertools.takewhile(lambda m: now - m.sent_at > timeout, self._inflight.values())
        )
        for m in late:
            self._move(m, "pending")  # unanswered: send again
        groups: dict[GangKey, list[Member]] = {}
        largest = self.capacity()[1]
        for m in self._pending.values():
            m.own = request_vector(m.request, largest)
            m.vector = self._value(m)
            groups.setdefault(m.key, []).append(m)
            self._account(m)
        if not groups:
            return Dispatch()
        used, demand, share = self.shares()
        tree = self.tree()
        rolled = rolled_up(tree, used) if tree is not None else {}
        owed = None  # capacity: the fair shares order queues, admit gangs, bound reclaim
        closed = {q.name for q in self.queues.values() if q.state != "Open"}
        if tree is not None:  # (with usage weight 0, a plain water-filling of demand)
            past = rolled_up(tree, self.usage.normalized)
            k = self.policy.usage.weight
            # a queue that takes no new pods asks only what it holds
            asks = {q: used.get(q, {}) if q in closed else v for q, v in demand.items()}
            owed = fair(tree, self.totals(), rolled_up(tree, asks), past, k)
        told: list[tuple[Member, Status]] = []
        ready: list[tuple[tuple[object, ...], ReadyGang]] = []
        caps = {q.name: q.capability for q in self.queues.values() if q.capability}
        waiting = {members[0].queue for members in groups.values()}
        by_priority = sorted(  # within a queue: priority, then age
            groups.items(),
            key=lambda kv: (
                -max(m.priority for m in kv[1]),
                min(m.created_at for m in kv[1]),
            ),
        )
        floor: list[int] = []

        def lowest() -> int:  # the lowest priority bound, found once a gang needs it
            if not floor:
                floor.append(min((m.priority for m in self.bound_pods.values()), default=2**31))
            return floor[0]

        turns = by_priority if tree is None else _turns(by_priority, tree, rolled, owed)
        for key, members in turns:
            here = [*self._placed.get(key, {}).values(), *self.bound.get(key, {}).values()]
            min_member = self.readiness(key, members, here, told, tree)
            if min_member is None:
                continue
            queue = members[0].queue
            base = used.get(queue, {})
            fits: Callable[[Resources], bool]
            if tree is not None:  # capacity: each ancestor's real capability, a hard cap
                # and, while a queue below its fair share waits, the queue's fair share:
                # what it borrowed beyond would be reclaimed as soon as it got room
                bar = owed if _below_fair(tree, queue, waiting - closed, rolled, owed) else None
                fits = partial(_within_tree, tree, queue, rolled, bar)
            else:
                limits: list[tuple[Resources, float]] = []
                if queue in caps:  # capability: a hard cap, always; unnamed dimensions are free
                    limits.append((caps[queue] or {}, math.inf))
                if self.queues and len(waiting) > 1:  # deserved: while another queue waits
                    limits.append((share.get(queue, {}), 0.0))
                fits = partial(_within_limits, base, limits)
            shaped = self._shaped.pop(key, None)
            laid: SubGroups | None = None
            if shaped is None:
                taken, need = admit(members, fits)
            else:  # whole subgroups only
                taken, need, laid = shaped.admit(fits)
                if laid.short() is not None:
                    continue
                laid = laid if laid.subgroups else None
            if len(taken) < min_member:  # over its share or capability: not now
                capped = _over_capability(members[:min_member], queue, base, caps, tree, rolled)
                if capped is not None:  # the queue's hard limit: say so
                    status = Status(reasons=(Reason(kind="queue", detail=capped),))
                    _tell(members, status, told)
                continue
            started = here or any(
                m.state == "inflight" for m in self._grouped.get(key, {}).values()
            )
            group = None if key.lone or started else self.groups.get(key)
            if group is not None and group.min_resources:  # Volcano's enqueue check
                least = group.min_resources
                if not fits(_at_least(need, least)) or not within(least, self._cluster(least)):
                    self._never(members, queue, least, caps, tree, told)
                    continue
                need = _at_least(need, least)  # what this dispatch counts it for
            offered: tuple[VictimUnit, ...] = ()
            moving: tuple[Movable, ...] = ()
            hold = False
            protected_s = 0.0
            protection = Protection(
                now, self.policy.preempt_min_runtime_s, self.policy.reclaim_min_runtime_s
            )
            guard = self.policy.starvation_guard_s
            starved = now - min(m.since for m in taken) >= guard
            if any(m.failed for m in taken):  # it did not fit last time: what could help?
                if self.policy.preemption:
                    offered = victims(
                        key,
                        taken,
                        need,
                        bound=self.bound,
                        groups=self.groups,
                        queues=self.queues,
                        used=used,
                        share=share,
                        lowest=lowest(),
                        budgets=self.budgets,
                        tree=tree,
                        level=self.policy.ancestor_reclaim_level,
                        protection=protection,
                        owed=owed,
                        starved=starved,
                        follow_fair=self.policy.usage.weight > 0,
                    )
                if self.policy.consolidation:
                    moving = movable(
                        key,
                        queue,
                        self.bound,
                        offered,
                        protection,
                        self.queues,
                        tree,
                        self.budgets,
                    )
                if math.isfinite(protection.soonest):
                    protected_s = protection.soonest
                hold = guard > 0 and starved
                if hold and tree is not None:  # capacity: only a gang within its deserved
                    # share holds nodes; one borrowing beyond it (its fair share's surplus
                    # included) would keep them idle from the queues that deserve them
                    # (bench/fairness.py found it starving them, and costing allocation)
                    hold = may_reclaim(tree, queue, rolled, need, 0)
            first = taken[0]
            order: tuple[object, ...]
            if tree is not None:
                order = (order_key(tree, queue, rolled, owed), -first.priority, first.created_at)
            else:
                mine = share.get(queue, {})
                rank = max((base.get(k, 0.0) / v for k, v in mine.items() if v), default=0.0)
                q = self.queues.get(queue)
                order = (-(q.priority if q else 0), rank, -first.priority, first.created_at)
            gang = ReadyGang(
                key=key,
                queue=queue,
                members=tuple(taken),
                min_member=min_member,
                attempt=max(m.attempt for m in members) + 1,
                victims=offered,
                budgets={
                    **allowances(offered, self.budgets),
                    **moved_allowances(moving, self.budgets),
                },
                hold=hold,
                protected_s=protected_s,
                subgroups=laid,
                movable=moving,
            )
            ready.append((order, gang))
            used[queue] = add(base, need)
            if tree is not None:
                for name in tree.path(queue):
                    accumulate(rolled.setdefault(name, {}), need)
        ready.sort(key=lambda r: r[0])
        for _, gang in ready:
            for m in gang.members:
                m.attempt, m.sent_at, m.sent_helps = gang.attempt, now, self.helps
                self._move(m, "inflight")
        return Dispatch(ready=tuple(g for _, g in ready), told=tuple(told))

    def readiness(
        self,
        key: GangKey,
        members: list[Member],
        settled: list[Member],
        told: list[tuple[Member, Status]],
        tree: QueueTree | None = None,
    ) -> int | None:
        """How many of the pending ``members`` must go together now (the gang's
        ``minMember`` less those already placed or bound), or None while they must wait.
        Sorts ``members`` by priority, then age; pods of a refused queue are told why."""
        min_member = 1
        if not key.lone:
            group = self.groups.get(key)
            if group is None:  # not known (yet): Volcano waits as well, but says nothing
                why = (
                    f'PodGroup "{key.name}" does not exist (yet): its pods wait for it; '
                    "create it or correct scheduling.k8s.io/group-name"
                )
                _tell(members, Status(reasons=(Reason(kind="waiting", detail=why),)), told)
                return None
            for task, needed in group.min_task_member.items():
                if sum(1 for m in [*members, *settled] if m.task == task) < needed:
                    return None
            min_member = max(group.min_member - len(settled), 1)
            subgrouped = group.subgroups or group.invalid
            if subgrouped and not self._subgroups(key, group, members, settled, told):
                return None
            if len(members) < min_member:
                return None
        if self.queues:
            name = members[0].queue
            queue = self.queues.get(name)
            why = ""
            if queue is None:
                why = f'queue "{name}" does not exist; create it or name another'
            elif queue.state != "Open":
                why = f'queue "{name}" is {queue.state}: it accepts no new pods'
            elif tree is not None and name in tree.broken:
                why = f"{tree.broken[name]}: its pods wait until the queue tree is mended"
            elif tree is not None and not tree.leaf(name):
                children = ", ".join(tree.children.get(name, ()))
                why = (
                    f'queue "{name}" has child queues ({children}): only leaf queues take '
                    "pods; name one of them"
                )
            if why:
                refused = Status(
                    code=Code.UNRESOLVABLE,
                    reasons=(Reason(kind="queue", code=UNRESOLVABLE, detail=why),),
                )
                _tell(members, refused, told)
                return None
        members.sort(key=lambda m: (-m.priority, m.created_at))
        return min_member

    def _never(
        self,
        members: list[Member],
        queue: str,
        floor: Resources,
        caps: Mapping[str, Resources | None],
        tree: QueueTree | None,
        told: list[tuple[Member, Status]],
    ) -> None:
        """Tell a PodGroup's pods when its ``minResources`` exceed what its queue (or an
        ancestor) may ever hold, or the whole cluster: it waits for the Queue, the
        PodGroup or the nodes to change."""
        if tree is not None:
            x = over_capability(tree, queue, {}, floor)
            limit = (tree.real.get(x) or {}) if x is not None else {}
        else:
            x, limit = queue, caps.get(queue) or {}
        over = sorted(
            f"{d} {v:g} > {limit[d]:g}" for d, v in floor.items() if v > limit.get(d, math.inf)
        )
        fix = "lower spec.minResources or raise the queue's capability"
        if x is None or not over:  # within the queue's bounds: within the cluster's?
            total = self._cluster(floor)
            over = sorted(
                f"{d} {v:g} > {total.get(d, 0.0):g}"
                for d, v in floor.items()
                if v > total.get(d, 0.0) + EPS
            )
            x, fix = None, "lower spec.minResources or add nodes"
        if not over:
            return  # it fits once the queue has room: it waits, as over its capability
        where = f'queue "{x}"' if x is not None else "the cluster"
        why = (
            f"its PodGroup's minResources exceed what {where} may ever hold "
            f"({', '.join(over)}): {fix}"
        )
        _tell(members, Status(reasons=(Reason(kind="queue", detail=why),)), told)

    def _cluster(self, need: Resources) -> Resources:
        """The cluster's total on ``need``'s dimensions (``totals``); a claimed one it
        has none of is unbounded (no inventory tells it)."""
        total = self.totals()
        return {d: total.get(d, math.inf if is_claimed(d) else 0.0) for d in need}

    # --- subgroups (shared/core/subgroups.py) -----------------------------------------

    def _subgroups(
        self,
        key: GangKey,
        group: GroupSpec,
        members: list[Member],
        settled: list[Member],
        told: list[tuple[Member, Status]],
    ) -> bool:
        """Whether a PodGroup's subgroups let its pending ``members`` go now; if so
        ``members`` keeps only the pods that may (no pod of a subgroup that cannot be
        whole yet) and what admission needs is kept for ``dispatch``. Its pods are told
        when its policies are invalid, or can never have their ``minSubGroups`` with the
        pods that exist."""
        why: str | None = group.invalid
        if not why:
            members.sort(key=lambda m: (-m.priority, m.created_at))
            shaped = shape(
                group.subgroups,
                members,
                settled,
                lambda: [*self._grouped.get(key, {}).values(), *self.bound.get(key, {}).values()],
            )
            if isinstance(shaped, Shaped):
                members[:] = shaped.members
                self._shaped[key] = shaped
                return True
            why = shaped
        if why:
            code = Code.UNRESOLVABLE if group.invalid else Code.UNSCHEDULABLE
            status = Status(code=code, reasons=(Reason(kind="waiting", code=code, detail=why),))
            _tell(members, status, told)
        return False


def _tell(members: Iterable[Member], status: Status, told: list[tuple[Member, Status]]) -> None:
    """Tell each member ``status`` (its one reason's detail), once: a member already told
    the same is not told again."""
    why = status.reasons[0].detail
    for m in members:
        if m.told != why:
            m.told = why
            told.append((m, status))


def _over_capability(
    members: Iterable[Member],
    queue: str,
    base: Resources,
    caps: Mapping[str, Resources | None],
    tree: QueueTree | None,
    rolled: Mapping[str, Resources],
) -> str | None:
    """Why ``members`` (the least of a gang that may go) wait for their queue's
    capability (under ``capacity``, the real capability of the queue or an ancestor), or
    None when it is not what holds them (a share, a subgroup)."""
    need: Resources = {}
    for m in members:
        accumulate(need, m.vector)
    if tree is not None:
        x = over_capability(tree, queue, rolled, need)
        if x is None:
            return None
        limit, used = tree.real.get(x) or {}, rolled.get(x, {})
    else:
        x, limit, used = queue, caps.get(queue) or {}, base
    after = add({d: used.get(d, 0.0) for d in need}, need)
    over = sorted(
        f"{d} {after[d]:g} > {limit[d]:g}"
        for d, v in need.items()
        if v > EPS and d in limit and after[d] > limit[d] + EPS
    )
    if not over:
        return None
    held = "" if x == queue else f' (its ancestor "{x}")'
    return (
        f'queue "{queue}"{held} has no room within its capability ({", ".join(over)}): '
        "its pods wait until the queue's pods release what they hold"
    )


def _at_least(need: Resources, floor: Mapping[str, float]) -> Resources:
    """``need``, raised to ``floor`` in every dimension ``floor`` names."""
    return {d: max(need.get(d, 0.0), floor.get(d, 0.0)) for d in need.keys() | floor.keys()}


def admit(
    members: Iterable[Member], fits: Callable[[Resources], bool]
) -> tuple[list[Member], Resources]:
    """The members (in their order) whose needs together the queue ``fits``, and what
    they need together."""
    taken: list[Member] = []
    need: Resources = {}
    for m in members:
        more = add(need, m.vector)
        if fits(more):
            taken.append(m)
            need = more
    return taken, need


def _within_limits(base: Resources, limits: list[tuple[Resources, float]], need: Resources) -> bool:
    """``proportion``: the queue's ``base`` usage with ``need`` within every limit, each
    (vector, what a dimension it does not name allows)."""
    return all(within(add(base, need), lim, absent=a) for lim, a in limits)


def _within_tree(
    tree: QueueTree,
    queue: str,
    rolled: Mapping[str, Resources],
    owed: Mapping[str, Resources] | None,
    need: Resources,
) -> bool:
    """``capacity``: ``need`` more keeps the queue and every ancestor within their real
    capability, and the queue within its fair share (``owed``) when given."""
    if owed is not None and not within(
        add(rolled.get(queue, {}), need), owed.get(queue, {}), absent=math.inf
    ):
        return False
    return over_capability(tree, queue, rolled, need) is None


def _below_fair(
    tree: QueueTree,
    queue: str,
    waiting: Iterable[str],
    rolled: Mapping[str, Resources],
    owed: Mapping[str, Resources] | None,
) -> bool:
    """``capacity``: another leaf queue with a gang waiting holds less than its fair share
    (``owed``) as ``rolled`` is now: ``queue`` may then not borrow beyond its own (the
    tree's form of ``proportion``'s "within its deserved share while another queue
    waits", shared/core/queues.py)."""
    return owed is not None and any(
        q != queue and q in owed and tree.leaf(q) and fair_ratio(tree, q, rolled, owed) < 1 - EPS
        for q in waiting
    )


def _turns(
    gangs: list[tuple[GangKey, list[Member]]],
    tree: QueueTree,
    rolled: Mapping[str, Resources],
    owed: Mapping[str, Resources] | None,
) -> Iterator[tuple[GangKey, list[Member]]]:
    """``gangs`` (each queue's in its order) queue by queue, one gang at a time, the
    queue first by ``order_key`` (of ``owed``) as ``rolled`` is then (the caller adds each gang it
    admits): Volcano's allocate loop, so a burst in one queue does not fill a shared
    ancestor's capability before its siblings' turn. Gangs of queues not in the tree
    come first (readiness tells them why they wait)."""
    queued: dict[str, deque[tuple[GangKey, list[Member]]]] = {}
    for gang in gangs:
        queued.setdefault(gang[1][0].queue, deque()).append(gang)

    def rank(name: str) -> tuple[object, ...]:
        if name not in tree.parent or not tree.leaf(name):
            return (0, name)
        return (1, order_key(tree, name, rolled, owed))

    while queued:
        name = min(queued, key=rank)
        waiting = queued[name]
        yield waiting.popleft()
        if not waiting:
            del queued[name]
