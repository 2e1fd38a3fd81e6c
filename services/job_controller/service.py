"""The Volcano Job controller (``batch.volcano.sh/v1alpha1``), a service of its own.

It acts only on Jobs whose ``schedulerName`` is one of ``scheduler.names`` (a Job that
names none is Volcano's default, ``volcano``, and is ours only when that name is): beside
a running Volcano, each controller keeps to its own Jobs.

For each Job it keeps: a PodGroup of the Job's name (``minMember`` = ``minAvailable``,
the Job's queue and priority class), and one pod per task replica, named
``<job>-<task>-<index>``, from the task's template, with the Job's scheduler name and the
group annotation, so the coordinator places them as one gang. Plugins: ``env`` sets
``VC_TASK_INDEX``/``VK_TASK_INDEX``; ``svc`` creates a headless Service of the Job's name
and gives each pod its hostname and subdomain. Policies: ``PodEvicted`` with
``RestartJob`` deletes every pod of the Job and creates them anew when one is evicted or
deleted; without it a missing pod is created again. A pod that finished (Succeeded or
Failed) is neither recreated nor a reason to restart: it counts as done.

Deleting the Job deletes its pods, PodGroup and Service (no garbage collector is assumed;
owner references are set too, for clusters that run one). Job status: ``state.phase``
Pending until ``minAvailable`` pods are bound, then Running, and Completed once every
pod has finished; counts of pending, running, succeeded and failed pods.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import ApiException

from shared import events as ev
from shared import kube
from shared.core.request import GROUP_NAME, TASK_SPEC
from shared.runtime import Runtime, Service, handles

log = logging.getLogger(__name__)

BATCH = "/apis/batch.volcano.sh/v1alpha1"
SCHEDULING = "/apis/scheduling.volcano.sh/v1beta1"
JOB_NAME = "volcano.sh/job-name"
PHASES = ("Pending", "Running", "Succeeded", "Failed")


@dataclass
class JobState:
    """One Job as the controller knows it: its spec, its pods' phases, a restart in flight."""

    job: ev.JobUpdated
    pods: dict[str, str] = field(default_factory=dict)
    """Pod name -> phase as known here: Pending, Running (bound), Succeeded or Failed."""
    phase: str = ""
    since: str = ""
    """When it entered ``phase`` (RFC 3339)."""
    conditions: list[dict[str, str]] = field(default_factory=list)
    restarting: bool = False


class JobController(Service):
    """Owns the PodGroup, pods, Service and status of each of its Jobs."""

    NAME = "job-controller"

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        self.names = set(rt.cfg.scheduler.names)
        self.grace_s = rt.cfg.scheduler.eviction_grace_s
        """Grace period of the pods it deletes (``scheduler.evictionGraceS``)."""
        self.jobs: dict[tuple[str, str], JobState] = {}
        self.owners: dict[tuple[str, str], JobState] = {}
        """(namespace, pod name) -> its Job: every pod event is looked up here, so it
        must not cost a walk over every Job."""

    def subjects(self) -> list[str]:
        """Job events, and the events of pods a Volcano Job controls: the bus leaves out
        every other pod's (most of a cluster's, and most of a burst's)."""
        pods = [
            subject
            for t in (ev.PodUpdated, ev.PodDeleted)
            # ``SUBJECT.*``: a watcher older than the owner token (during a rollout, or
            # its backlog) keys pod events by namespace alone.
            for subject in (f"{t.SUBJECT}.*.{ev.VOLCANO_JOB}", f"{t.SUBJECT}.*")
        ]
        others = [
            t.filter_subject() for t in self.handled() if t not in (ev.PodUpdated, ev.PodDeleted)
        ]
        return sorted({*others, *pods})

    def ours(self, job: ev.JobUpdated) -> bool:
        return (job.spec.get("schedulerName") or "volcano") in self.names

    @handles(ev.JobUpdated)
    async def on_job_event(self, job: ev.JobUpdated) -> None:
        """A Job of ours appeared or changed: make what it lacks."""
        known = self.jobs.get((job.namespace, job.name))
        if not self.ours(job):
            return
        if known is None or ev.changed(known.job, job):  # not a re-announcement
            await self.on_job(job)

    @handles(ev.JobDeleted)
    async def on_job_deleted_event(self, event: ev.JobDeleted) -> None:
        """A Job of ours is gone: delete what it made."""
        if (event.namespace, event.name) in self.jobs:
            await self.on_job_deleted(event.namespace, event.name)

    def _pod_names(self, job: ev.JobUpdated) -> list[tuple[str, str, int, dict[str, Any]]]:
        out = []
        for task in job.spec.get("tasks") or []:
            name = task.get("name") or "task"
            for i in range(int(task.get("replicas") or 1)):
                out.append((f"{job.name}-{name}-{i}", name, i, task))
        return out

    async def on_job(self, job: ev.JobUpdated) -> None:
        key = (job.namespace, job.name)
        state = self.jobs.get(key)
        if state is None:
            state = self.jobs[key] = JobState(job=job)
        self._forget_owner(state)
        state.job = job
        for name, *_ in self._pod_names(job):
            self.owners[(job.namespace, name)] = state
        await self._podgroup(job)
        await self._service(job)
        for name, task, index, spec in self._pod_names(job):
            if name not in state.pods:
                await self._create_pod(job, name, task, index, spec)
                state.pods[name] = "Pending"
        await self._status(state)

    async def on_job_deleted(self, namespace: str, name: str) -> None:
        state = self.jobs.pop((namespace, name), None)
        if state is not None:
            self._forget_owner(state)
        selector = {"labelSelector": f"{JOB_NAME}={name}"}
        pods = await kube.request(
            self.api, "GET", f"/api/v1/namespaces/{namespace}/pods", query=selector
        )
        for pod in pods["items"]:
            await kube.delete_pod(
                self.api, namespace, pod["metadata"]["name"], grace_s=self.grace_s
            )
        await self._delete(f"{SCHEDULING}/namespaces/{namespace}/podgroups/{name}")
        await self._delete(f"/api/v1/namespaces/{namespace}/services/{name}")
        if state is not None:
            log.info("job %s/%s deleted with its %d pods", namespace, name, len(pods["items"]))

    @handles(ev.PodUpdated, ev.PodDeleted)
    async def on_pod(self, event: ev.PodUpdated | ev.PodDeleted) -> None:
        """Follow the Job's pods: bound ones count as running, finished ones as done; a
        deleted one is replaced (or, with ``PodEvicted: RestartJob``, the whole Job
        restarts)."""
        pod = event.pod
        state = self._owner(pod.namespace, pod.name)
        if state is None:
            return
        if isinstance(event, ev.PodUpdated) and event.node:
            state.pods[pod.name] = "Running"
            await self._status(state)
        elif isinstance(event, ev.PodDeleted) and event.phase in ("Succeeded", "Failed"):
            if state.pods.get(pod.name) is not None:
                state.pods[pod.name] = event.phase
                await self._status(state)
        elif isinstance(event, ev.PodDeleted):
            state.pods.pop(pod.name, None)
            if state.restarting:
                if not state.pods:
                    state.restarting = False
                    await self.on_job(state.job)
                return
            if self._restarts_on_eviction(state.job):
                state.restarting = True
                log.info(
                    "job %s/%s: pod %s evicted; restarting the job (policy RestartJob)",
                    pod.namespace,
                    state.job.name,
                    pod.name,
                )
                for other in list(state.pods):
                    await kube.delete_pod(self.api, pod.namespace, other, grace_s=self.grace_s)
                if not state.pods:
                    state.restarting = False
                    await self.on_job(state.job)
                return
            await self.on_job(state.job)  # recreate what is missing

    def _owner(self, namespace: str, pod: str) -> JobState | None:
        return self.owners.get((namespace, pod))

    def _forget_owner(self, state: JobState) -> None:
        """Drop the pod names of ``state``'s Job as it was (its replicas may change)."""
        for name, *_ in self._pod_names(state.job):
            if self.owners.get((state.job.namespace, name)) is state:
                del self.owners[(state.job.namespace, name)]

    @staticmethod
    def _restarts_on_eviction(job: ev.JobUpdated) -> bool:
        return any(
            p.get("event") == "PodEvicted" and p.get("action") == "RestartJob"
            for p in job.spec.get("policies") or []
        )

    # --- objects ----------------------------------------------------------------------

    def _owner_ref(self, job: ev.JobUpdated) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "batch.volcano.sh/v1alpha1",
                "kind": "Job",
                "name": job.name,
                "uid": job.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]

    async def _podgroup(self, job: ev.JobUpdated) -> None:
        body = {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": job.name, "ownerReferences": self._owner_ref(job)},
            "spec": {
                "minMember": int(job.spec.get("minAvailable") or 1),
                "queue": job.spec.get("queue") or "default",
                "priorityClassName": job.spec.get("priorityClassName") or "",
                "minTaskMember": {
                    t["name"]: int(t["minAvailable"])
                    for t in job.spec.get("tasks") or []
                    if t.get("name") and t.get("minAvailable") is not None
                },
            },
        }
        await self._create(f"{SCHEDULING}/namespaces/{job.namespace}/podgroups", body)

    async def _service(self, job: ev.JobUpdated) -> None:
        if "svc" not in (job.spec.get("plugins") or {}):
            return
        body = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": job.name, "ownerReferences": self._owner_ref(job)},
            "spec": {
                "clusterIP": "None",
                "selector": {JOB_NAME: job.name},
                "publishNotReadyAddresses": True,
            },
        }
        await self._create(f"/api/v1/namespaces/{job.namespace}/services", body)

    async def _create_pod(
        self, job: ev.JobUpdated, name: str, task: str, index: int, spec: dict[str, Any]
    ) -> None:
        template = copy.deepcopy(spec.get("template") or {})
        meta = template.get("metadata") or {}
        pod_spec = template.get("spec") or {}
        labels = {**(meta.get("labels") or {}), JOB_NAME: job.name, TASK_SPEC: task}
        annotations = {
            **(meta.get("annotations") or {}),
            GROUP_NAME: job.name,
            TASK_SPEC: task,
            JOB_NAME: job.name,
        }
        pod_spec.setdefault("schedulerName", job.spec.get("schedulerName") or "volcano")
        plugins = job.spec.get("plugins") or {}
        if "env" in plugins:
            for c in pod_spec.get("containers") or []:
                env = c.setdefault("env", [])
                env += [
                    {"name": "VC_TASK_INDEX", "value": str(index)},
                    {"name": "VK_TASK_INDEX", "value": str(index)},
                ]
        if "svc" in plugins:
            pod_spec["hostname"] = name
            pod_spec["subdomain"] = job.name
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": self._owner_ref(job),
            },
            "spec": pod_spec,
        }
        await self._create(f"/api/v1/namespaces/{job.namespace}/pods", body)

    async def _status(self, state: JobState) -> None:
        """The Job's status as Volcano's controller writes it: ``state`` (phase and when it
        changed), counts by pod phase, ``taskStatusCount`` per task and ``conditions`` (one
        per phase the Job has been in)."""
        job = state.job
        counts = {p: sum(1 for v in state.pods.values() if v == p) for p in PHASES}
        minimum = int(job.spec.get("minAvailable") or 1)
        done = counts["Succeeded"] + counts["Failed"]
        if state.pods and done == len(state.pods):
            phase = "Completed" if counts["Failed"] == 0 else "Failed"
        else:
            phase = "Running" if counts["Running"] + done >= minimum else "Pending"
        # A merge patch: a phase no pod is in any more is written as null (removed).
        tasks: dict[str, dict[str, dict[str, int | None]]] = {}
        for name, task, _index, _spec in self._pod_names(job):
            by_phase = tasks.setdefault(task, {"phase": dict.fromkeys(PHASES)})["phase"]
            pod_phase = state.pods.get(name)
            if pod_phase is not None:
                by_phase[pod_phase] = (by_phase[pod_phase] or 0) + 1
        if not state.conditions or state.conditions[-1]["status"] != phase:
            state.since = kube.now_rfc3339()
            state.conditions.append({"status": phase, "lastTransitionTime": state.since})
        status = {
            "state": {"phase": phase, "lastTransitionTime": state.since},
            "minAvailable": minimum,
            "running": counts["Running"],
            "pending": counts["Pending"],
            "succeeded": counts["Succeeded"],
            "failed": counts["Failed"],
            "taskStatusCount": tasks,
            "conditions": state.conditions[-10:],
        }
        path = f"{BATCH}/namespaces/{job.namespace}/jobs/{job.name}/status"
        if await kube.patch_status(self.api, path, status):
            state.phase = phase

    async def _create(self, path: str, body: dict[str, Any]) -> None:
        try:
            await kube.request(self.api, "POST", path, body)
        except ApiException as exc:
            if exc.status != 409:  # already there
                raise

    async def _delete(self, path: str) -> None:
        try:
            await kube.request(self.api, "DELETE", path)
        except ApiException as exc:
            if exc.status != 404:
                raise
