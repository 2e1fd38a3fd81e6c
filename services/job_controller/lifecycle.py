"""A Volcano Job's life as Volcano's job controller leads it, as pure functions: which
event a pod's change is, which action answers it, and what that action does in each
phase of the Job (the pods to kill and to create, the status to write).

The phases and what moves a Job between them (``pkg/controllers/job/state`` upstream)::

    Pending ──minAvailable running or done──▶ Running ──all done, or minSuccess──▶ Completed|Failed
       ▲                                         │ RestartJob, RestartTask, RestartPod
       └──── enough old pods gone ──── Restarting ◀┘ (retryCount + 1)
                                           └── retryCount reaches maxRetry ──▶ Failed
    Pending|Running ──AbortJob──▶ Aborting ──no pod alive──▶ Aborted ──ResumeJob──▶ Restarting
                    ──CompleteJob──▶ Completing ──no pod alive──▶ Completed
                    ──TerminateJob──▶ Terminating ──no pod alive──▶ Terminated

``SyncJob`` (every event no policy answers) creates the pods a Job lacks (a task with
``dependsOn`` only once the tasks it depends on are ready), deletes the ones it has too
many of, and recounts; ``KillJob`` deletes every pod but the finished ones where the
kill is soft (abort, complete, terminate; and any kill at the last retry), bumps
``version`` and takes the PodGroup and the plugins' objects down. A finished Job
(Completed, Failed, Terminated, Aborted) kills what still runs on every event. The
service (services/job_controller/service.py) does the I/O each :class:`Plan` asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shared.core import vcjob

# --- a Job's pods ------------------------------------------------------------------------

JOB_NAME = "volcano.sh/job-name"
JOB_NAMESPACE = "volcano.sh/job-namespace"
TASK_SPEC = "volcano.sh/task-spec"
TASK_INDEX = "volcano.sh/task-index"
QUEUE_NAME = "volcano.sh/queue-name"
JOB_VERSION = "volcano.sh/job-version"
RETRY_COUNT = "volcano.sh/job-retry-count"
TEMPLATE_KEY = "volcano.sh/template-uid"
OUT_OF_SYNC = "volcano.sh/controller-out-of-sync"
"""Marks a pod the controller is about to delete: its end is no event of the Job."""

POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
FINISHED = frozenset({"Completed", "Failed", "Terminated", "Aborted"})
"""Phases a Job stays in (Aborted until ``ResumeJob``)."""
TTL_PHASES = frozenset({"Completed", "Failed", "Terminated"})
"""Phases ``ttlSecondsAfterFinished`` counts from, as Volcano's garbage collector."""
INVALID = "InvalidJob"
"""``state.reason`` of a Job that breaks Volcano's rules: never acted on."""
INTERNAL_EVENTS = frozenset({"OutOfSync", "PodRunning", "CommandIssued"})
SYNC = "SyncJob"
TARGETED = frozenset({"RestartTask", "RestartPod", "RestartPartition"})
JOB_ACTIONS = frozenset({"AbortJob", "RestartJob", "TerminateJob", "CompleteJob", "ResumeJob"})


@dataclass(frozen=True)
class PodView:
    """What the controller reads of one of its Jobs' pods."""

    namespace: str
    name: str
    uid: str
    job: str
    job_uid: str
    task: str
    index: int
    version: int
    phase: str
    deleting: bool = False
    out_of_sync: bool = False
    ready: bool = False
    """Every container ready (what ``dependsOn`` waits for on a running pod)."""
    restarts: int = 0
    """Container restarts, init containers included (``TaskFailed`` counts them)."""
    exit_code: int | None = None
    """The first container's exit code once it terminated."""
    unschedulable: bool = False
    """``PodScheduled`` is False: the scheduler could not place it."""


def read_pod(obj: Mapping[str, Any]) -> PodView | None:
    """A pod as :class:`PodView`; None when no Volcano Job controls it (its controller
    owner and the annotations the controller writes)."""
    meta = obj.get("metadata") or {}
    owner = next(
        (
            o
            for o in meta.get("ownerReferences") or ()
            if o.get("controller")
            and o.get("kind") == "Job"
            and str(o.get("apiVersion", "")).startswith("batch.volcano.sh/")
        ),
        None,
    )
    annotations = meta.get("annotations") or {}
    if owner is None or TASK_SPEC not in annotations or JOB_NAME not in annotations:
        return None
    status = obj.get("status") or {}
    containers = status.get("containerStatuses") or []
    exit_code = None
    if containers:
        terminated = (containers[0].get("state") or {}).get("terminated")
        if terminated is not None:
            exit_code = int(terminated.get("exitCode", 0))
    every = [*(status.get("initContainerStatuses") or []), *containers]
    unschedulable = any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in status.get("conditions") or ()
    )
    return PodView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        job=str(annotations[JOB_NAME]),
        job_uid=str(owner.get("uid", "")),
        task=str(annotations[TASK_SPEC]),
        index=_digits(annotations.get(TASK_INDEX, "")),
        version=_digits(annotations.get(JOB_VERSION, "0")),
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        out_of_sync=OUT_OF_SYNC in annotations,
        ready=bool(containers) and all(c.get("ready") for c in containers),
        restarts=sum(int(c.get("restartCount", 0)) for c in every),
        exit_code=exit_code,
        unschedulable=unschedulable,
    )


def _digits(text: object) -> int:
    return int(text) if isinstance(text, str) and text.isdigit() else 0


# --- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """Something happened to a Job (Volcano's request): an event, and the pod it came
    from when a pod's change is the cause."""

    event: str
    pod: str = ""
    pod_uid: str = ""
    task: str = ""
    exit_code: int | None = None
    version: int = 0
    """The Job version the pod was made for (an older one's events only sync)."""
    job_uid: str = ""


def pod_event(
    job: vcjob.JobSpec, old: PodView | None, new: PodView | None, pods: Mapping[str, PodView]
) -> Request:
    """The event a pod's change is (Volcano's pod handlers): ``PodPending`` when it
    appears, ``PodFailed`` (with its exit code), ``TaskCompleted`` when it succeeds and
    with it its whole task, ``PodRunning``, ``TaskFailed`` when its task's running pods
    restarted ``maxRetry`` times, ``PodEvicted`` when it is deleted; a pod the controller
    deletes itself only syncs (``OutOfSync``). ``pods``: the Job's pods after the change."""
    pod = new or old
    assert pod is not None
    base = Request("OutOfSync", pod.name, pod.uid, pod.task, None, pod.version, pod.job_uid)
    if pod.out_of_sync:
        return base
    if new is None:
        return replace(base, event="PodEvicted")
    if old is None:
        return replace(base, event="PodPending")
    if new.phase == "Failed" and old.phase != "Failed":
        return replace(base, event="PodFailed", exit_code=new.exit_code)
    if new.phase == "Succeeded" and old.phase != "Succeeded":
        task = job.task(new.task)
        done = sum(1 for p in pods.values() if p.task == new.task and p.phase == "Succeeded")
        if task is not None and task.replicas > 0 and done >= task.replicas:
            return replace(base, event="TaskCompleted")
        return base
    if new.phase in ("Running", "Pending"):
        event = "TaskFailed" if task_failed(job, new.task, pods) else "OutOfSync"
        if old.phase != new.phase:
            event = "PodRunning" if new.phase == "Running" else "PodPending"
        return replace(base, event=event)
    return base


def task_failed(job: vcjob.JobSpec, task: str, pods: Mapping[str, PodView]) -> bool:
    """``TaskFailed``: the task's pending and running pods restarted their containers
    ``maxRetry`` times in all (restartPolicy OnFailure or Always restarts in place)."""
    spec = job.task(task)
    if spec is None or spec.replicas == 0:
        return False
    restarts = sum(
        p.restarts for p in pods.values() if p.task == task and p.phase in ("Pending", "Running")
    )
    return restarts >= spec.max_retry


def gang_broken(pods: Mapping[str, PodView]) -> bool:
    """Volcano's PodGroup ``Unknown``: some pods run while another cannot be placed
    (the scheduler said so on it: ``PodScheduled`` False)."""
    live = [p for p in pods.values() if not p.deleting]
    return any(p.phase == "Running" for p in live) and any(
        p.unschedulable and p.phase == "Pending" for p in live
    )


@dataclass(frozen=True)
class Decision:
    """What a request comes to: ``action`` now, or after ``delay_s``."""

    action: str
    delay_s: float = 0.0
    event: str = ""
    task: str = ""
    pod: str = ""
    pod_uid: str = ""


def decide(job: vcjob.JobSpec, job_uid: str, version: int, req: Request) -> Decision:
    """Volcano's applyPolicies: internal events, a pod of another Job of the same name
    and a pod of an older version of the Job only sync; otherwise the policy that
    answers the event (or exit code) acts, else the Job syncs."""
    sync = Decision(SYNC, 0.0, req.event, req.task, req.pod, req.pod_uid)
    if req.event in INTERNAL_EVENTS:
        return sync
    if req.job_uid and req.job_uid != job_uid:
        return sync
    if req.pod and req.version < version:
        return sync
    policy = vcjob.answer(job, req.event, req.task, req.exit_code)
    if policy is None:
        return sync
    return replace(sync, action=policy.action, delay_s=policy.timeout_s or 0.0)


Scope = Literal["job", "task", "pod", "partition"]


def scope(action: str) -> Scope:
    """What an action acts on (Volcano's action types): a delayed action cancels
    the others of its scope once one runs."""
    if action == "RestartTask":
        return "task"
    if action == "RestartPod":
        return "pod"
    if action == "RestartPartition":
        return "partition"
    return "job"


# --- status ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """A Job's status as Volcano writes it (``status`` of the Job)."""

    phase: str = ""
    reason: str = ""
    message: str = ""
    since: str = ""
    """``state.lastTransitionTime``: when it entered ``phase``."""
    min_available: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    terminating: int = 0
    unknown: int = 0
    version: int = 0
    retry_count: int = 0
    tasks: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """``taskStatusCount``: per task, its pods by phase."""
    conditions: tuple[Mapping[str, str], ...] = ()
    """One per phase the Job has been in, the latest last (Volcano keeps one per phase)."""
    controlled: Mapping[str, str] = field(default_factory=dict)
    """``controlledResources``: what the controller made for it (``plugin-ssh``...)."""

    @property
    def alive(self) -> int:
        return self.terminating + self.pending + self.running

    def entered(self, phase: str, now: str, reason: str = "", message: str = "") -> Status:
        """The status once the Job enters ``phase`` at ``now``."""
        condition = {"status": phase, "lastTransitionTime": now}
        if reason:
            condition |= {"reason": reason, "message": message}
        kept = tuple(c for c in self.conditions if c.get("status") != phase)
        return replace(
            self,
            phase=phase,
            reason=reason,
            message=message,
            since=now,
            conditions=(*kept, condition),
        )

    def to_api(self) -> dict[str, Any]:
        """The ``status`` object (counts of 0 left out, as Volcano's omitempty)."""
        state: dict[str, Any] = {"phase": self.phase}
        if self.reason:
            state |= {"reason": self.reason, "message": self.message}
        if self.since:
            state["lastTransitionTime"] = self.since
        out: dict[str, Any] = {"state": state}
        counts = {
            "minAvailable": self.min_available,
            "pending": self.pending,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "terminating": self.terminating,
            "unknown": self.unknown,
            "version": self.version,
            "retryCount": self.retry_count,
        }
        out |= {k: v for k, v in counts.items() if v}
        if self.tasks:
            out["taskStatusCount"] = {t: {"phase": dict(c)} for t, c in self.tasks.items()}
        if self.conditions:
            out["conditions"] = [dict(c) for c in self.conditions]
        if self.controlled:
            out["controlledResources"] = dict(self.controlled)
        return out


def read_status(raw: Mapping[str, Any] | None) -> Status:
    """A Job's ``status`` as written (by Volcano or by Tessera)."""
    raw = raw or {}
    state = raw.get("state") or {}

    def count(key: str) -> int:
        value = raw.get(key, 0)
        return value if isinstance(value, int) else 0

    tasks = {
        str(t): {str(p): int(n) for p, n in ((c or {}).get("phase") or {}).items() if n}
        for t, c in (raw.get("taskStatusCount") or {}).items()
    }
    return Status(
        phase=str(state.get("phase") or ""),
        reason=str(state.get("reason") or ""),
        message=str(state.get("message") or ""),
        since=str(state.get("lastTransitionTime") or ""),
        min_available=count("minAvailable"),
        pending=count("pending"),
        running=count("running"),
        succeeded=count("succeeded"),
        failed=count("failed"),
        terminating=count("terminating"),
        unknown=count("unknown"),
        version=count("version"),
        retry_count=count("retryCount"),
        tasks=tasks,
        conditions=tuple(dict(c) for c in raw.get("conditions") or () if isinstance(c, dict)),
        controlled={str(k): str(v) for k, v in (raw.get("controlledResources") or {}).items()},
    )


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: keys gone are
    written as null (a count back to 0, a task's phase no pod is in any more)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one action does: pods to kill (marked out of sync, then deleted), pods to
    create (task, index), and the Job's status after it."""

    status: Status
    kill: tuple[str, ...] = ()
    create: tuple[tuple[str, int], ...] = ()
    setup: bool = False
    """Make what the Job needs before its pods (PodGroup, the plugins' objects)."""
    teardown: bool = False
    """Take the PodGroup and the plugins' objects down (a whole-Job kill)."""


SOFT = frozenset({"Succeeded", "Failed"})
"""The pod phases a soft kill keeps."""
Update = Callable[[Status], Status | None] | None
"""How an action changes the status it counted: the status after, None when unchanged
(``Update`` None: the phase stays whatever the counts)."""


def step(
    name: str,
    job: vcjob.JobSpec,
    status: Status,
    pods: Mapping[str, PodView],
    decision: Decision,
    now: str,
) -> Plan:
    """What ``decision.action`` does to the Job ``name`` in its current phase (Volcano's
    state machine: ``pkg/controllers/job/state``). ``pods``: the Job's pods by name."""
    phase, action = status.phase or "Pending", decision.action

    def to(target: str, retry: bool = False) -> Callable[[Status], Status | None]:
        def update(s: Status) -> Status | None:
            s = replace(s, retry_count=s.retry_count + 1) if retry else s
            return s.entered(target, now)

        return update

    def finished(target: str) -> Callable[[Status], Status | None]:
        def update(s: Status) -> Status | None:
            return None if s.alive else s.entered(target, now)

        return update

    def restarting(s: Status) -> Status | None:
        if s.retry_count >= job.max_retry:
            return s.entered("Failed", now)
        if job.replicas - s.terminating >= s.min_available:
            return s.entered("Pending", now)
        return None

    if phase in ("Pending", "Running"):
        if action == "RestartJob":
            return _kill_job(job, status, pods, frozenset(), to("Restarting", retry=True))
        if action in TARGETED:
            return _kill_target(job, status, pods, decision, to("Restarting", retry=True))
        if action == "AbortJob":
            return _kill_job(job, status, pods, SOFT, to("Aborting"))
        if action == "CompleteJob":
            return _kill_job(job, status, pods, SOFT, to("Completing"))
        if action == "TerminateJob":
            return _kill_job(job, status, pods, SOFT, to("Terminating"))
        if phase == "Pending":
            return _sync(name, job, status, pods, now, lambda s: _pending(job, s, now))
        return _sync(name, job, status, pods, now, lambda s: _running(job, s, now))
    if phase == "Restarting":
        if action == SYNC:
            return _sync(name, job, status, pods, now, restarting)
        if action in TARGETED:
            return _kill_target(job, status, pods, decision, restarting)
        return _kill_job(job, status, pods, frozenset(), restarting)
    if phase in ("Aborting", "Aborted") and action == "ResumeJob":
        return _kill_job(job, status, pods, SOFT, to("Restarting", retry=True))
    if phase == "Aborting":
        return _kill_job(job, status, pods, SOFT, finished("Aborted"))
    if phase == "Completing":
        return _kill_job(job, status, pods, SOFT, finished("Completed"))
    if phase == "Terminating":
        return _kill_job(job, status, pods, SOFT, finished("Terminated"))
    return _kill_job(job, status, pods, SOFT, None)  # Aborted, Completed, Failed, Terminated


def _pending(job: vcjob.JobSpec, s: Status, now: str) -> Status | None:
    if job.min_available <= s.running + s.succeeded + s.failed:
        return s.entered("Running", now)
    return None


def _running(job: vcjob.JobSpec, s: Status, now: str) -> Status | None:
    """Volcano's running state: done when minSuccess pods succeeded, or once every pod
    finished (Completed if the Job's and each task's minAvailable succeeded, and
    minSuccess, else Failed); back to Pending when too many pods wait."""
    replicas = job.replicas
    if replicas == 0:
        return None  # scaled to zero: the phase stays
    if job.min_success is not None and s.succeeded >= job.min_success:
        return s.entered("Completed", now)
    if s.succeeded + s.failed == replicas:
        if job.min_available >= job.task_min_available:
            for task in job.tasks:
                counted = s.tasks.get(task.name)
                if counted is not None and counted.get("Succeeded", 0) < task.min_available:
                    return s.entered("Failed", now)
        if job.min_success is not None and s.succeeded < job.min_success:
            return s.entered("Failed", now)
        return s.entered("Completed" if s.succeeded >= job.min_available else "Failed", now)
    if s.pending > replicas - job.min_available:
        return s.entered("Pending", now)
    return None


def _counted(status: Status, pods: Mapping[str, PodView], dying: set[str]) -> Status:
    """``status`` with the counts of ``pods``: a pod being deleted (or in ``dying``)
    is terminating, the others count by phase, per task too."""
    by_phase = dict.fromkeys(POD_PHASES, 0)
    tasks: dict[str, dict[str, int]] = {}
    terminating = 0
    for pod in pods.values():
        if pod.deleting or pod.name in dying:
            terminating += 1
            continue
        phase = pod.phase if pod.phase in by_phase else "Unknown"
        by_phase[phase] += 1
        per = tasks.setdefault(pod.task, {})
        per[phase] = per.get(phase, 0) + 1
    return replace(
        status,
        pending=by_phase["Pending"],
        running=by_phase["Running"],
        succeeded=by_phase["Succeeded"],
        failed=by_phase["Failed"],
        unknown=by_phase["Unknown"],
        terminating=terminating,
        tasks=tasks,
    )


def _apply(status: Status, update: Update) -> Status:
    if update is None:
        return status
    after = update(status)
    return status if after is None else after


def _kill_job(
    job: vcjob.JobSpec,
    status: Status,
    pods: Mapping[str, PodView],
    keep: frozenset[str],
    update: Update,
) -> Plan:
    """Volcano's KillJob: a new version; every pod but those in a ``keep`` phase is
    deleted (the finished ones are kept at the last retry, whatever ``keep``); the
    PodGroup and the plugins' objects go. The kept pods are counted (Volcano forgets
    them: volcano-sh/volcano#4616)."""
    if status.retry_count >= job.max_retry - 1:
        keep = SOFT
    kill = sorted(p.name for p in pods.values() if not p.deleting and p.phase not in keep)
    counted = _counted(replace(status, version=status.version + 1), pods, set(kill))
    return Plan(status=_apply(counted, update), kill=tuple(kill), teardown=True)


def _kill_target(
    job: vcjob.JobSpec,
    status: Status,
    pods: Mapping[str, PodView],
    decision: Decision,
    update: Update,
) -> Plan:
    """Volcano's KillTarget: the pods of one task (``RestartTask``), one pod
    (``RestartPod``) or one partition of a task (``RestartPartition``); the PodGroup
    stays."""
    target = pods.get(decision.pod)
    if decision.action == "RestartTask":
        chosen = [p for p in pods.values() if p.task == decision.task]
    elif decision.action == "RestartPod":
        chosen = [target] if target is not None else []
    else:
        task = job.task(decision.task)
        size = task.partition_size if task is not None else 0
        if target is None or size <= 0:
            chosen = []  # no partitions: Volcano skips it
        else:
            part = target.index // size
            chosen = [p for p in pods.values() if p.task == target.task and p.index // size == part]
    kill = sorted(p.name for p in chosen if not p.deleting)
    counted = _counted(status, pods, set(kill))
    return Plan(status=_apply(counted, update), kill=tuple(kill))


def _sync(
    name: str,
    job: vcjob.JobSpec,
    status: Status,
    pods: Mapping[str, PodView],
    now: str,
    update: Update,
) -> Plan:
    """Volcano's SyncJob: the PodGroup and plugins' objects made, each missing pod
    created (a task waits for the tasks it ``dependsOn``), out-of-sync pods and pods
    beyond the replicas deleted, the pods counted."""
    if not status.phase:
        status = status.entered("Pending", now)
    status = replace(status, min_available=job.min_available)
    wanted = {t.pod_name(name, i): (t.name, i) for t in job.tasks for i in range(t.replicas)}
    kill = sorted(
        p.name for p in pods.values() if not p.deleting and (p.out_of_sync or p.name not in wanted)
    )
    create = []
    for task in job.tasks:
        missing = [i for i in range(task.replicas) if task.pod_name(name, i) not in pods]
        if missing and dependencies_ready(name, job, task, pods):
            create += [(task.name, i) for i in missing]
    counted = _counted(status, {**pods, **_created(name, job, create)}, set(kill))
    return Plan(status=_apply(counted, update), kill=tuple(kill), create=tuple(create), setup=True)


def _created(name: str, job: vcjob.JobSpec, create: list[tuple[str, int]]) -> dict[str, PodView]:
    """The pods about to be created, as they will count: pending."""
    out = {}
    for task, index in create:
        pod = vcjob.pod_name(name, task, index)
        out[pod] = PodView("", pod, "", name, "", task, index, version=0, phase="Pending")
    return out


def dependencies_ready(
    name: str, job: vcjob.JobSpec, task: vcjob.Task, pods: Mapping[str, PodView]
) -> bool:
    """May ``task``'s pods be created? Only once the tasks it ``dependsOn`` are ready:
    each (or, with ``iteration: any`` and several, one) has ``minAvailable`` pods that
    succeeded or run with every container ready (Volcano's waitDependsOnTaskMeetCondition)."""
    if not task.depends_on:
        return True

    def ready(dependency: str) -> bool:
        spec = job.task(dependency)
        if spec is None:
            return False
        count = 0
        for i in range(spec.replicas):
            pod = pods.get(spec.pod_name(name, i))
            if pod is None or pod.deleting:
                continue
            if pod.phase == "Succeeded" or (pod.phase == "Running" and pod.ready):
                count += 1
        return count >= spec.min_available

    if task.any_dependency and len(task.depends_on) > 1:
        return any(ready(d) for d in task.depends_on)
    return all(ready(d) for d in task.depends_on)
