"""What happens to a Volcano Job and which action answers it, as pure functions: the
event a pod's change is (Volcano's pod handlers), the policy that answers it
(``applyPolicies``), and what a delayed action cancels once another runs. What the
action then does to the Job is services/job_controller/lifecycle.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from services.job_controller.podview import PodView
from shared.core import vcjob

INTERNAL_EVENTS = frozenset({"OutOfSync", "PodRunning", "CommandIssued"})
"""Events no policy answers: they only sync the Job."""
SYNC = "SyncJob"
TARGETED = frozenset({"RestartTask", "RestartPod", "RestartPartition"})
"""Actions that restart part of a Job (Volcano's KillTarget), not all of it."""


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
