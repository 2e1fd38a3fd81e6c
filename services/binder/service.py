"""The binder: one API write per pod, and the messages people read.

A decision becomes ONE ``pods/binding`` whose metadata carries the grant annotations
(Tessera's own, plus HAMi's or Volcano's with ``compat.annotations``), so the node and
the grant land together. Up to ``bind_concurrency`` binds run at once, with no per-node
lock. Transient API errors (429, 5xx, timeouts) are retried with backoff. Any other
answer is read, never retried blindly: the refusal's ``Status`` (shared/kube.py
``refusal``) and, for a conflict, the pod as it is now (:func:`read_conflict`: already
bound this way by an earlier try is a success) give ``AllocationBindFailed`` its cause
(shared/events.py ``BindCause``), which the allocator answers by releasing the
reservation and the coordinator by placing the pod again, at once, after a backoff, or
not at all. Only a refusal the pod's owner can act on (an admission policy's, say) is
told to them, as a ``FailedScheduling`` Event; a gated pod, one gone or bound elsewhere,
the API server out of reach, or the binder's own account denied (the operator's to fix,
logged) are not.

A pod whose claimed devices have binding conditions is bound only once they are met,
in a task of its own (conditions.py).

Success publishes ``AllocationBound`` and a ``Scheduled`` Event like kube-scheduler's
(unless ``scheduler.scheduledEvents`` is off: then a bind is the Binding alone). The
Events wait in a queue written one at a time beside the binds (scheduled.py):
under a burst the API server spends itself on Bindings first, which is what starts
pods, and the Events follow as it has room. Like kube-scheduler's event broadcaster
(1,000 queued, the newest dropped when full), the queue is bounded; past
``SCHEDULED_BACKLOG`` the oldest Event is dropped and counted
(``tessera_scheduled_events_dropped``), and at shutdown what is still queued is written for up to
``FLUSH_S``.
``AllocationFailed`` (and the coordinator's ``PodWaiting``) becomes a ``FailedScheduling``
Event and ``PodScheduled=False`` condition on each pod, with the per-node reasons; a
message is not repeated to a pod. The node a preemptor will go to is written as its
``status.nominatedNodeName`` (nominated.py).

``AllocationPreempting``: each victim gets a ``Preempted`` Event naming the gang and why,
the ``DisruptionTarget`` condition (reason ``PreemptionByScheduler``, as kube-scheduler
sets it), and is deleted (uid precondition, so a namesake is never hit) with its own
grace period or ``scheduler.evictionGraceS``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any, Literal, NamedTuple

from kubernetes_asyncio.client import ApiException

from services.binder import claims, conditions
from services.binder.nominated import Nominator
from services.binder.scheduled import ScheduledEvents
from shared import events as ev
from shared import kube
from shared.config import grant_key
from shared.core import annotations as ann
from shared.core.model import PodRef, PodUID
from shared.metrics import MILLISECONDS
from shared.runtime import Runtime, Service, handles
from shared.telemetry import span

log = logging.getLogger(__name__)

PREEMPTED = kube.Condition("DisruptionTarget", "True", "PreemptionByScheduler")
"""The condition kube-scheduler sets on a victim."""
UNSCHEDULABLE = kube.Condition("PodScheduled", "False", "Unschedulable")
RETRIES = 5
TRANSIENT = {429, 500, 502, 503, 504}
DENIED = "cannot create resource"
"""What the API server's authorizer writes when it denies the binder's own account
(``... User "system:serviceaccount:tessera:binder" cannot create resource
"pods/binding" ...``): deploy/kustomize/base/rbac.yaml is missing a verb."""


class Refused(NamedTuple):
    """A Binding not made: the cause the coordinator acts on and the words for people."""

    cause: ev.BindCause
    why: str


def read_refusal(answer: kube.ApiStatus) -> Refused:
    """What a refused Binding means, but for a conflict (:func:`read_conflict` reads
    the pod) and a transient answer still being retried."""
    said = answer.message or answer.reason or str(answer.code)
    if answer.code == 404:
        return Refused("gone", f"the pod no longer exists ({said})")
    if answer.code in TRANSIENT:
        return Refused("transient", f"API error {answer.code} {answer.reason}: {said}")
    return Refused("refused", f"the API server refused the Binding ({answer.code}): {said}")


def read_conflict(
    decided: ev.AllocationDecided, answer: kube.ApiStatus, pod: Mapping[str, Any] | None
) -> Refused | None:
    """What a Binding refused with 409 Conflict means, from the pod as read just after
    (``None``: not found): None when it is bound as decided (an earlier try of this very
    bind succeeded). The API server answers 409 alike to a pod bound already, one with
    scheduling gates, one being deleted and a namesake (the ``uid`` precondition)."""
    said = answer.message or answer.reason
    if pod is None:
        return Refused("gone", f"the pod no longer exists ({said})")
    meta, spec = pod["metadata"], pod.get("spec") or {}
    if meta.get("uid") != decided.pod.uid:
        return Refused("gone", "the pod was replaced by another of the same name")
    node = spec.get("nodeName")
    if node == decided.node and ann.read_grants(meta.get("annotations") or {}) == decided.grants:
        return None
    if node:
        return Refused("taken", f"the pod is already bound to {node}")
    if meta.get("deletionTimestamp"):
        return Refused("gone", f"the pod is being deleted ({said})")
    gates = [str(g.get("name")) for g in spec.get("schedulingGates") or ()]
    if gates:
        return Refused("gated", f"the pod waits for its scheduling gates {', '.join(gates)}")
    return Refused("refused", f"conflict: {said}")


class Binder(Service):
    """Owns the API writes of a placement: Bindings, Events, conditions, evictions."""

    NAME = "binder"

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        self.told: dict[PodUID, str] = {}
        self.bound: set[PodUID] = set()
        """Pods this binder bound: a late failure message must not reach them."""
        m = rt.metrics
        self.binds = m.counter("tessera_binds", "Pods bound (Binding written).")
        self.bind_failures = m.counter(
            "tessera_bind_failures", "Bindings that failed (the reservation is released)."
        )
        self.stage = m.stages()
        self.e2e = m.histogram(
            "volcano_e2e_scheduling_latency_milliseconds",
            "From a pod's creation to its Binding (ms).",
            MILLISECONDS,
        )
        self.scheduled = ScheduledEvents(
            rt.metrics, lambda pod, said: self._tell(pod, "Scheduled", said, "Normal")
        )
        self.waits = conditions.Waits(
            rt,
            lambda: self.api,
            self._bind,
            self._settle,
            lambda pod, said: self._tell(pod, conditions.PENDING, said, "Normal"),
        )
        """Binds waiting for their devices' binding conditions (conditions.py)."""
        self.nominator = Nominator()
        """``status.nominatedNodeName`` of preemptors (nominated.py)."""
        self.key = grant_key(rt.cfg)
        if self.key is None:
            log.warning("security.grantKeyFile is not set: grants are written unsigned")

    def concurrency(self) -> int:
        """Binds in flight at once: ``scheduler.bindConcurrency`` (no per-node lock: each Binding
        carries its node and grant together)."""
        return self.rt.cfg.scheduler.bind_concurrency

    async def start(self) -> None:
        """At stop, the ``Scheduled`` Events still queued are written (for up to
        ``FLUSH_S``)."""
        self.rt.on_stop(self.scheduled.flush)
        self.rt.on_stop(self.waits.stop)

    def tasks(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The writer of the ``Scheduled`` Events, one at a time beside the binds."""
        return {"scheduled-events": self.scheduled.run()}

    @handles(ev.AllocationFailed, ev.PodWaiting)
    async def on_allocation_failed_or_pod_waiting(self, event: ev.Refusal) -> None:
        """Tell each pod why it was not placed (once per message), and where it will go
        once room is made for it (``nominatedNodeName``)."""
        if isinstance(event, ev.AllocationFailed) and event.nominated:
            await self.nominator.write(self.api, event, self.bound)
        for pod in event.pods:
            await self.tell_unschedulable(pod, event.message)

    @handles(ev.PodDeleted)
    async def on_pod_deleted(self, event: ev.PodDeleted) -> None:
        """Forget what was said to a pod that is gone."""
        self.told.pop(event.pod.uid, None)
        self.bound.discard(event.pod.uid)
        self.waits.forget(event.pod.uid)

    @handles(ev.AllocationPreempting)
    async def on_allocation_preempting(self, event: ev.AllocationPreempting) -> None:
        """Evict the victims of a preemption."""
        await asyncio.gather(*(self.evict(v.pods, v.why, event) for v in event.victims))

    async def evict(
        self, pods: tuple[PodRef, ...], why: str, decided: ev.AllocationPreempting
    ) -> None:
        """Tell each victim it is preempted, or moved and where its recreated self will go
        (Event and ``DisruptionTarget`` condition), then delete it with its uid as
        precondition and ``scheduler.evictionGraceS``; one already gone is no error."""
        gang = f"{decided.gang.namespace}/{decided.gang.name}"
        message = f"Preempted by gang {gang} (queue {decided.gang.queue}): {why}"
        grace = self.rt.cfg.scheduler.eviction_grace_s
        for pod in pods:
            to = decided.moves.get(pod.uid)
            if to is not None:  # consolidation: its recreated self has a place kept on ``to``
                moved = (
                    f"Moved by gang {gang} (queue {decided.gang.queue}) to make room: its "
                    f"controller recreates it and Tessera places it on {to}, reserved for "
                    f"{decided.reserved_s:.0f}s"
                )
                await self._tell(pod, "Moved", moved, "Normal", PREEMPTED)
            else:
                await self._tell(pod, "Preempted", message, "Normal", PREEMPTED)
            try:
                if await kube.delete_pod(
                    self.api, pod.namespace, pod.name, uid=pod.uid, grace_s=grace
                ):
                    log.info("evicted %s for gang %s: %s", pod, gang, why)
            except ApiException as exc:
                if exc.status != 404:  # gone already
                    log.warning("cannot evict %s for gang %s: %s", pod, gang, exc.status)

    @handles(ev.AllocationDecided)
    async def on_allocation_decided(self, decided: ev.AllocationDecided) -> None:
        """Write the pod's Binding with its grant; say it is bound, or that it failed."""
        annotations = ann.grant_annotations(
            decided.node,
            decided.grants,
            time.time(),
            self.rt.cfg.compat.annotations,
            key=self.key,
            uid=decided.pod.uid,
        )
        with span(f"bind {decided.pod}") as current:
            current.set_attribute("tessera.service", self.rt.service)
            current.set_attribute("k8s.pod.uid", decided.pod.uid)
            current.set_attribute("k8s.node.name", decided.node)
            current.set_attribute(
                "tessera.devices", ",".join(d.uuid for c in decided.grants for d in c.devices)
            )
            await self.nominator.settled(decided.pod.uid)
            written = await claims.reserve(self.api, decided.pod, decided.claims)
            if not written and conditions.waits(decided):  # bound later (conditions.py)
                self.waits.start(decided, annotations)
                return
            refused = Refused(*written) if written else await self._bind(decided, annotations)
            if refused is not None and decided.claims and not written:
                await claims.undo(self.api, decided.pod, decided.claims)
        await self._settle(decided, refused)

    async def _settle(
        self, decided: ev.AllocationDecided, refused: tuple[ev.BindCause, str] | None
    ) -> None:
        """Say the pod is bound, or that its bind failed (``refused``: why)."""
        if refused is None:
            self.bound.add(decided.pod.uid)
            now = time.time()
            self.binds.add(1)
            self.stage.record(max(0.0, now - decided.emitted_at), {"stage": "bound"})
            if decided.created_at:
                self.e2e.record(max(0.0, now - decided.created_at) * 1000)
            await self.rt.bus.publish(
                ev.AllocationBound(
                    pod=decided.pod,
                    node=decided.node,
                    grants=decided.grants,
                    attempt=decided.attempt,
                )
            )
            if self.rt.cfg.scheduler.scheduled_events:
                devices = ", ".join(
                    f"{d.model or d.uuid}[{d.index}]" for c in decided.grants for d in c.devices
                )
                assigned = f"Successfully assigned {decided.pod} to {decided.node}"
                assigned += f" with {devices}" if devices else ""
                self.scheduled.put(decided.pod, assigned)
            return
        await self._refused(decided, Refused(*refused))

    async def _refused(self, decided: ev.AllocationDecided, refused: Refused) -> None:
        """Say a Binding failed (the allocator releases the reservation) and, where the
        pod's owner can act on the refusal, tell them."""
        log.warning(
            "bind of %s to %s failed (%s): %s",
            decided.pod,
            decided.node,
            refused.cause,
            refused.why,
        )
        self.bind_failures.add(1)
        await self.rt.bus.publish(
            ev.AllocationBindFailed(
                pod=decided.pod,
                node=decided.node,
                error=refused.why,
                attempt=decided.attempt,
                cause=refused.cause,
            )
        )
        if refused.cause != "refused":
            return  # nothing the owner can do: gated, gone, bound elsewhere, out of reach
        if DENIED in refused.why or claims.DENIED in refused.why:
            log.error("the binder's account may not bind pods or write claims: %s", refused.why)
            return
        await self.tell_unschedulable(
            decided.pod, f"Binding to {decided.node} refused; placed again later: {refused.why}"
        )

    async def _bind(
        self, decided: ev.AllocationDecided, annotations: dict[str, str]
    ) -> Refused | None:
        """None when the pod is bound as decided; else why not. Only a transient answer
        is tried again here; any other is read and returned at once."""
        delay = 0.1
        for attempt in range(RETRIES):
            last = attempt == RETRIES - 1
            try:
                await kube.bind(self.api, decided.pod, decided.node, annotations)
                return None
            except ApiException as exc:
                answer = kube.refusal(exc)
                if answer.code == 409:
                    return await self._conflict(decided, answer)
                if answer.code not in TRANSIENT or last:
                    return read_refusal(answer)
            except kube.UNREACHABLE as exc:
                if last:
                    return Refused("transient", f"API unreachable: {exc}")
            await asyncio.sleep(delay)
            delay *= 2
        return Refused("transient", "retries exhausted")

    async def _conflict(
        self, decided: ev.AllocationDecided, answer: kube.ApiStatus
    ) -> Refused | None:
        """Read the pod to learn which conflict it was (:func:`read_conflict`)."""
        pod = decided.pod
        try:
            obj = await kube.request(
                self.api, "GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            )
        except ApiException as exc:
            if exc.status == 404:
                obj = None
            else:
                said = answer.message or answer.reason
                return Refused("transient", f"{said}; the pod cannot be read ({exc.status})")
        except kube.UNREACHABLE as exc:
            return Refused("transient", f"{answer.message}; the pod cannot be read: {exc}")
        return read_conflict(decided, answer, obj)

    async def tell_unschedulable(self, pod: PodRef, message: str) -> None:
        """Write ``FailedScheduling`` and ``PodScheduled=False`` on a pod, unless this message was
        its last one or this binder bound it (a late refusal must not reach it)."""
        if self.told.get(pod.uid) == message or pod.uid in self.bound:
            return
        self.told[pod.uid] = message
        await self._tell(pod, "FailedScheduling", message, "Warning", UNSCHEDULABLE)

    async def _tell(
        self,
        pod: PodRef,
        reason: str,
        message: str,
        kind: Literal["Normal", "Warning"],
        condition: kube.Condition | None = None,
    ) -> None:
        await kube.tell(
            self.api,
            pod,
            reason=reason,
            message=message,
            kind=kind,
            component="tessera-binder",
            condition=condition,
        )
