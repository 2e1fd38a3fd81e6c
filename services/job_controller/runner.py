"""Running the controller's Volcano Jobs: :class:`JobRunner` keeps each Job and its pods
and answers each request of a Job under one lock, so a Job's pods and status change in
one order. The answer is Volcano's processNextReq: the action a policy decides
(services/job_controller/policies.py), now or after its timeout, then what that action
does in the Job's phase (services/job_controller/lifecycle.py), carried out through the
API (services/job_controller/api.py, resources.py). It also retries what an API error
left undone and deletes a finished Job after its ``ttlSecondsAfterFinished``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import replace
from typing import Any

from kubernetes_asyncio.client import ApiException

from services.job_controller import lifecycle, pods, policies, resources
from services.job_controller.api import API_ERRORS, JobApi, closing
from services.job_controller.delayed import Delayed, DelayedActions
from services.job_controller.podview import PodView
from services.job_controller.status import TTL_PHASES
from services.job_controller.timers import Timers
from services.job_controller.tracked import JobKey, Tracked
from shared import kube

log = logging.getLogger(__name__)

MAX_STEPS = 8
"""How many actions one event may lead to: each phase change syncs the Job again (as
Volcano's controller does on the Job's update), and a finished Job's sync changes none."""
RETRY_S = 5.0
"""How soon a Job whose last sync could not do everything (an API error, a claim it names
not there yet) is synced again."""


class JobRunner:
    """Owns the Jobs of this replica, their pods as last seen, and the lock each request
    of a Job is handled under."""

    def __init__(self, api: JobApi) -> None:
        self.api = api
        self.jobs: dict[JobKey, Tracked] = {}
        self.pods: dict[JobKey, dict[str, PodView]] = {}
        """(namespace, Job name) -> its pods by name, from the watch (and the pods this
        controller created or deleted, until the watch says so)."""
        self.lock = asyncio.Lock()
        self.delayed = DelayedActions()
        self.timers = Timers()

    def forget(self, key: JobKey) -> tuple[Tracked | None, dict[str, PodView]]:
        """The Job is deleted: it, its pods, and nothing of it waiting any more."""
        self.delayed.forget(key)
        return self.jobs.pop(key, None), self.pods.pop(key, {})

    # --- requests ----------------------------------------------------------------------

    async def guarded(self, tracked: Tracked, req: policies.Request) -> None:
        """Handle ``req`` off the bus (the pod watch, a timer): an API error is logged
        and the Job synced again in ``RETRY_S`` (the bus redelivers its own events)."""
        try:
            await self.handle(tracked, req)
        except API_ERRORS as exc:
            log.warning(
                "job %s/%s: %s not handled (%s); syncing again in %gs",
                tracked.namespace,
                tracked.name,
                req.event,
                getattr(exc, "status", exc),
                RETRY_S,
            )
            self.retry(tracked)

    def retry(self, tracked: Tracked) -> None:
        """Sync the Job again in ``RETRY_S`` (once, however often asked meanwhile)."""
        if not tracked.retrying:
            tracked.retrying = True
            self.timers.at(RETRY_S, lambda: self._resync(tracked))

    async def _resync(self, tracked: Tracked) -> None:
        async with self.lock:
            tracked.retrying = False
            if self.jobs.get(tracked.key) is tracked and tracked.spec is not None:
                await self.guarded(tracked, policies.Request("OutOfSync"))

    async def handle(self, tracked: Tracked, req: policies.Request) -> None:
        """One event of a Job (under the lock): the action that answers it, now or
        after its policy's timeout (Volcano's processNextReq)."""
        spec = tracked.spec
        assert spec is not None
        self.delayed.cancel_for_pod(tracked.key, req)
        decision = policies.decide(spec, tracked.uid, tracked.status.version, req)
        if decision.delay_s > 0:
            waiting = Delayed(tracked.key, decision)
            if not self.delayed.add(waiting):
                return
            await self.api.event(
                tracked,
                "ExecuteAction",
                f"Execute action {decision.action} after {decision.delay_s:g}s",
            )
            self.timers.at(decision.delay_s, lambda: self._fire(waiting))
            return
        await self._run(tracked, decision)

    async def _run(self, tracked: Tracked, decision: policies.Decision) -> None:
        if decision.action != policies.SYNC:
            await self.api.event(
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
            self.delayed.cancel_scope(tracked.key, decision)
        for _ in range(MAX_STEPS):
            assert tracked.spec is not None
            before = tracked.status.phase
            plan = lifecycle.step(
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
            decision = policies.Decision(policies.SYNC)
        self._expire(tracked)

    async def _fire(self, waiting: Delayed) -> None:
        async with self.lock:
            if not self.delayed.take(waiting):
                return  # cancelled
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
                self.retry(tracked)

    # --- doing what a plan says --------------------------------------------------------

    async def _carry_out(self, tracked: Tracked, plan: lifecycle.Plan) -> None:
        spec = tracked.spec
        assert spec is not None
        status = plan.status
        if plan.teardown:
            status = await resources.teardown(self.api, tracked, status)
        known = self.pods.setdefault(tracked.key, {})
        for name in plan.kill:
            await self.api.kill_pod(tracked, name)
            if name in known:
                known[name] = replace(known[name], deleting=True, out_of_sync=True)
        if plan.setup:
            status, ready = await resources.setup(self.api, tracked, status)
            if not ready:
                self.retry(tracked)
            for task_name, index in plan.create if ready else ():
                task = spec.task(task_name)
                assert task is not None
                body = pods.pod(tracked.ref, spec, task, index, status)
                if await self._create_pod(tracked, body):
                    name = body["metadata"]["name"]
                    known.setdefault(
                        name,
                        PodView(
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
        await self.api.write_status(tracked)

    async def _create_pod(self, tracked: Tracked, body: dict[str, Any]) -> bool:
        try:
            return await self.api.create(f"/api/v1/namespaces/{tracked.namespace}/pods", body)
        except ApiException as exc:
            message = kube.refusal(exc).message
            if closing(exc):
                return False  # its namespace is being deleted, the Job with it
            await self.api.event(
                tracked,
                "FailedCreatePod",
                f"Error creating pod {body['metadata']['name']}: {message}",
                "Warning",
            )
            self.retry(tracked)
            return False

    # --- ttlSecondsAfterFinished -------------------------------------------------------

    def _expire(self, tracked: Tracked) -> None:
        """A finished Job with ``ttlSecondsAfterFinished`` is deleted that long after it
        finished (Volcano's garbage collector; an invalid Job never ran, and stays)."""
        spec, status = tracked.spec, tracked.status
        if spec is None or spec.ttl_s is None or status.phase not in TTL_PHASES:
            return
        if tracked.expiring:
            return
        tracked.expiring = True
        finished = _parse_time(status.since)
        left = spec.ttl_s - (dt.datetime.now(dt.UTC) - finished).total_seconds()
        self.timers.at(max(left, 0.0), lambda: self._collect(tracked))

    async def _collect(self, tracked: Tracked) -> None:
        async with self.lock:
            tracked.expiring = False
            if self.jobs.get(tracked.key) is not tracked or tracked.status.phase not in TTL_PHASES:
                return
            log.info(
                "job %s/%s finished at %s: deleting it (ttlSecondsAfterFinished)",
                tracked.namespace,
                tracked.name,
                tracked.status.since,
            )
            try:
                await self.api.delete_job(tracked)
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
                self.timers.at(RETRY_S, lambda: self._collect(tracked))


def _parse_time(text: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return dt.datetime.now(dt.UTC)
