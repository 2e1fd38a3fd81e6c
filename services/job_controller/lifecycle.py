"""A Volcano Job's life as Volcano's job controller leads it, as pure functions: what
the action that answers an event (services/job_controller/policies.py) does in each
phase of the Job: the pods to kill and to create, the status to write
(services/job_controller/status.py).

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
(Completed, Failed, Terminated, Aborted) kills what still runs on every event.
services/job_controller/runner.py does the I/O each :class:`Plan` asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from services.job_controller.podview import POD_PHASES, PodView
from services.job_controller.policies import SYNC, TARGETED, Decision
from services.job_controller.status import Status
from shared.core import vcjob


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
ENDINGS = {
    "AbortJob": ("Aborting", "Aborted"),
    "CompleteJob": ("Completing", "Completed"),
    "TerminateJob": ("Terminating", "Terminated"),
}
"""The actions that end a Job with a soft kill: the phase while its pods go, and the
phase once none is alive."""
ENDED = dict(ENDINGS.values())
"""The phase a Job ending in one phase reaches once none of its pods is alive."""


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
        if action in ENDINGS:
            return _kill_job(job, status, pods, SOFT, to(ENDINGS[action][0]))
        advance = _pending if phase == "Pending" else _running
        return _sync(name, job, status, pods, now, lambda s: advance(job, s, now))
    if phase == "Restarting":
        if action == SYNC:
            return _sync(name, job, status, pods, now, restarting)
        if action in TARGETED:
            return _kill_target(job, status, pods, decision, restarting)
        return _kill_job(job, status, pods, frozenset(), restarting)
    if phase in ("Aborting", "Aborted") and action == "ResumeJob":
        return _kill_job(job, status, pods, SOFT, to("Restarting", retry=True))
    if phase in ENDED:
        return _kill_job(job, status, pods, SOFT, finished(ENDED[phase]))
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
        part = task.partition(target.index) if task is not None and target is not None else None
        if task is None or target is None or part is None:
            chosen = []  # no partitions: Volcano skips it
        else:
            mates = (p for p in pods.values() if p.task == target.task)
            chosen = [p for p in mates if task.partition(p.index) == part]
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
