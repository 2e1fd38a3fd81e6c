"""Binds that wait for their devices' binding conditions (DRADeviceBindingConditions).

A device may need work outside the node before a pod can use it (a fabric-attached card
to be attached, say): its slice gives it ``bindingConditions``, which the allocation's
results carry. Once the pod's claims are written (claims.py), kube-scheduler's
DynamicResources PreBind tells the pod (a Normal Event ``BindingConditionsPending``,
"waiting for binding conditions for device on node N") and waits until the device's
controller reports every condition ``True`` in the claim's ``status.devices``; a failure
condition ``True`` or the binding timeout (``scheduler.bindingTimeoutS``, from the
allocation's ``allocationTimestamp``) fails the bind. The reading is
shared/core/dra/binding.py. The binder does the same:

- The wait runs in a task of its own (:class:`Waits`), never in the bus handler: a
  handler waiting minutes would hold a ``bindConcurrency`` slot and outlive the
  JetStream ack wait (``nats.ackWaitS``), which would deliver the decision again.
- The claims are read every ``POLL_S`` (kube-scheduler's interval); ready, the Binding
  is written as for any pod; failed or timed out, the claims are undone (the failed one
  deallocated when it is reserved for nobody else, as kube-scheduler's PostFilter
  does), ``AllocationBindFailed`` (cause ``refused``: the allocator releases, the
  coordinator places the pod again after its backoff) is published and the pod told.
- The allocator keeps such a pod's reservation ``bindingTimeoutS`` longer
  (services/device_allocator/pods.py), so its devices go to no one else meanwhile.
- At shutdown each wait still running is given up the same way with cause
  ``transient`` (placed again at once, by the next binder). A binder that dies without
  that leaves the claims reserved: the allocator's expiry releases the reservation and
  the pod is placed again; its claims, allocated and reserved for it with binding
  conditions, ride along in the next decision to be checked again (shared/core/claims.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiException

from services.binder import claims
from shared import events as ev
from shared import kube
from shared.core.dra import binding
from shared.core.model import PodRef, PodUID
from shared.runtime import Runtime

log = logging.getLogger(__name__)

POLL_S = 5.0
"""How often a waiting pod's claims are read: kube-scheduler's interval. Each read is a
GET per claim (kube-scheduler reads its informer cache), so polling faster would cost
the API server reads for every waiting pod; 5 s is what users of kube-scheduler already
wait at most after their device is ready."""
STOP_S = 5.0
"""At shutdown, how long giving up the waits may take."""
PENDING = "BindingConditionsPending"

Refused = tuple[ev.BindCause, str]
"""Why a bind failed: its cause and the words for people (service.py ``Refused``)."""
Bind = Callable[[ev.AllocationDecided, dict[str, str]], Awaitable[Refused | None]]
Settle = Callable[[ev.AllocationDecided, Refused | None], Awaitable[None]]
Tell = Callable[[PodRef, str], Awaitable[None]]


def waits(decided: ev.AllocationDecided) -> bool:
    """Whether the decision's claims hold a device with binding conditions."""
    return any(binding.conditioned(c.allocation) for c in decided.claims)


class Waits:
    """The binds waiting for binding conditions, one task each, by pod."""

    def __init__(
        self, rt: Runtime, api: Callable[[], kube.Client], bind: Bind, settle: Settle, tell: Tell
    ) -> None:
        self.rt, self._api = rt, api
        self.bind, self.settle, self.tell = bind, settle, tell
        """The binder's: write the Binding (why not); say the pod is bound or why not
        (published, the pod told); write the pod's ``BindingConditionsPending`` Event."""
        self.waiting: dict[PodUID, tuple[ev.AllocationDecided, asyncio.Task[None]]] = {}

    @property
    def api(self) -> kube.Client:
        """The binder's API client."""
        return self._api()

    def start(self, decided: ev.AllocationDecided, annotations: dict[str, str]) -> None:
        """Wait for the pod's devices in a task of its own, then bind or fail it (a
        decision delivered again while it waits is not waited for twice)."""
        if decided.pod.uid in self.waiting:
            return
        task = self.rt.spawn(
            self._wait(decided, annotations), f"binding-conditions-{decided.pod.uid}", finite=True
        )
        self.waiting[decided.pod.uid] = (decided, task)

    def forget(self, uid: PodUID) -> None:
        """The pod is gone: its wait ends (the allocator released it; the claims are
        kube-controller-manager's to give back)."""
        found = self.waiting.pop(uid, None)
        if found is not None:
            found[1].cancel()

    async def _claims(self, decided: ev.AllocationDecided) -> list[Mapping[str, Any]]:
        """The decision's claims with binding conditions, as they are now. Raises
        LookupError when one is gone or replaced."""
        found: list[Mapping[str, Any]] = []
        for claim in decided.claims:
            if not binding.conditioned(claim.allocation):
                continue
            name = claim.name or await claims.made(self.api, decided.pod)
            if not name:
                raise LookupError(f"the claim of {decided.pod}'s extended resources is gone")
            obj = await claims.read_claim(self.api, claim.namespace, name, claim.uid)
            if isinstance(obj, str):
                raise LookupError(obj)
            found.append(obj)
        return found

    async def _wait(self, decided: ev.AllocationDecided, annotations: dict[str, str]) -> None:
        pod, node = decided.pod, decided.node
        await self.tell(pod, f"waiting for binding conditions for device on node {node}")
        timeout_s = self.rt.cfg.scheduler.binding_timeout_s
        deadline = time.time() + timeout_s
        seen = binding.Readiness("waiting", "the claims not read yet")
        while True:
            try:
                seen = binding.pod_readiness(await self._claims(decided), time.time(), timeout_s)
            except LookupError as exc:
                seen = binding.Readiness("failed", str(exc))
            except ApiException as exc:  # read again next round
                log.warning("%s: its ResourceClaims cannot be read: %s", pod, exc.reason)
            except kube.UNREACHABLE as exc:
                log.warning("%s: its ResourceClaims cannot be read: %s", pod, exc)
            if seen.state == "waiting" and time.time() >= deadline:
                seen = binding.Readiness("failed", f"device binding timeout: {seen.why}")
            if seen.state != "waiting":
                break
            await asyncio.sleep(POLL_S)
        self.waiting.pop(pod.uid, None)
        if seen.state != "ready":
            await self._give_up(decided, "refused", seen.why, seen.claim)
            return
        log.info("%s: binding conditions met on %s", pod, node)
        refused = await self.bind(decided, annotations)
        if refused is not None:
            await claims.undo(self.api, pod, decided.claims)
        await self.settle(decided, refused)

    async def _give_up(
        self, decided: ev.AllocationDecided, cause: ev.BindCause, why: str, failed: str = ""
    ) -> None:
        """Undo the pod's claims (``failed``, the claim whose devices failed or timed
        out, deallocated unless reserved for another pod) and say the bind failed."""
        undone = tuple(
            msgspec.structs.replace(c, reserve_only=False) if failed and c.name == failed else c
            for c in decided.claims
        )
        await claims.undo(self.api, decided.pod, undone)
        await self.settle(decided, (cause, why))

    async def stop(self) -> None:
        """Give up every wait still running (the tasks are stopped by now): its claims
        undone, its pod placed again at once (for up to ``STOP_S``)."""
        left = list(self.waiting.values())
        self.waiting.clear()
        if not left:
            return
        why = "the binder stopped while the pod waited for its devices' binding conditions"
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_S):
                for decided, task in left:
                    task.cancel()
                    await self._give_up(decided, "transient", why)
        log.info("%d bind(s) waiting for binding conditions given up at shutdown", len(left))
