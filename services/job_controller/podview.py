"""A Volcano Job's pods as the controller reads them: the labels and annotations
Volcano's controller writes on each (services/job_controller/pods.py writes them here)
and :class:`PodView`, what of a pod decides the Job's events and counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JOB_NAME = "volcano.sh/job-name"
JOB_NAMESPACE = "volcano.sh/job-namespace"
TASK_SPEC = "volcano.sh/task-spec"
TASK_INDEX = "volcano.sh/task-index"
PARTITION_ID = "volcano.sh/partition-id"
"""Its partition (index // partitionSize) in a task with ``partitionPolicy``: a label."""
QUEUE_NAME = "volcano.sh/queue-name"
JOB_VERSION = "volcano.sh/job-version"
RETRY_COUNT = "volcano.sh/job-retry-count"
TEMPLATE_KEY = "volcano.sh/template-uid"
OUT_OF_SYNC = "volcano.sh/controller-out-of-sync"
"""Marks a pod the controller is about to delete: its end is no event of the Job."""

POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


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
