"""The Volcano Job controller (``batch.volcano.sh/v1alpha1``), a service of its own: the
events and watch it reads and what it hands them to.

It acts only on Jobs whose ``schedulerName`` is one of ``scheduler.names`` (a Job that
names none is Volcano's default, ``volcano``, and is ours only when that name is): beside
a running Volcano, each controller keeps to its own Jobs. A Job that breaks Volcano's
rules (shared/core/vcjob.py; the webhook refuses such Jobs, but one may get in while it
is down) is never acted on: its state is ``Failed`` with reason ``InvalidJob`` and a
Warning Event says why; once an update makes it valid it starts. The others run as
Volcano's controller runs them (services/job_controller/runner.py).

Jobs come from the bus (the watcher mirrors them; at start it lists them itself, so no
pod event is missed until the watcher's next re-announcement); their pods' status,
which the bus does not carry (a pod's phase, readiness, restarts, exit code), from a
watch of the pods labelled ``volcano.sh/job-name``. Deleting a Job deletes what it made
(no garbage collector is assumed; owner references are set too, for clusters that run
one).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from services.job_controller import policies, resources
from services.job_controller.api import API_ERRORS, JobApi
from services.job_controller.podview import JOB_NAME, PodView, read_pod
from services.job_controller.runner import JobRunner
from services.job_controller.status import INVALID, Status
from services.job_controller.tracked import Tracked
from shared import events as ev
from shared import kube
from shared.core import vcjob
from shared.runtime import Runtime, Service, handles

log = logging.getLogger(__name__)

PODS_WATCHED = {"labelSelector": JOB_NAME}
"""The pods the controller watches: those of any Volcano Job."""


class JobController(Service):
    """Owns the PodGroup, pods, plugins' objects and status of each of its Jobs."""

    NAME = "job-controller"

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        self.names = set(rt.cfg.scheduler.names)
        self.calls = JobApi(
            lambda: self.api, self.NAME, rt.instance, rt.cfg.scheduler.eviction_grace_s
        )
        self.runner = JobRunner(self.calls)
        self.synced = asyncio.Event()
        """Set once the pods were listed: no Job is acted on before."""

    def ours(self, job: ev.JobUpdated) -> bool:
        """Whether the Job names one of our scheduler names (or none, ours by default)."""
        return (job.spec.get("schedulerName") or vcjob.DEFAULT_SCHEDULER) in self.names

    def tasks(self) -> dict[str, Any]:
        """The pod watch and the timers."""
        return {"pods": self.watch_pods(), "timers": self.runner.timers.run()}

    # --- Jobs --------------------------------------------------------------------------

    @handles(ev.JobUpdated)
    async def on_job_updated(self, job: ev.JobUpdated) -> None:
        """A Job of ours appeared or changed."""
        if not self.ours(job):
            return
        await self.synced.wait()
        async with self.runner.lock:
            await self.on_job(job)

    @handles(ev.JobDeleted)
    async def on_job_deleted(self, event: ev.JobDeleted) -> None:
        """A Job of ours is gone: delete what it made (its pods also when this replica
        never saw the Job: it started after the Job was deleted)."""
        key = (event.namespace, event.name)
        if key in self.runner.jobs or self.runner.pods.get(key):
            async with self.runner.lock:
                await self.remove_job(event.namespace, event.name)

    async def on_job(self, job: ev.JobUpdated, obj: dict[str, Any] | None = None) -> None:
        """A Job as announced (under the lock): checked, read with Volcano's defaults,
        synced. ``obj``: the Job as listed (else it is read once, for its status)."""
        key = (job.namespace, job.name)
        tracked = self.runner.jobs.get(key)
        if tracked is not None and tracked.uid == job.uid and tracked.raw == job.spec:
            return  # a re-announcement
        if tracked is None or tracked.uid != job.uid:
            if obj is None:
                obj = await self.calls.read_job(job.namespace, job.name)
            if obj is None or obj["metadata"].get("uid") != job.uid:
                return  # deleted meanwhile, or a namesake: its own event follows
            tracked = Tracked.read(job, obj)
            self.runner.jobs[key] = tracked
        tracked.raw = job.spec
        errors = vcjob.check(job.name, job.spec)
        if errors:
            await self._refuse(tracked, vcjob.refusal(errors))
            return
        if tracked.status.reason == INVALID:  # made valid by an update: it starts now
            log.info("job %s/%s is valid now; starting it", job.namespace, job.name)
            tracked.status = Status()
        tracked.spec = vcjob.read(job.spec, vcjob.DEFAULT_SCHEDULER)
        await self.runner.handle(tracked, policies.Request("OutOfSync"))

    async def _refuse(self, tracked: Tracked, message: str) -> None:
        """An invalid Job: never acted on; its state and an Event say why."""
        tracked.spec = None
        status = tracked.status
        if status.reason == INVALID and status.message == message:
            return
        log.info("job %s/%s is invalid: %s", tracked.namespace, tracked.name, message)
        await self.calls.event(tracked, INVALID, message, "Warning")
        tracked.status = status.entered("Failed", kube.now_rfc3339(), INVALID, message)
        await self.calls.write_status(tracked)

    async def remove_job(self, namespace: str, name: str) -> None:
        """A Job is deleted (under the lock): what it made goes with it."""
        tracked, pods = self.runner.forget((namespace, name))
        await resources.remove(self.calls, namespace, name, tracked, pods)
        log.info("job %s/%s deleted with its %d pods", namespace, name, len(pods))

    # --- pods --------------------------------------------------------------------------

    async def watch_pods(self) -> None:
        """List and watch the pods of Volcano Jobs."""
        await kube.list_watch(
            self.api, "/api/v1/pods", self.on_pod, on_relist=self.on_pods, query=PODS_WATCHED
        )

    async def on_pods(self, items: list[dict[str, Any]]) -> None:
        """The pods as listed: at start, the cache; after a broken watch, the changes
        missed meanwhile, as events."""
        views = [v for v in map(read_pod, items) if v is not None]
        if not self.synced.is_set():
            for view in views:
                self.runner.pods.setdefault((view.namespace, view.job), {})[view.name] = view
            log.info("the pods of Volcano Jobs listed: %d", len(views))
            await self._adopt()
            return
        listed = {(v.namespace, v.name) for v in views}
        for pods in list(self.runner.pods.values()):
            for view in list(pods.values()):
                if view.uid and (view.namespace, view.name) not in listed:
                    await self._pod_changed("DELETED", view)
        for view in views:
            await self._pod_changed("MODIFIED", view)

    async def _adopt(self) -> None:
        """Take the Jobs on at start: listed here, not waiting for the watcher's next
        re-announcement, so no event of their pods is missed meanwhile (each syncs, as
        a Job new to Volcano's controller does)."""
        items = await self.calls.list_jobs()  # none without a Job CRD: Jobs come from the bus
        self.synced.set()
        async with self.runner.lock:
            for obj in items:
                job = ev.JobUpdated(
                    namespace=str(obj["metadata"].get("namespace", "")),
                    name=str(obj["metadata"].get("name", "")),
                    uid=str(obj["metadata"].get("uid", "")),
                    spec=obj.get("spec") or {},
                )
                if not self.ours(job) or (job.namespace, job.name) in self.runner.jobs:
                    continue
                try:
                    await self.on_job(job, obj)
                except API_ERRORS as exc:
                    log.warning("job %s/%s: not taken on now (%s)", job.namespace, job.name, exc)
                    tracked = self.runner.jobs.get((job.namespace, job.name))
                    if tracked is not None:
                        self.runner.retry(tracked)
        log.info("jobs taken on: %d", len(self.runner.jobs))

    async def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        """A watch event of a pod: one of a Volcano Job's changed."""
        view = read_pod(obj)
        if view is not None:
            await self._pod_changed(kind, view)

    async def _pod_changed(self, kind: str, view: PodView) -> None:
        key = (view.namespace, view.job)
        pods = self.runner.pods.setdefault(key, {})
        old = pods.get(view.name)
        if old is not None and old.uid != view.uid:
            old = None  # made here and not seen yet, or a namesake
        if old is not None and old.deleting and not view.deleting:
            view = replace(view, deleting=True)  # deleted here; the watch lags
        if kind == "DELETED":
            if old is None:
                return  # another pod of that name, already replaced
            del pods[view.name]
            new: PodView | None = None
            old = view
        else:
            if old == view:
                return
            pods[view.name] = view
            new = view
        tracked = self.runner.jobs.get(key)
        if tracked is None or tracked.spec is None or not self.synced.is_set():
            return
        async with self.runner.lock:
            if self.runner.jobs.get(key) is not tracked or tracked.spec is None:
                return
            await self.runner.guarded(tracked, policies.pod_event(tracked.spec, old, new, pods))
            broken = policies.gang_broken(pods)
            if broken and not tracked.broken and tracked.spec is not None:
                await self.runner.guarded(tracked, policies.Request("Unknown"))
            tracked.broken = broken
