"""The pods of a Volcano Job as Volcano's controller makes them (``createJobPod``): pod
``<job>-<task>-<index>`` from its task's template, with Volcano's labels and
annotations (services/job_controller/podview.py reads them back), the Job's scheduler
name, priority class and volumes, what the Job's metadata passes on, and what each of
its plugins adds (services/job_controller/plugins/).
"""

from __future__ import annotations

import copy
from typing import Any

from services.job_controller import plugins
from services.job_controller import podview as pv
from services.job_controller.made import JobRef, claim_name
from services.job_controller.plugins.common import PodDraft, add_mount
from services.job_controller.status import Status
from shared.core import vcjob
from shared.core.request import GROUP_NAME

NUMA_POLICY = "volcano.sh/numa-topology-policy"
FROM_JOB = (
    "volcano.sh/preemptable",
    "volcano.sh/cooldown-time",
    "volcano.sh/revocable-zone",
    "volcano.sh/jdb-min-available",
    "volcano.sh/jdb-max-unavailable",
)
"""Annotations a Job passes to its pods (the last two: only one, min-available first);
the first two as labels too."""


def pod(
    ref: JobRef, job: vcjob.JobSpec, task: vcjob.Task, index: int, status: Status
) -> dict[str, Any]:
    """The pod ``<job>-<task>-<index>`` from its task's template, with Volcano's labels
    and annotations, the Job's scheduler name, priority class and volumes, and what
    each plugin adds."""
    template = copy.deepcopy(dict(task.template))
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    name = task.pod_name(ref.name, index)
    labels = {
        **(meta.get("labels") or {}),
        pv.TASK_INDEX: str(index),
        pv.JOB_NAME: ref.name,
        pv.TASK_SPEC: task.name,
        pv.JOB_NAMESPACE: ref.namespace,
        pv.QUEUE_NAME: job.queue,
    }
    annotations = {
        **(meta.get("annotations") or {}),
        pv.TASK_INDEX: str(index),
        pv.TASK_SPEC: task.name,
        GROUP_NAME: ref.name,
        pv.JOB_NAME: ref.name,
        pv.QUEUE_NAME: job.queue,
        pv.JOB_VERSION: str(status.version),
        pv.TEMPLATE_KEY: f"{ref.name}-{task.name}",
        pv.RETRY_COUNT: str(status.retry_count),
    }
    partition = task.partition(index)
    if partition is not None:  # its subgroup in the PodGroup (podgroup.py)
        labels[pv.PARTITION_ID] = str(partition)
    if task.topology_policy:
        annotations[NUMA_POLICY] = task.topology_policy
    inherited = [k for k in FROM_JOB if k in ref.annotations]
    if {FROM_JOB[3], FROM_JOB[4]} <= set(inherited):
        inherited.remove(FROM_JOB[4])  # a disruption budget of one kind: min-available
    annotations |= {k: ref.annotations[k] for k in inherited}
    labels |= {k: ref.labels[k] for k in FROM_JOB[:2] if k in ref.labels}
    if not spec.get("schedulerName"):
        spec["schedulerName"] = job.scheduler_name
    if not spec.get("priorityClassName") and job.priority_class:
        spec["priorityClassName"] = job.priority_class
    for i, volume in enumerate(job.volumes):
        volume_name = f"{ref.name}-volume-{i}"
        spec.setdefault("volumes", []).append(
            {"name": volume_name, "persistentVolumeClaim": {"claimName": claim_name(ref, i, job)}}
        )
        add_mount(spec, {"name": volume_name, "mountPath": volume.mount_path}, ("containers",))
    plugins.on_pod(PodDraft(spec, ref, job, task, index, name))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": ref.owner(),
        },
        "spec": spec,
    }
