"""Multi-tenant fairness of Volcano-style queues: ``proportion`` and ``capacity`` side by side.

    python bench/fairness.py [--nodes 80] [--pods 2000] [--hours 3] [--step 10]
                             [--seed 1] [--starvation-guard 300] [--deserved 1]
                             [--quick]

Replays one multi-tenant workload built from the openb production trace (Weng et al.,
ATC'23; ../shared/traces/openb/README.md, read with bench/packing.py's functions)
through the coordinator's core twice, in this one run:

- ``proportion``: four flat queues, each with the weight of its deserved share
  (weighted water-filling, shared/core/queues.py);
- ``capacity``: the same four as leaves of a tree (shared/core/hierarchy.py,
  ``Policy(queue_plugin="capacity")``)::

      root ─ research (deserved 50 %) ─ vision  (25 %)   bursty: most of it early
           │                          └ nlp     (25 %)   steady
           └ prod     (deserved 50 %) ─ serving (25 %)   light: asks 40 % of its share
                                      └ batch   (25 %)   a wave in the middle of the run

With ``--deserved F`` below 1, each ``deserved`` in the tree is F times the share
above, and the rest of the cluster is divided by ``weight`` (the shares above): the
surplus that a memory of past use moves (KAI's ``deserved`` plus over-quota weight).
``serving`` has a guarantee of 10 % of the GPUs in both modes (a floor on its deserved
share, and no reclaim below it); no queue has a capability. Shares are of the GPUs'
cores (``nvidia.cores``: 100 per card), which is how a shared pod's fraction of a card
counts; the coordinator counts a card as 10 slots (``deviceSplitCount``), as the service
does.

The workload. ``--nodes`` GPU nodes drawn from the trace's node list with the seed
(their cards, cpu and memory). Each tenant offers GPU-time worth a multiple of its
deserved share of the cluster over the run (vision 2.0, nlp 1.2, serving 0.4, batch 1.5:
127.5 % of the cluster in all), as a fixed part of ``--pods`` GPU tasks drawn from the
trace with the seed (their shape: whole cards, or one card's share as
``gpumem-percentage``/``gpucores``; their cpu and memory). A task's duration is the
trace's ``deletion_time - scheduled_time`` (drawn from those of other tasks with the seed
where the trace has none: tasks that never ran), times one factor per tenant chosen so
that its GPU-time asked within the run (each duration cut at the end of the run) is its
multiple (where its pods can ask that much at all): the tenant with fewer pods per
GPU-hour has the longer pods (serving the longest, batch the shortest). The trace's
arrival times span five months, so arrivals follow each tenant's pattern instead
(above; drawn with the seed). Each pod is a PodGroup of one in its tenant's queue,
priority 0 (so every eviction is a reclaim between queues).

What it models, on a simulated clock in ``--step`` seconds (10 by default), as the
services drive the core: each step, pods whose work is done leave (their grant is
released, the coordinator forgets them, and parked pods are retried:
``Gangs.helpful``); new and re-submitted pods are announced (``Gangs.pending``);
nominations and holds that lapsed end (``Room.lapsed``); the coordinator dispatches
(``Gangs.dispatch``: queue limits, order, victims offered for gangs that failed before,
the starvation guard); each ready gang is placed as the allocator places it
(services/device_allocator/gangs.py: ``Room.waiting``, ``Placer.check``,
``Placer.place_gang`` with the default placement config and profile, so cpu and memory
count too); a placed pod is decided and bound at once (``Gangs.decided`` with its
grant's vector, ``Gangs.bound_now``); a gang not placed goes through ``Room.make_room``
(DefaultPreemption, StarvationHold) and ``Gangs.failed``. The pods ``Made.preempting``
names are evicted at once: ``Room.gone`` keeps their devices booked for the preemptor
until it is placed (services/device_allocator/pods.py; else the grant is released), the
coordinator forgets them, each counts as one eviction of its queue, and the pod is
created again ``RESUBMIT_S`` later (a Job's controller) with the work it had left: work
done before an eviction is kept (as with a checkpoint).

What it leaves out: the bus, the API server, binding and graceful-termination delays
(a pod binds in the step it is placed and an evicted pod is gone at once), retries of
the coordinator within a step (one dispatch per step), multi-pod gangs, pod priorities,
minimum runtimes, PodDisruptionBudgets, node failures, and the arrival times of the trace.

Figures, per mode, per leaf and parent queue (a parent in ``proportion`` mode is the sum
of its leaves): the deserved share of the GPUs; the demand share (GPU-time asked within
the run over the cluster's GPU-time in the run); ``min(deserved, demand)``; the GPU-time
share it got; the relative gap ``|got - min(deserved, demand)| / min(deserved, demand)``;
since demand comes and goes, also the share the mode's policy would give it were it
perfectly fair at every step (``fair_now``: water-filling what each queue then held and
waited for, flat or by the tree) and the gap to that; what it was owed whatever the
others did (``min(deserved, what it held and waited for)`` at each step, summed: a
tenant asks nothing before its pods come) and how far short of it it fell (above it, a
queue used room the others left); the mean and max time its pods
waited (from when each was created or re-created to when it was bound; pods still waiting
at the end count with the time they waited so far); evictions; and the cluster's GPU
allocation (GPU-time held over GPU-time available). Times and run times are on the step
clock (a pod's work is rounded up to a step). The script re-executes itself with
PYTHONHASHSEED=0, as bench/packing.py does, so a run repeats exactly.

The full run (80 nodes, 2,000 pods, 3 h in 10 s steps) takes about two minutes on 2
cores, nearly all of it the ``capacity`` replays: that plugin sends the waiting gangs
of a queue over its fair share on every step where something was released unless a queue
below its own waits (only capability bounds it then), each weighing its victims and the
room it could make, where ``proportion`` holds back the gangs of queues over their share
whenever another queue waits. Run it with ``PYTHONPATH=.`` from a checkout whose
``.venv`` is another checkout's: the editable install would import that one's core.
``--quick`` (24 nodes, 500 pods, 2 h) takes seconds. More pods per GPU-hour make shorter
pods and a longer backlog, and the ``capacity`` replay's time grows with backlog times
cluster size: 4,000 pods on 80 nodes over 4 h ran past ten minutes.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import os
import random
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packing import HASH_SEED, SPECS, TRACE, Node, Task, load_nodes, load_tasks, parse

from shared.core.gangs import Gangs, Member, Policy, ReadyGang
from shared.core.hosts import PodSpec
from shared.core.ledger import Ledger
from shared.core.model import GangKey, PodRef, PodRequest, PodUID
from shared.core.placement import GangMember, PlacementConfig, Placer
from shared.core.queues import GroupSpec, QueueShare, QueueSpec, deserved, grant_vector
from shared.core.request import RequestParser
from shared.core.room import Room, Unplaced
from shared.core.usage import UsageParams

Mode = Literal["proportion", "capacity", "capacity+usage"]
MODES: tuple[Mode, ...] = ("proportion", "capacity", "capacity+usage")
USAGE_SAMPLE_S = 30.0
"""The coordinator samples each queue's use this often (``scheduler.usage.sampleS``)."""
NAMESPACE = "openb"
RESUBMIT_S = 30.0
"""An evicted pod is created again this long after it went (its Job's controller)."""
SPLIT = {"nvidia": SPECS.nvidia.device_split_count}
"""Slots per card, as the coordinator counts them (``deviceSplitCount``)."""
EPS = 1e-9


@dataclass(frozen=True)
class Tenant:
    """A leaf queue and how its tenant submits."""

    name: str
    parent: str
    deserved: float
    """Its share of the cluster (capacity: ``deserved``; proportion: its weight)."""
    demand: float
    """The GPU-time it asks within the run, as a multiple of its deserved GPU-time."""
    pods: float
    """Its part of ``--pods``."""
    pattern: Literal["early", "steady", "wave"]
    guarantee: float = 0.0
    """A share of the cluster it is guaranteed (both modes)."""


TENANTS: tuple[Tenant, ...] = (
    Tenant("vision", "research", 0.25, 2.0, 0.40, "early"),
    Tenant("nlp", "research", 0.25, 1.2, 0.20, "steady"),
    Tenant("serving", "prod", 0.25, 0.4, 0.05, "steady", guarantee=0.10),
    Tenant("batch", "prod", 0.25, 1.5, 0.35, "wave"),
)
PARENTS: dict[str, float] = {"research": 0.5, "prod": 0.5}
PATTERNS = {
    "early": "bursty: 70 % of its pods in the first 15 % of the run, the rest evenly",
    "steady": "steady: evenly over the run",
    "wave": "a wave: 70 % of its pods between 40 % and 60 % of the run, the rest evenly",
}


@dataclass(frozen=True)
class Offer:
    """One pod of the workload: its tenant, trace task, arrival and work (seconds)."""

    index: int
    tenant: str
    task: Task
    arrival: float
    work: float

    @property
    def gpus(self) -> float:
        return self.task.demand


@dataclass
class Job:
    """An offer as it runs in one replay (across its re-creations after evictions)."""

    offer: Offer
    left: float
    attempt: int = 0
    state: Literal["future", "waiting", "running", "done"] = "future"
    uid: PodUID = field(default_factory=lambda: PodUID(""))
    submitted: float = 0.0
    started: float = 0.0
    ref: PodRef | None = None


@dataclass
class Outcome:
    """What one replay came to."""

    mode: Mode
    gpus: int
    horizon: float
    used: dict[str, float] = field(default_factory=dict)
    """GPU-seconds held per leaf queue within the run."""
    asked: dict[str, float] = field(default_factory=dict)
    """GPU-seconds asked per leaf queue within the run (each pod's work cut at the end)."""
    waits: dict[str, list[float]] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)
    states: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per leaf queue, its offers by state at the end (done, running, waiting, future)."""
    peak: float = 0.0
    """The most GPUs held at once (never above ``gpus``)."""
    fair: dict[str, float] = field(default_factory=dict)
    """GPU-seconds per leaf queue that its mode's policy would give it if it were
    perfectly fair at every step (``fair_now``)."""
    owed: dict[str, float] = field(default_factory=dict)
    """GPU-seconds per leaf queue of ``min(deserved, what it held and waited for)`` at
    each step: what it is owed whatever the others do."""
    placed: int = 0
    seconds: float = 0.0

    @property
    def available(self) -> float:
        return self.gpus * self.horizon

    @property
    def allocation(self) -> float:
        return sum(self.used.values()) / self.available if self.available else 0.0


# --- the workload -------------------------------------------------------------------------


def load_durations(path: Path) -> dict[str, float]:
    """Each task's run time in the trace (``deletion_time - scheduled_time``, seconds),
    for the tasks that have both columns and ran; {} when the file has no such columns."""
    out: dict[str, float] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            start, end = row.get("scheduled_time") or "", row.get("deletion_time") or ""
            if start and end and int(end) > int(start):
                out[row["name"]] = float(int(end) - int(start))
    return out


def pick_nodes(nodes: Sequence[Node], count: int, seed: int) -> list[Node]:
    """``count`` nodes drawn with the seed, in name order."""
    rng = random.Random(seed)
    chosen = rng.sample(list(nodes), min(count, len(nodes)))
    return sorted(chosen, key=lambda n: n.name)


def arrivals(pattern: str, count: int, horizon: float, rng: random.Random) -> list[float]:
    """``count`` arrival times in ``[0, horizon)`` by the tenant's pattern, sorted."""
    if pattern == "steady":
        out = [(i + rng.random()) / count * horizon for i in range(count)]
    else:
        lo, hi = (0.0, 0.15) if pattern == "early" else (0.40, 0.60)
        burst = round(0.7 * count)
        out = [rng.uniform(lo, hi) * horizon for _ in range(burst)]
        out += [rng.random() * horizon for _ in range(count - burst)]
    return sorted(out)


def _asked(gpus: Sequence[float], raw: Sequence[float], room: Sequence[float], f: float) -> float:
    return sum(g * min(d * f, r) for g, d, r in zip(gpus, raw, room, strict=True))


def scale(
    gpus: Sequence[float], raw: Sequence[float], room: Sequence[float], target: float
) -> float:
    """The factor on the durations ``raw`` that makes the GPU-time asked (each pod's
    work cut at the end of the run, ``room`` after it arrives) ``target``; where even
    pods that all run to the end ask less, the least factor that has them do so."""
    if sum(g * r for g, r in zip(gpus, room, strict=True)) <= target:
        return max((r / d for d, r in zip(raw, room, strict=True) if d > 0), default=1.0)
    top = 1.0
    while _asked(gpus, raw, room, top) < target and top < 1e9:
        top *= 2
    lo, hi = 0.0, top
    for _ in range(60):
        mid = (lo + hi) / 2
        if _asked(gpus, raw, room, mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


def workload(
    tasks: Sequence[Task],
    durations: Mapping[str, float],
    tenants: Sequence[Tenant],
    gpus: int,
    pods: int,
    horizon: float,
    seed: int,
    step: float,
) -> tuple[list[Offer], dict[str, float]]:
    """Every tenant's offers (see the module doc), by arrival, and the factor each
    tenant's durations were multiplied by."""
    rng = random.Random(seed)
    pool = [t for t in tasks if t.gpus > 0]
    known = sorted(durations[t.name] for t in pool if t.name in durations)
    if not known:  # no run times in the file: draw them (lognormal, median 10 min)
        known = sorted(rng.lognormvariate(math.log(600), 1.5) for _ in range(1000))
    offers: list[Offer] = []
    factors: dict[str, float] = {}
    for tenant in tenants:
        count = max(1, round(pods * tenant.pods))
        chosen = [rng.choice(pool) for _ in range(count)]
        raw = [durations.get(t.name) or rng.choice(known) for t in chosen]
        # on the step clock: a pod arriving between two steps is created at the next
        times = [
            min(math.ceil(a / step) * step, horizon - step)
            for a in arrivals(tenant.pattern, count, horizon, rng)
        ]
        room = [horizon - a for a in times]
        target = tenant.demand * tenant.deserved * gpus * horizon
        factor = scale([t.demand for t in chosen], raw, room, target)
        factors[tenant.name] = factor
        for task, d, a in zip(chosen, raw, times, strict=True):
            # on the step clock (so a pod holds its devices as long as it works), and
            # never past the end: one longer than the run is cut to it
            work = min(max(1, math.ceil(d * factor / step - EPS)) * step, horizon)
            offers.append(Offer(0, tenant.name, task, a, work))
    offers.sort(key=lambda o: (o.arrival, o.tenant))
    offers = [Offer(i, o.tenant, o.task, o.arrival, o.work) for i, o in enumerate(offers)]
    return offers, factors


def asked(offer: Offer, horizon: float) -> float:
    """GPU-seconds ``offer`` asks within the run."""
    return offer.gpus * max(0.0, min(offer.work, horizon - offer.arrival))


def queues(
    mode: Mode, tenants: Sequence[Tenant], gpus: int, covered: float = 1.0
) -> list[QueueSpec]:
    """The Volcano Queues of ``mode`` (shares of the cluster's cores); in the tree, each
    ``deserved`` is ``covered`` times the tenant's share (``--deserved``): what it leaves
    is divided by ``weight`` (with a memory of past use, moved by it)."""
    cores = 100.0 * gpus

    def of(share: float) -> dict[str, float]:
        return {"nvidia.cores": share * cores} if share > 0 else {}

    if mode == "proportion":
        return [
            QueueSpec(name=t.name, weight=t.deserved, guarantee=of(t.guarantee)) for t in tenants
        ]
    # ``weight`` divides the surplus above deserved with a memory of past use: as deserved
    out = [
        QueueSpec(name=p, weight=share, deserved=of(share * covered))
        for p, share in PARENTS.items()
    ]
    out += [
        QueueSpec(
            name=t.name,
            parent=t.parent,
            weight=t.deserved,
            deserved=of(t.deserved * covered),
            guarantee=of(t.guarantee),
        )
        for t in tenants
    ]
    return out


def fair_now(
    mode: Mode, tenants: Sequence[Tenant], gpus: float, wants: Mapping[str, float]
) -> dict[str, float]:
    """The GPUs each leaf queue would hold if ``gpus`` were shared perfectly fairly
    among what each queue holds and waits for now (``wants``): weighted water-filling by
    deserved share over the leaves (``proportion``), or over the parents and then over
    each parent's leaves (``capacity``). Guarantees are left out (no queue here asks
    less than its guarantee for long) and so is packing (a pod needs the right room)."""

    def fill(total: float, named: Sequence[tuple[str, float, float]]) -> dict[str, float]:
        shares = deserved(
            {"gpu": total},
            [QueueShare(name=n, weight=w, demand={"gpu": d}) for n, w, d in named],
        )
        return {n: v.get("gpu", 0.0) for n, v in shares.items()}

    if mode == "proportion":
        return fill(gpus, [(t.name, t.deserved, wants.get(t.name, 0.0)) for t in tenants])
    parents = fill(
        gpus,
        [
            (p, w, sum(wants.get(t.name, 0.0) for t in tenants if t.parent == p))
            for p, w in PARENTS.items()
        ],
    )
    out: dict[str, float] = {}
    for p, total in parents.items():
        kids = [(t.name, t.deserved, wants.get(t.name, 0.0)) for t in tenants if t.parent == p]
        out.update(fill(total, kids))
    return out


# --- the replay ---------------------------------------------------------------------------


class Replay:
    """One mode's simulated cluster: the coordinator's and the allocator's core state."""

    def __init__(
        self,
        mode: Mode,
        nodes: Sequence[Node],
        tenants: Sequence[Tenant],
        parsed: Mapping[str, tuple[PodRequest, PodSpec]],
        *,
        starvation_guard_s: float = 300.0,
        usage: UsageParams | None = None,
        covered: float = 1.0,
    ) -> None:
        self.mode = mode
        self.parsed = parsed
        remembers = UsageParams()  # kept, weighing nothing
        if mode == "capacity+usage":
            remembers = usage or UsageParams(weight=1.0)
        policy = Policy(
            queue_plugin="proportion" if mode == "proportion" else "capacity",
            starvation_guard_s=starvation_guard_s,
            usage=remembers,
        )
        self.gangs = Gangs(policy, SPLIT)
        self.ledger = Ledger(SPECS)
        for node in nodes:
            self.ledger.set_node(node.name, node.devices)
            self.ledger.set_spec(node.spec)
            self.gangs.set_node(node.name, tuple(node.devices))
        self.placer = Placer(self.ledger, PlacementConfig())
        self.room = Room(self.placer)
        self.gpus = sum(len(n.devices) for n in nodes)
        for q in queues(mode, tenants, self.gpus, covered):
            self.gangs.queues[q.name] = q
        self.jobs: dict[PodUID, Job] = {}
        """Jobs by the uid of their pod now (waiting or running)."""
        self.ends: list[tuple[float, int, PodUID]] = []
        """A heap of (when its work is done, order, pod) of running pods."""
        self.again: list[tuple[float, int, Job]] = []
        """A heap of (when, order, job) of evicted pods to create again."""
        self.order = 0
        self.in_use = 0.0
        self.held: dict[str, float] = {}
        """GPUs each queue's running pods hold now."""
        self.wanting: dict[str, float] = {}
        """GPUs each queue's waiting pods ask for now."""
        self.tenants = tuple(tenants)
        self.out = Outcome(mode, self.gpus, 0.0)

    # --- what happens to pods ------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        """Create the job's pod (again): a PodGroup of one in its tenant's queue."""
        offer = job.offer
        name = f"{offer.tenant}-{offer.index}-{job.attempt}"
        ref = PodRef(namespace=NAMESPACE, name=name, uid=PodUID(name))
        key = GangKey.of(ref, name)
        self.gangs.groups[key] = GroupSpec(queue=offer.tenant)
        request, _ = self.parsed[offer.task.name]
        member = Member(pod=ref, key=key, request=request, created_at=now, since=now)
        job.state, job.uid, job.ref, job.submitted = "waiting", ref.uid, ref, now
        self.jobs[ref.uid] = job
        self.wanting[offer.tenant] += offer.gpus
        self.gangs.pending(member)

    def start(self, job: Job, now: float) -> None:
        job.state, job.started = "running", now
        self.out.waits[job.offer.tenant].append(now - job.submitted)
        self.in_use += job.offer.gpus
        self.wanting[job.offer.tenant] -= job.offer.gpus
        self.held[job.offer.tenant] += job.offer.gpus
        self.out.peak = max(self.out.peak, self.in_use)
        self.order += 1
        heapq.heappush(self.ends, (now + job.left, self.order, job.uid))
        self.out.placed += 1

    def stop(self, job: Job, now: float, horizon: float) -> None:
        """The job's pod no longer runs (done or evicted): count what it held."""
        held = max(0.0, min(now, horizon) - job.started)
        self.out.used[job.offer.tenant] += job.offer.gpus * held
        self.in_use -= job.offer.gpus
        self.held[job.offer.tenant] -= job.offer.gpus
        job.left -= now - job.started
        del self.jobs[job.uid]
        self.gangs.groups.pop(GangKey(namespace=NAMESPACE, name=job.uid), None)

    def finish(self, job: Job, now: float, horizon: float) -> None:
        assert job.ref is not None
        self.placer.release(job.ref)
        self.gangs.forget(job.uid)
        self.stop(job, now, horizon)
        job.state = "done"
        self.gangs.helpful(node_changed=False)  # AllocationReleased

    def evict(self, uid: PodUID, now: float, horizon: float) -> None:
        """A victim is deleted: its devices stay booked for the gang it made room for
        (else released); its pod is created again later with the work it had left."""
        job = self.jobs.get(uid)
        if job is None or job.state != "running" or job.ref is None:
            return
        owner = self.room.gone(job.ref)
        if owner is None:
            self.placer.release(job.ref)
        self.gangs.forget(uid)
        self.stop(job, now, horizon)
        self.out.evictions[job.offer.tenant] += 1
        # its work ends on a step, and pods whose work ended left before the dispatch:
        # a victim always has work left
        job.state, job.attempt = "future", job.attempt + 1
        self.order += 1
        heapq.heappush(self.again, (now + RESUBMIT_S, self.order, job))
        if owner is not None and self.room.all_gone(owner):
            self.gangs.helpful(node_changed=False)  # AllocationReleased (kept for the gang)
        elif owner is None:
            self.gangs.helpful(node_changed=False)

    # --- the allocator -------------------------------------------------------------------

    def place(self, gang: ReadyGang, now: float, horizon: float) -> None:
        """Place ``gang`` as the allocator does, or make room for it."""
        members: list[GangMember] = []
        for m in gang.members:
            request, spec = self.parsed[self.jobs[m.pod.uid].offer.task.name]
            members.append(GangMember(pod=m.pod, request=request, group=gang.key, spec=spec))
        uids = [m.pod.uid for m in gang.members]
        key = gang.key
        if self.room.waiting(key, now):
            self.gangs.failed(uids, gang.attempt, unresolvable=False, now=now)
            return
        status = None
        for gm in members:
            checked = self.placer.check(gm.request)
            if not checked.ok:
                status = checked
                break
        if status is None:
            result = self.placer.place_gang(members, gang.min_member, owner=key)
            if result.ok:
                self.room.placed(key)
                for p in result.placed:
                    grant = self.ledger.pods[p.pod.uid]
                    self.gangs.decided(p.pod.uid, grant_vector(grant.containers))
                    self.gangs.bound_now(p.pod.uid, now)
                    self.start(self.jobs[p.pod.uid], now)
                return
            status = result.status if gang.min_member > 1 else result.failures[-1].status
        unplaced = Unplaced(
            key=key,
            members=members,
            min_member=gang.min_member,
            policies=tuple(m.preemption_policy for m in gang.members),
            victims=gang.victims,
            budgets=gang.budgets,
            hold=gang.hold,
            protected_s=gang.protected_s,
        )
        made = self.room.make_room(unplaced, status, now=now)
        self.gangs.failed(uids, gang.attempt, unresolvable=status.unresolvable, now=now)
        if made.preempting is not None:
            for victim in made.preempting.pods:
                self.evict(victim, now, horizon)

    # --- the clock -----------------------------------------------------------------------

    def run(self, offers: Sequence[Offer], horizon: float, step: float) -> Outcome:
        started = time.perf_counter()
        out = self.out
        out.horizon = horizon
        names = [t.name for t in self.tenants]
        names += sorted({o.tenant for o in offers} - set(names))
        for name in names:
            out.used[name], out.asked[name], out.waits[name] = 0.0, 0.0, []
            out.evictions[name], out.fair[name], out.owed[name] = 0, 0.0, 0.0
            self.held[name] = self.wanting[name] = 0.0
        jobs = [Job(o, o.work) for o in offers]
        for o in offers:
            out.asked[o.tenant] += asked(o, horizon)
        upcoming = iter(jobs)
        following = next(upcoming, None)
        steps = round(horizon / step)
        for k in range(steps + 1):
            now = k * step
            while self.ends and self.ends[0][0] <= now + EPS:
                _, _, uid = heapq.heappop(self.ends)
                job = self.jobs.get(uid)
                if job is not None and job.state == "running":
                    self.finish(job, now, horizon)
            if k == steps:
                break  # the end: no more placements
            while self.again and self.again[0][0] <= now + EPS:
                self.submit(heapq.heappop(self.again)[2], now)
            while following is not None and following.offer.arrival <= now + EPS:
                self.submit(following, now)
                following = next(upcoming, None)
            if k % max(1, round(USAGE_SAMPLE_S / step)) == 0:
                self.gangs.sample_usage(now)
            if self.room.lapsed(now).freed:
                self.gangs.helpful(node_changed=False)
            for gang in self.gangs.dispatch(now).ready:
                self.place(gang, now, horizon)
            assert self.in_use <= self.gpus + 1e-6, (self.in_use, self.gpus)
            wants = {q: self.held[q] + self.wanting[q] for q in self.held}
            for q, share in fair_now(self.mode, self.tenants, self.gpus, wants).items():
                out.fair[q] += share * step
            for t in self.tenants:
                out.owed[t.name] += min(t.deserved * self.gpus, wants[t.name]) * step
        end = steps * step
        # the ledger holds exactly the running pods, and the devices of evicted pods
        # kept for the gang they made room for
        running = {j.uid for j in jobs if j.state == "running"}
        kept = {uid for nom in self.room.nominations.values() for uid in nom.gone}
        assert running <= set(self.ledger.pods), "a running pod holds nothing"
        assert set(self.ledger.pods) - running <= kept, "a grant outlived its pod"
        for job in jobs:
            if job.state == "running":
                out.used[job.offer.tenant] += job.offer.gpus * (end - job.started)
            elif job.state == "waiting":
                out.waits[job.offer.tenant].append(end - job.submitted)
        for name in names:
            mine = [j for j in jobs if j.offer.tenant == name]
            out.states[name] = {
                s: sum(1 for j in mine if j.state == s)
                for s in ("done", "running", "waiting", "future")
            }
        out.seconds = time.perf_counter() - started
        return out


def replay(
    mode: Mode,
    nodes: Sequence[Node],
    offers: Sequence[Offer],
    tenants: Sequence[Tenant],
    horizon: float,
    step: float,
    parsed: Mapping[str, tuple[PodRequest, PodSpec]] | None = None,
    *,
    starvation_guard_s: float = 300.0,
    usage: UsageParams | None = None,
    covered: float = 1.0,
) -> Outcome:
    """Replay ``offers`` on ``nodes`` for ``horizon`` seconds in ``mode`` (``usage``: the
    memory of past use of ``capacity+usage``)."""
    if parsed is None:
        parser = RequestParser(SPECS)
        parsed = {o.task.name: parse(o.task, parser) for o in offers}
    sim = Replay(
        mode,
        nodes,
        tenants,
        parsed,
        starvation_guard_s=starvation_guard_s,
        usage=usage,
        covered=covered,
    )
    return sim.run(offers, horizon, step)


# --- the figures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One queue's figures in one mode (shares of the cluster's GPU-time)."""

    deserved: float
    demand: float
    fair: float
    """Its share were the mode's policy perfectly fair at every step (``fair_now``)."""
    owed: float
    """``min(deserved, what it held and waited for)`` at each step, over the run."""
    got: float
    waits: tuple[float, ...]
    still: int
    evictions: int

    @property
    def target(self) -> float:
        return min(self.deserved, self.demand)

    @property
    def gap(self) -> float:
        """``|got - min(deserved, demand)| / min(deserved, demand)``."""
        return abs(self.got - self.target) / self.target if self.target > EPS else 0.0

    @property
    def shortfall(self) -> float:
        """``max(0, owed - got) / owed``: how far it fell short of what it was owed."""
        return max(0.0, self.owed - self.got) / self.owed if self.owed > EPS else 0.0

    @property
    def fair_gap(self) -> float:
        """``|got - fair| / fair``."""
        return abs(self.got - self.fair) / self.fair if self.fair > EPS else 0.0


def rows(out: Outcome, tenants: Sequence[Tenant]) -> dict[str, Row]:
    """Figures per parent (its leaves summed), each followed by its leaves."""
    total = out.available
    leaf = {
        t.name: Row(
            deserved=t.deserved,
            demand=out.asked.get(t.name, 0.0) / total,
            fair=out.fair.get(t.name, 0.0) / total,
            owed=out.owed.get(t.name, 0.0) / total,
            got=out.used.get(t.name, 0.0) / total,
            waits=tuple(out.waits.get(t.name, ())),
            still=out.states.get(t.name, {}).get("waiting", 0)
            + out.states.get(t.name, {}).get("future", 0),
            evictions=out.evictions.get(t.name, 0),
        )
        for t in tenants
    }
    result: dict[str, Row] = {}
    for parent, share in PARENTS.items():
        kids = [leaf[t.name] for t in tenants if t.parent == parent]
        result[parent] = Row(
            deserved=share,
            demand=sum(k.demand for k in kids),
            fair=sum(k.fair for k in kids),
            owed=sum(k.owed for k in kids),
            got=sum(k.got for k in kids),
            waits=tuple(w for k in kids for w in k.waits),
            still=sum(k.still for k in kids),
            evictions=sum(k.evictions for k in kids),
        )
        for t in tenants:
            if t.parent == parent:
                result[t.name] = leaf[t.name]
    return result


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _min(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def table(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines


def report(outs: Sequence[Outcome], tenants: Sequence[Tenant]) -> list[str]:
    """The tables: the modes side by side, one table per figure, and a summary line each."""
    figures = {o.mode: rows(o, tenants) for o in outs}
    first = figures[outs[0].mode]
    label = {p: f"{p} (parent)" for p in PARENTS} | {t.name: f"- {t.name}" for t in tenants}
    lines = [
        "GPU-time shares over the run, of the cluster's (gap: |got - min| / min, "
        "min = min(deserved, demand)):",
        "",
    ]

    def side_by_side(
        shared: Sequence[str],
        own: Callable[[Row], list[str]],
        titles: Sequence[str],
        each: Callable[[Row], list[str]],
    ) -> list[str]:
        """One row per queue: its ``own`` cells under ``shared`` titles, then each mode's
        ``each`` cells under ``titles`` marked with the mode."""
        head = ["queue", *shared, *(f"{t} ({o.mode})" for o in outs for t in titles)]
        body = [
            [label[name], *own(r), *(c for o in outs for c in each(figures[o.mode][name]))]
            for name, r in first.items()
        ]
        return table(head, body)

    def waited(r: Row) -> list[str]:
        mean = sum(r.waits) / len(r.waits) if r.waits else 0.0
        return [_min(mean), _min(max(r.waits, default=0.0)), str(r.still)]

    lines += side_by_side(
        ["deserved", "demand", "min(deserved, demand)"],
        lambda r: [_pct(r.deserved), _pct(r.demand), _pct(r.target)],
        ["got", "gap"],
        lambda r: [_pct(r.got), f"{r.gap:.2f}"],
    )

    def section(title: str, titles: Sequence[str], each: Callable[[Row], list[str]]) -> None:
        """A paragraph, then the modes side by side under ``titles``."""
        lines.extend(["", title, ""])
        lines.extend(side_by_side([], lambda r: [], titles, each))

    section(
        "The same against the share fair at each step (fair: the mode's policy, "
        "water-filling what each queue held and waited for at that step, summed over "
        "the run; gap: |got - fair| / fair):",
        ["fair", "got", "gap"],
        lambda r: [_pct(r.fair), _pct(r.got), f"{r.fair_gap:.2f}"],
    )
    section(
        "The same against what each queue was owed whatever the others did (owed: "
        "min(deserved, what it held and waited for) at each step, summed over the run; "
        "short: max(0, owed - got) / owed; above owed, a queue used room others left):",
        ["owed", "got", "short"],
        lambda r: [_pct(r.owed), _pct(r.got), f"{r.shortfall:.2f}"],
    )
    section(
        "Time pods waited to be bound, in minutes (each creation and re-creation once; "
        "still waiting: pods not running at the end):",
        ["mean", "max", "still waiting"],
        waited,
    )
    lines += ["", "Evictions (pods of the queue evicted, each re-created with its work left):", ""]
    head = ["queue", *(o.mode for o in outs)]
    body = [[label[n], *(str(figures[o.mode][n].evictions) for o in outs)] for n in first]
    body.append(["total", *(str(sum(o.evictions.values())) for o in outs)])
    lines += table(head, body)
    lines += ["", "The cluster:", ""]
    head = ["", *(o.mode for o in outs)]
    body = [
        ["GPU allocation (GPU-time held / available)", *(_pct(o.allocation) for o in outs)],
        ["most GPUs held at once", *(f"{o.peak:.1f} of {o.gpus}" for o in outs)],
        ["pods placed (re-creations included)", *(str(o.placed) for o in outs)],
        ["replay time", *(f"{o.seconds:.1f} s" for o in outs)],
    ]
    lines += table(head, body)
    lines.append("")
    pair = next(
        (
            (b.name, s.name)
            for b in tenants
            for s in tenants
            if b.pattern == "early" and s.pattern == "steady" and b.parent == s.parent
        ),
        None,
    )
    for o in outs:
        leaves = [figures[o.mode][t.name] for t in tenants]
        line = (
            f"{o.mode}: max relative gap {max(r.gap for r in leaves):.2f} "
            f"(to the fair share at each step {max(r.fair_gap for r in leaves):.2f}; "
            f"short of owed at most {max(r.shortfall for r in leaves):.2f}), "
            f"evictions {sum(o.evictions.values())}, allocation {_pct(o.allocation)}"
        )
        if pair is not None:  # the bursty and the steady tenant of one parent
            bursty, steady = (figures[o.mode][n].got for n in pair)
            line += f", {pair[0]} - {pair[1]} {(bursty - steady) * 100:.1f} points"
        lines.append(line)
    return lines


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=None, help="GPU nodes drawn (80)")
    parser.add_argument("--pods", type=int, default=None, help="GPU tasks offered (2000)")
    parser.add_argument("--hours", type=float, default=None, help="the run's length (3)")
    parser.add_argument("--step", type=float, default=10.0, help="seconds per step")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--starvation-guard", type=float, default=300.0, help="scheduler.starvationGuardS"
    )
    parser.add_argument(
        "--usage-weight", type=float, default=1.0, help="capacity+usage: scheduler.usage.weight"
    )
    parser.add_argument(
        "--deserved",
        type=float,
        default=1.0,
        help="the part of each tenant's share the tree's deserved covers (1: all)",
    )
    parser.add_argument(
        "--half-life", type=float, default=3600.0, help="capacity+usage: usage.halfLifeS"
    )
    parser.add_argument("--pod-list", type=Path, default=TRACE / "openb_pod_list_default.csv")
    parser.add_argument("--node-list", type=Path, default=TRACE / "openb_node_list_gpu_node.csv")
    parser.add_argument(
        "--quick", action="store_true", help="24 nodes, 500 pods, 2 hours (seconds)"
    )
    args = parser.parse_args()
    count = args.nodes or (24 if args.quick else 80)
    pods = args.pods or (500 if args.quick else 2000)
    hours = args.hours or (2.0 if args.quick else 3.0)
    horizon = hours * 3600
    if args.step <= 0 or abs(horizon / args.step - round(horizon / args.step)) > 1e-9:
        raise SystemExit("--step must divide the run (--hours) into whole steps")
    print("$ " + shlex.join(["python", *sys.orig_argv[1:]]))
    print(f"seed {args.seed}\n", flush=True)
    wall = time.perf_counter()
    nodes = pick_nodes(load_nodes(args.node_list), count, args.seed)
    gpus = sum(len(n.devices) for n in nodes)
    tasks = load_tasks(args.pod_list)
    offers, factors = workload(
        tasks, load_durations(args.pod_list), TENANTS, gpus, pods, horizon, args.seed, args.step
    )
    request_parser = RequestParser(SPECS)
    parsed = {o.task.name: parse(o.task, request_parser) for o in offers}
    models: dict[str, int] = {}
    for n in nodes:
        models[n.devices[0].model] = models.get(n.devices[0].model, 0) + len(n.devices)
    covers = f"; the tree's deserved covers {args.deserved:g} of each share"
    print(
        f"{len(nodes)} nodes of {args.node_list.name} ({gpus} GPUs: "
        + ", ".join(f"{m} {c}" for m, c in sorted(models.items()))
        + f"), {len(offers)} GPU tasks of {args.pod_list.name}, {hours:g} h in "
        f"{args.step:g} s steps; starvation guard {args.starvation_guard:g} s"
        + (covers if args.deserved != 1 else "")
        + ".\n"
    )
    body = []
    for t in TENANTS:
        mine = [o for o in offers if o.tenant == t.name]
        works = sorted(o.work for o in mine)
        body.append(
            [
                t.name,
                t.parent,
                _pct(t.deserved),
                _pct(t.guarantee) if t.guarantee else "",
                f"{sum(asked(o, horizon) for o in mine) / (t.deserved * gpus * horizon):.2f}x",
                str(len(mine)),
                f"{sum(o.gpus for o in mine) / max(len(mine), 1):.2f}",
                _min(works[len(works) // 2] if works else 0.0),
                _min(sum(works) / max(len(works), 1)),
                f"{factors[t.name]:.2f}",
                PATTERNS[t.pattern],
            ]
        )
    head = [
        "tenant",
        "parent",
        "deserved",
        "guarantee",
        "asks (x its deserved GPU-time)",
        "pods",
        "GPUs per pod",
        "median run (min)",
        "mean run (min)",
        "x trace run times",
        "arrivals",
    ]
    for line in table(head, body):
        print(line)
    print(flush=True)
    outs = []
    for mode in MODES:
        out = replay(
            mode,
            nodes,
            offers,
            TENANTS,
            horizon,
            args.step,
            parsed,
            starvation_guard_s=args.starvation_guard,
            covered=args.deserved,
            usage=UsageParams(weight=args.usage_weight, half_life_s=args.half_life),
        )
        print(f"{mode}: replayed in {out.seconds:.1f} s", flush=True)
        outs.append(out)
    print()
    for line in report(outs, TENANTS):
        print(line)
    print(f"\nTotal wall time {time.perf_counter() - wall:.0f} s.")


if __name__ == "__main__":
    main()
