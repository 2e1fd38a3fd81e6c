"""The Volcano Job controller (``batch.volcano.sh/v1alpha1``), a service of its own.

It acts only on Jobs whose ``schedulerName`` is one of ``scheduler.names`` (a Job that
names none is Volcano's default, ``volcano``, and is ours only when that name is): beside
a running Volcano, each controller keeps to its own Jobs.

It runs each Job as Volcano's controller does (services/job_controller/lifecycle.py has
the phases, events and actions; plugins.py the pods and the plugins' objects): a PodGroup
of the Job's name, one pod per task replica named ``<job>-<task>-<index>`` (a task that
``dependsOn`` others only once they are ready), the lifecycle ``policies`` of the Job and
its tasks, ``maxRetry``, ``minSuccess``, ``ttlSecondsAfterFinished``, the plugins
(``env``, ``svc``, ``ssh``, ``pytorch``, ``mpi``, ``tensorflow``), volumes, and the
status Volcano's tools read (phase, counts per phase and task, ``version``,
``retryCount``, conditions). A Job that breaks Volcano's
rules (shared/core/vcjob.py; the webhook refuses such Jobs, but one may get in while it
is down) is never acted on: its state is ``Failed`` with reason ``InvalidJob`` and a
Warning Event says why; once an update makes it valid it starts.

Jobs come from the bus (the watcher mirrors them; at start it lists them itself, so no
pod event is missed until the watcher's next re-announcement); their pods' status,
which the bus does not carry (a pod's phase, readiness, restarts, exit code), from a
watch of the pods labelled ``volcano.sh/job-name``. Each event of a Job is handled under one lock,
so a Job's pods and status change in one order. Deleting a Job deletes what it made (no
garbage collector is assumed; owner references are set too, for clusters that run one).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kubernetes_asyncio.client import ApiException

from services.job_controller import lifecycle as lc
from services.job_controller import plugins as pl
from shared import events as ev
from shared import kube
from shared.core import vcjob
from shared.runtime import Runtime, Service, handles

log = logging.getLogger(__name__)

BATCH = "/apis/batch.volcano.sh/v1alpha1"
SCHEDULING = "/apis/scheduling.volcano.sh/v1beta1"
PODS_WATCHED = {"labelSelector": lc.JOB_NAME}
"""The pods the controller watches: those of any Volcano Job."""
MAX_STEPS = 8
"""How many actions one event may lead to: each phase change syncs the Job again (as
Volcano's controller does on the Job's update), and a finished Job's sync changes none."""

RETRY_S = 5.0
"""How soon a Job whose last sync could not do everything (an API error, a claim it names
not there yet) is synced again."""

API_ERRORS: tuple[type[Exception], ...] = (ApiException, *kube.UNREACHABLE)
"""What an API call off the bus may fail with and be tried again for."""

JobKey = tuple[str, str]


@dataclass
class Tracked:
    """One Job of ours as the controller knows it."""

    namespace: str
    name: str
    uid: str
    raw: dict[str, Any]
    """Its spec as written."""
    spec: vcjob.JobSpec | None
    """Its spec with Volcano's defaults; None while it breaks a rule."""
    status: lc.Status
    written: dict[str, Any]
    """The status as last written (a merge patch writes only what changed)."""
    podgroup: str | None = None
    """The PodGroup body last written; None: not known to exist."""
    podgroup_unsure: bool = True
    """It may exist though this replica has not written it (written before a restart)."""
    hosts: dict[str, str] = field(default_factory=dict)
    """The svc plugin's ConfigMap data as last written."""
    broken: bool = False
    """Some pods run while another cannot be placed (Volcano's PodGroup Unknown)."""
    told: set[str] = field(default_factory=set)
    """Warnings already posted (one Event per distinct one)."""
    meta: dict[str, dict[str, str]] = field(default_factory=dict)
    """Its annotations and labels when first read (some pass to its pods)."""
    expiring: bool = False
    """Its ``ttlSecondsAfterFinished`` deletion is timed."""
    retrying: bool = False
    """A sync is timed (``RETRY_S``): the last one left something undone."""

    @property
    def ref(self) -> pl.JobRef:
        return pl.JobRef(
            self.namespace,
            self.name,
            self.uid,
            self.meta.get("annotations") or {},
            self.meta.get("labels") or {},
        )

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class Delayed:
    """A policy action waiting for its timeout (Volcano's delayed actions)."""

    job: JobKey
    decision: lc.Decision

    @property
    def slot(self) -> tuple[JobKey, str]:
        """One delayed action per pod (or per Job for a Job-level event)."""
        return (self.job, self.decision.pod)


class JobController(Service):
    """Owns the PodGroup, pods, plugins' objects and status of each of its Jobs."""

    NAME = "job-controller"

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        self.names = set(rt.cfg.scheduler.names)
        self.grace_s = rt.cfg.scheduler.eviction_grace_s
        """Grace period of the pods it deletes (``scheduler.evictionGraceS``)."""
        self.jobs: dict[JobKey, Tracked] = {}
        self.pods: dict[JobKey, dict[str, lc.PodView]] = {}
        """(namespace, Job name) -> its pods by name, from the watch (and the pods this
        controller created or deleted, until the watch says so)."""
        self.synced = asyncio.Event()
        """Set once the pods were listed: no Job is acted on before."""
        self.lock = asyncio.Lock()
        self.delayed: dict[tuple[JobKey, str], Delayed] = {}
        self.timers: list[tuple[float, int, Callable[[], Awaitable[None]]]] = []
        self.order = itertools.count()
        self.wake = asyncio.Event()

    def ours(self, job: ev.JobUpdated) -> bool:
        return (job.spec.get("schedulerName") or vcjob.DEFAULT_SCHEDULER) in self.names

    def tasks(self) -> dict[str, Any]:
        return {"pods": self.watch_pods(), "timers": self.run_timers()}

    # --- Jobs --------------------------------------------------------------------------

    @handles(ev.JobUpdated)
    async def on_job_event(self, job: ev.JobUpdated) -> None:
        """A Job of ours appeared or changed."""
        if not self.ours(job):
            return
        await self.synced.wait()
        async with self.lock:
            await self.on_job(job)

    @handles(ev.JobDeleted)
    async def on_job_deleted_event(self, event: ev.JobDeleted) -> None:
        """A Job of ours is gone: delete what it made (its pods also when this replica
        never saw the Job: it started after the Job was deleted)."""
        key = (event.namespace, event.name)
        if key in self.jobs or self.pods.get(key):
            async with self.lock:
                await self.on_job_deleted(event.namespace, event.name)

    async def on_job(self, job: ev.JobUpdated, obj: dict[str, Any] | None = None) -> None:
        """``obj``: the Job as listed (else it is read once, for its status)."""
        key = (job.namespace, job.name)
        tracked = self.jobs.get(key)
        if tracked is not None and tracked.uid == job.uid and tracked.raw == job.spec:
            return  # a re-announcement
        if tracked is None or tracked.uid != job.uid:
            tracked = await self._load(job, obj)
            if tracked is None:
                return
            self.jobs[key] = tracked
        tracked.raw = job.spec
        errors = vcjob.check(job.name, job.spec)
        if errors:
            await self._refuse(tracked, vcjob.refusal(errors))
            return
        if tracked.status.reason == lc.INVALID:  # made valid by an update: it starts now
            log.info("job %s/%s is valid now; starting it", job.namespace, job.name)
            tracked.status = lc.Status()
        tracked.spec = vcjob.read(job.spec, vcjob.DEFAULT_SCHEDULER)
        await self._handle(tracked, lc.Request("OutOfSync"))

    async def _load(self, job: ev.JobUpdated, obj: dict[str, Any] | None) -> Tracked | None:
        """A Job seen for the first time (or again with a new uid): its status as written
        (a restarted controller goes on from its retry count and version)."""
        if obj is None:
            try:
                obj = await kube.request(
                    self.api, "GET", f"{BATCH}/namespaces/{job.namespace}/jobs/{job.name}"
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None  # deleted meanwhile: its deletion follows
                raise
        if obj["metadata"].get("uid") != job.uid:
            return None  # a namesake: its own event follows
        written = obj.get("status") or {}
        tracked = Tracked(
            job.namespace, job.name, job.uid, job.spec, None, lc.read_status(written), written
        )
        meta = obj["metadata"]
        tracked.meta = {k: dict(meta.get(k) or {}) for k in ("annotations", "labels")}
        return tracked

    async def _refuse(self, tracked: Tracked, message: str) -> None:
        """An invalid Job: never acted on; its state and an Event say why."""
        tracked.spec = None
        status = tracked.status
        if status.reason == lc.INVALID and status.message == message:
            return
        log.info("job %s/%s is invalid: %s", tracked.namespace, tracked.name, message)
        await self._job_event(tracked, lc.INVALID, message, "Warning")
        tracked.status = status.entered("Failed", kube.now_rfc3339(), lc.INVALID, message)
        await self._write_status(tracked)

    async def on_job_deleted(self, namespace: str, name: str) -> None:
        tracked = self.jobs.pop((namespace, name), None)
        for slot in [s for s in self.delayed if s[0] == (namespace, name)]:
            del self.delayed[slot]
        pods = self.pods.pop((namespace, name), {})
        for pod in pods.values():
            await kube.delete_pod(self.api, namespace, pod.name, grace_s=self.grace_s)
        await self._delete(f"{SCHEDULING}/namespaces/{namespace}/podgroups/{name}")
        if tracked is not None and tracked.spec is not None:
            for plugin in tracked.spec.plugins:
                for path in pl.made_paths(tracked.ref, plugin):
                    await self._delete(path)
            for made in pl.claims(tracked.ref, tracked.spec):
                await self._delete(made.path)
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
        views = [v for v in map(lc.read_pod, items) if v is not None]
        if not self.synced.is_set():
            for view in views:
                self.pods.setdefault((view.namespace, view.job), {})[view.name] = view
            log.info("the pods of Volcano Jobs listed: %d", len(views))
            await self._adopt()
            return
        listed = {(v.namespace, v.name) for v in views}
        for pods in list(self.pods.values()):
            for view in list(pods.values()):
                if view.uid and (view.namespace, view.name) not in listed:
                    await self._pod_changed("DELETED", view)
        for view in views:
            await self._pod_changed("MODIFIED", view)

    async def _adopt(self) -> None:
        """Take the Jobs on at start: listed here, not waiting for the watcher's next
        re-announcement, so no event of their pods is missed meanwhile (each syncs, as
        a Job new to Volcano's controller does)."""
        try:
            items, _ = await kube.list_all(self.api, f"{BATCH}/jobs")
        except ApiException as exc:
            if exc.status != 404:  # 404: no Job CRD (yet): Jobs come from the bus
                raise
            items = []
        self.synced.set()
        async with self.lock:
            for obj in items:
                job = ev.JobUpdated(
                    namespace=str(obj["metadata"].get("namespace", "")),
                    name=str(obj["metadata"].get("name", "")),
                    uid=str(obj["metadata"].get("uid", "")),
                    spec=obj.get("spec") or {},
                )
                if not self.ours(job) or (job.namespace, job.name) in self.jobs:
                    continue
                try:
                    await self.on_job(job, obj)
                except API_ERRORS as exc:
                    log.warning("job %s/%s: not taken on now (%s)", job.namespace, job.name, exc)
                    tracked = self.jobs.get((job.namespace, job.name))
                    if tracked is not None:
                        self._retry(tracked)
        log.info("jobs taken on: %d", len(self.jobs))

    async def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        view = lc.read_pod(obj)
        if view is not None:
            await self._pod_changed(kind, view)

    async def _pod_changed(self, kind: str, view: lc.PodView) -> None:
        key = (view.namespace, view.job)
        pods = self.pods.setdefault(key, {})
        old = pods.get(view.name)
        if old is not None and old.uid != view.uid:
            old = None  # made here and not seen yet, or a namesake
        if old is not None and old.deleting and not view.deleting:
            view = replace(view, deleting=True)  # deleted here; the watch lags
        if kind == "DELETED":
            if old is None:
                return  # another pod of that name, already replaced
            del pods[view.name]
            new: lc.PodView | None = None
            old = view
        else:
            if old == view:
                return
            pods[view.name] = view
            new = view
        tracked = self.jobs.get(key)
        if tracked is None or tracked.spec is None or not self.synced.is_set():
            return
        async with self.lock:
            if self.jobs.get(key) is not tracked or tracked.spec is None:
                return
            await self._guarded(tracked, lc.pod_event(tracked.spec, old, new, pods))
            broken = lc.gang_broken(pods)
            if broken and not tracked.broken and tracked.spec is not None:
                await self._guarded(tracked, lc.Request("Unknown"))
            tracked.broken = broken

    # --- requests, actions -------------------------------------------------------------

    async def _guarded(self, tracked: Tracked, req: lc.Request) -> None:
        """Handle ``req`` off the bus (the pod watch, a timer): an API error is logged
        and the Job synced again in ``RETRY_S`` (the bus redelivers its own events)."""
        try:
            await self._handle(tracked, req)
        except API_ERRORS as exc:
            log.warning(
                "job %s/%s: %s not handled (%s); syncing again in %gs",
                tracked.namespace,
                tracked.name,
                req.event,
                getattr(exc, "status", exc),
                RETRY_S,
            )
            self._retry(tracked)

    def _retry(self, tracked: Tracked) -> None:
        if not tracked.retrying:
            tracked.retrying = True
            self.at(RETRY_S, lambda: self._resync(tracked))

    async def _resync(self, tracked: Tracked) -> None:
        async with self.lock:
            tracked.retrying = False
            if self.jobs.get(tracked.key) is tracked and tracked.spec is not None:
                await self._guarded(tracked, lc.Request("OutOfSync"))

    async def _handle(self, tracked: Tracked, req: lc.Request) -> None:
        """One event of a Job (under the lock): the action that answers it, now or
        after its policy's timeout (Volcano's processNextReq)."""
        spec = tracked.spec
        assert spec is not None
        self._cancel_for_pod(tracked.key, req)
        decision = lc.decide(spec, tracked.uid, tracked.status.version, req)
        if decision.delay_s > 0:
            waiting = Delayed(tracked.key, decision)
            earlier = self.delayed.get(waiting.slot)
            if earlier is not None and earlier.decision.action == decision.action:
                return
            self.delayed[waiting.slot] = waiting
            await self._job_event(
                tracked,
                "ExecuteAction",
                f"Execute action {decision.action} after {decision.delay_s:g}s",
            )
            self.at(decision.delay_s, lambda: self._fire(waiting))
            return
        await self._run(tracked, decision)

    async def _run(self, tracked: Tracked, decision: lc.Decision) -> None:
        if decision.action != lc.SYNC:
            await self._job_event(
                tracked, "ExecuteAction", f"Start to execute action {decision.action}"
            )
            log.info(
                "job %s/%s: %s on %s (%s)",
                tracked.namespace,
                tracked.name,
                decision.action,
                decision.event,
                decision.pod or decision.task or "the job",
            )
            self._cancel_scope(tracked.key, decision)
        for _ in range(MAX_STEPS):
            assert tracked.spec is not None
            before = tracked.status.phase
            plan = lc.step(
                tracked.name,
                tracked.spec,
                tracked.status,
                self.pods.get(tracked.key, {}),
                decision,
                kube.now_rfc3339(),
            )
            await self._carry_out(tracked, plan)
            if tracked.status.phase == before:
                break
            log.info(
                "job %s/%s: %s -> %s",
                tracked.namespace,
                tracked.name,
                before or "new",
                tracked.status.phase,
            )
            decision = lc.Decision(lc.SYNC)
        self._expire(tracked)

    def _cancel_for_pod(self, job: JobKey, req: lc.Request) -> None:
        """A pod that moved on cancels what waited on it (Volcano's
        CleanPodDelayActionsIfNeed): running, failing or going cancels its PodPending
        timeout; running again cancels a PodFailed or PodEvicted one."""
        waiting = self.delayed.get((job, req.pod))
        if waiting is None or req.event not in ("PodRunning", "PodFailed", "PodEvicted"):
            return
        event = waiting.decision.event
        if (event == "PodPending" and waiting.decision.pod_uid == req.pod_uid) or (
            event in ("PodFailed", "PodEvicted") and req.event == "PodRunning"
        ):
            del self.delayed[(job, req.pod)]

    def _cancel_scope(self, job: JobKey, decision: lc.Decision) -> None:
        """An action that ran cancels the delayed actions of its scope: every Job-level
        one, a task's for its task, a pod's for its pod."""
        scope = lc.scope(decision.action)
        for slot, waiting in list(self.delayed.items()):
            other = waiting.decision
            if slot[0] != job or lc.scope(other.action) != scope:
                continue
            if scope == "task" and other.task != decision.task:
                continue
            if scope in ("pod", "partition") and other.pod != decision.pod:
                continue
            del self.delayed[slot]

    async def _fire(self, waiting: Delayed) -> None:
        async with self.lock:
            if self.delayed.get(waiting.slot) is not waiting:
                return  # cancelled
            del self.delayed[waiting.slot]
            tracked = self.jobs.get(waiting.job)
            if tracked is None or tracked.spec is None:
                return
            try:
                await self._run(tracked, waiting.decision)
            except API_ERRORS as exc:
                log.warning(
                    "job %s/%s: delayed %s failed (%s); syncing again in %gs",
                    tracked.namespace,
                    tracked.name,
                    waiting.decision.action,
                    getattr(exc, "status", exc),
                    RETRY_S,
                )
                self._retry(tracked)

    # --- doing what a plan says --------------------------------------------------------

    async def _carry_out(self, tracked: Tracked, plan: lc.Plan) -> None:
        spec = tracked.spec
        assert spec is not None
        status = plan.status
        if plan.teardown:
            status = await self._teardown(tracked, status)
        pods = self.pods.setdefault(tracked.key, {})
        for name in plan.kill:
            await self._kill(tracked, name)
            if name in pods:
                pods[name] = replace(pods[name], deleting=True, out_of_sync=True)
        if plan.setup:
            status, ready = await self._setup(tracked, status)
            if not ready:
                self._retry(tracked)
            for task_name, index in plan.create if ready else ():
                task = spec.task(task_name)
                assert task is not None
                body = pl.pod(tracked.ref, spec, task, index, status)
                if await self._create_pod(tracked, body):
                    name = body["metadata"]["name"]
                    pods.setdefault(
                        name,
                        lc.PodView(
                            tracked.namespace,
                            name,
                            "",  # no uid until the watch shows it
                            tracked.name,
                            tracked.uid,
                            task_name,
                            index,
                            version=status.version,
                            phase="Pending",
                        ),
                    )
        tracked.status = status
        await self._write_status(tracked)

    async def _kill(self, tracked: Tracked, name: str) -> None:
        """Mark the pod as the controller's own deletion (its end is no event of the
        Job), then delete it."""
        path = f"/api/v1/namespaces/{tracked.namespace}/pods/{name}"
        try:
            await kube.request(
                self.api,
                "PATCH",
                path,
                {"metadata": {"annotations": {lc.OUT_OF_SYNC: "true"}}},
                content_type="application/merge-patch+json",
            )
            await kube.delete_pod(self.api, tracked.namespace, name, grace_s=self.grace_s)
        except ApiException as exc:
            if exc.status == 404:
                return
            await self._job_event(
                tracked, "FailedDeletePod", f"Error deleting pod {name}: {exc.status}", "Warning"
            )
            raise

    async def _create_pod(self, tracked: Tracked, body: dict[str, Any]) -> bool:
        try:
            await kube.request(
                self.api, "POST", f"/api/v1/namespaces/{tracked.namespace}/pods", body
            )
        except ApiException as exc:
            if exc.status == 409:
                return False  # there already (the watch will say)
            message = kube.refusal(exc).message
            if _closing(exc):
                return False  # its namespace is being deleted, the Job with it
            await self._job_event(
                tracked,
                "FailedCreatePod",
                f"Error creating pod {body['metadata']['name']}: {message}",
                "Warning",
            )
            self._retry(tracked)
            return False
        return True

    async def _setup(self, tracked: Tracked, status: lc.Status) -> tuple[lc.Status, bool]:
        """What the Job's pods need first: its claims, its PodGroup, its plugins'
        objects. False when its pods must wait (a claim it names does not exist)."""
        spec, ref = tracked.spec, tracked.ref
        assert spec is not None
        controlled = dict(status.controlled)
        for made in pl.claims(ref, spec):  # recorded once made, as Volcano does
            name = made.body["metadata"]["name"]
            if f"volume-pvc-{name}" not in controlled:
                await self._create(made.collection, made.body)
                controlled[f"volume-pvc-{name}"] = name
        for i, volume in enumerate(spec.volumes):
            name = volume.claim_name
            if not name or f"volume-pvc-{name}" in controlled:
                continue
            if not await self._exists(
                f"/api/v1/namespaces/{ref.namespace}/persistentvolumeclaims/{name}"
            ):
                await self._warn(
                    tracked,
                    "PVCError",
                    f"pvc {name} (spec.volumes[{i}]) is not found: the Job stays Pending "
                    "until it is created",
                )
                return replace(status, controlled=controlled), False
            controlled[f"volume-pvc-{name}"] = name
        await self._podgroup(tracked)
        for plugin in spec.plugins:
            mark = f"plugin-{plugin}"
            if plugin not in pl.IMPLEMENTED:
                await self._warn(
                    tracked,
                    "PluginError",
                    f"plugin {plugin} is not run by Tessera's job-controller: its pods get "
                    "nothing from it (docs/compat.md, Job)",
                )
            elif controlled.get(mark) != plugin:
                for made in pl.objects(ref, spec, plugin):
                    await self._create(made.collection, made.body)
                if plugin == "svc":
                    tracked.hosts = pl.hosts(ref, spec)
            elif plugin == "svc" and tracked.hosts != pl.hosts(ref, spec):
                tracked.hosts = pl.hosts(ref, spec)  # scaled: the hosts change
                await self._patch(
                    f"/api/v1/namespaces/{ref.namespace}/configmaps/{ref.name}-svc",
                    {"data": tracked.hosts},
                )
            controlled[mark] = plugin
        return replace(status, controlled=controlled), True

    async def _teardown(self, tracked: Tracked, status: lc.Status) -> lc.Status:
        """Volcano's KillJob takes the PodGroup and the plugins' objects down (they are
        made again when the Job starts over)."""
        spec, ref = tracked.spec, tracked.ref
        assert spec is not None
        if tracked.podgroup is not None or tracked.podgroup_unsure:
            await self._delete(f"{SCHEDULING}/namespaces/{ref.namespace}/podgroups/{ref.name}")
            tracked.podgroup, tracked.podgroup_unsure = None, False
        controlled = dict(status.controlled)
        for plugin in spec.plugins:
            if controlled.pop(f"plugin-{plugin}", None) is None:
                continue
            for path in pl.made_paths(ref, plugin):
                await self._delete(path)
        tracked.hosts = {}
        return replace(status, controlled=controlled)

    async def _podgroup(self, tracked: Tracked) -> None:
        """Create the PodGroup, or bring it up to date when the Job was scaled."""
        assert tracked.spec is not None
        body = pl.podgroup(tracked.ref, tracked.spec)
        written = pl.digest(body)
        if tracked.podgroup == written:
            return
        path = f"{SCHEDULING}/namespaces/{tracked.namespace}/podgroups"
        if not await self._create(path, body):
            await self._patch(f"{path}/{tracked.name}", {"spec": body["spec"]})
        tracked.podgroup, tracked.podgroup_unsure = written, False

    async def _write_status(self, tracked: Tracked) -> None:
        status = tracked.status.to_api()
        patch = lc.merge_patch(tracked.written, status)
        if not patch:
            return
        path = f"{BATCH}/namespaces/{tracked.namespace}/jobs/{tracked.name}/status"
        if await kube.patch_status(self.api, path, patch):
            tracked.written = status

    # --- timers: delayed actions and ttlSecondsAfterFinished --------------------------

    def at(self, delay_s: float, then: Callable[[], Awaitable[None]]) -> None:
        """Call ``then`` in ``delay_s`` seconds (on the timer task)."""
        due = asyncio.get_running_loop().time() + delay_s
        heapq.heappush(self.timers, (due, next(self.order), then))
        self.wake.set()

    async def run_timers(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.wake.clear()
            now = loop.time()
            while self.timers and self.timers[0][0] <= now:
                _, _, then = heapq.heappop(self.timers)
                await then()
            wait = self.timers[0][0] - loop.time() if self.timers else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=wait)

    def _expire(self, tracked: Tracked) -> None:
        """A finished Job with ``ttlSecondsAfterFinished`` is deleted that long after it
        finished (Volcano's garbage collector; an invalid Job never ran, and stays)."""
        spec, status = tracked.spec, tracked.status
        if spec is None or spec.ttl_s is None or status.phase not in lc.TTL_PHASES:
            return
        if tracked.expiring:
            return
        tracked.expiring = True
        finished = _parse_time(status.since)
        left = spec.ttl_s - (dt.datetime.now(dt.UTC) - finished).total_seconds()
        self.at(max(left, 0.0), lambda: self._collect(tracked))

    async def _collect(self, tracked: Tracked) -> None:
        async with self.lock:
            tracked.expiring = False
            if (
                self.jobs.get(tracked.key) is not tracked
                or tracked.status.phase not in lc.TTL_PHASES
            ):
                return
            log.info(
                "job %s/%s finished at %s: deleting it (ttlSecondsAfterFinished)",
                tracked.namespace,
                tracked.name,
                tracked.status.since,
            )
            options = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"uid": tracked.uid},
            }
            try:
                await kube.request(
                    self.api,
                    "DELETE",
                    f"{BATCH}/namespaces/{tracked.namespace}/jobs/{tracked.name}",
                    options,
                )
            except API_ERRORS as exc:
                if getattr(exc, "status", None) in (404, 409):
                    return  # gone, or a namesake now
                log.warning(
                    "job %s/%s: cannot delete it (%s); trying again in %gs",
                    tracked.namespace,
                    tracked.name,
                    getattr(exc, "status", exc),
                    RETRY_S,
                )
                tracked.expiring = True
                self.at(RETRY_S, lambda: self._collect(tracked))

    # --- API helpers -------------------------------------------------------------------

    async def _job_event(
        self,
        tracked: Tracked,
        reason: str,
        message: str,
        kind: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """An Event on the Job (``kubectl describe vcjob`` shows it), as Volcano's
        controller records them."""
        now = dt.datetime.now(dt.UTC).isoformat()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{tracked.name}.", "namespace": tracked.namespace},
            "involvedObject": {
                "apiVersion": "batch.volcano.sh/v1alpha1",
                "kind": "Job",
                "name": tracked.name,
                "namespace": tracked.namespace,
                "uid": tracked.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "vc-controller-manager"},
            "reportingComponent": f"{kube.REPORTING_COMPONENT}/{self.NAME}",
            "reportingInstance": self.rt.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await kube.request(
                self.api, "POST", f"/api/v1/namespaces/{tracked.namespace}/events", body
            )
        except ApiException as exc:
            if exc.status != 404 and not _closing(exc):
                log.warning(
                    "cannot tell job %s/%s (%s): API error %s",
                    tracked.namespace,
                    tracked.name,
                    reason,
                    exc.status,
                )

    async def _warn(self, tracked: Tracked, reason: str, message: str) -> None:
        """A Warning Event, once per distinct message."""
        if message not in tracked.told:
            tracked.told.add(message)
            await self._job_event(tracked, reason, message, "Warning")

    async def _create(self, path: str, body: dict[str, Any]) -> bool:
        """Create ``body`` in ``path``; False when it exists already."""
        try:
            await kube.request(self.api, "POST", path, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        return True

    async def _patch(self, path: str, body: dict[str, Any]) -> None:
        await kube.request(
            self.api, "PATCH", path, body, content_type="application/merge-patch+json"
        )

    async def _exists(self, path: str) -> bool:
        try:
            await kube.request(self.api, "GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def _delete(self, path: str) -> None:
        try:
            await kube.request(self.api, "DELETE", path)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _closing(exc: ApiException) -> bool:
    """Refused because the namespace is being deleted (nothing more to make there)."""
    return exc.status == 403 and "being terminated" in kube.refusal(exc).message


def _parse_time(text: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return dt.datetime.now(dt.UTC)
