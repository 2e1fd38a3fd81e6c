"""A Volcano Job's PodGroup (``scheduling.volcano.sh/v1beta1``, the Job's name): its
body, and keeping it written: created with the Job's first pods, brought up to date when
the Job is scaled, taken down when the Job is killed whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from services.job_controller import podview as pv
from services.job_controller.api import JobApi
from services.job_controller.made import JobRef
from services.job_controller.tracked import Tracked
from shared.core import vcjob

SCHEDULING = "/apis/scheduling.volcano.sh/v1beta1"


def path(namespace: str, name: str) -> str:
    """Where the PodGroup of the Job ``name`` is."""
    return f"{SCHEDULING}/namespaces/{namespace}/podgroups/{name}"


def podgroup(ref: JobRef, job: vcjob.JobSpec) -> dict[str, Any]:
    """The Job's PodGroup: its name, ``minMember`` = ``minAvailable``, the queue and
    priority class, each task's ``minAvailable`` as ``minTaskMember`` where
    Volcano's scheduler holds a gang to it: when the Job's ``minAvailable`` is at least
    the tasks' together (below, Volcano checks no task's, and a task that ``dependsOn``
    another could never start beside it), a ``subGroupPolicy`` per task with a
    ``partitionPolicy``, and the Job's ``networkTopology``."""
    spec: dict[str, Any] = {
        "minMember": job.min_available,
        "queue": job.queue,
        "priorityClassName": job.priority_class,
    }
    if job.min_available >= job.task_min_available:
        spec["minTaskMember"] = {t.name: t.min_available for t in job.tasks}
    policies = [subgroup_policy(t) for t in job.tasks if t.partition_size > 0]
    if policies:
        spec["subGroupPolicy"] = policies
    if job.network_topology is not None:  # as Volcano's controller passes it on
        spec["networkTopology"] = dict(job.network_topology)
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": ref.name, "ownerReferences": ref.owner()},
        "spec": spec,
    }


def subgroup_policy(task: vcjob.Task) -> dict[str, Any]:
    """A task's ``partitionPolicy`` as the PodGroup's subgroup policy, as Volcano's
    controller writes it: each partition (its pods' ``volcano.sh/partition-id``, pods.py)
    a subgroup of ``partitionSize`` placed whole, ``minPartitions`` of them required."""
    return {
        "name": task.name,
        "subGroupSize": task.partition_size,
        "minSubGroups": task.min_partitions,
        "labelSelector": {"matchLabels": {pv.TASK_SPEC: task.name}},
        "matchLabelKeys": [pv.PARTITION_ID],
    }


def digest(body: Mapping[str, Any]) -> str:
    """A stable text of an object's body (what changed since it was written)."""
    return json.dumps(body, sort_keys=True)


async def write(api: JobApi, tracked: Tracked) -> None:
    """Create the PodGroup, or bring it up to date when the Job was scaled."""
    assert tracked.spec is not None
    body = podgroup(tracked.ref, tracked.spec)
    written = digest(body)
    if tracked.podgroup == written:
        return
    collection = f"{SCHEDULING}/namespaces/{tracked.namespace}/podgroups"
    if not await api.create(collection, body):
        await api.patch(path(tracked.namespace, tracked.name), {"spec": body["spec"]})
    tracked.podgroup, tracked.podgroup_unsure = written, False


async def take_down(api: JobApi, tracked: Tracked) -> None:
    """Delete the PodGroup if it may exist (made again when the Job starts over)."""
    if tracked.podgroup is not None or tracked.podgroup_unsure:
        await api.delete(path(tracked.namespace, tracked.name))
        tracked.podgroup, tracked.podgroup_unsure = None, False
