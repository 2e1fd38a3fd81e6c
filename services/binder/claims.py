"""The ResourceClaims the allocator allocated for a pod, written before its Binding.

For each claim of the decision (``AllocationDecided.claims``): read it, check it is the
claim that was decided (its UID) and that nobody allocated it meanwhile, then write its
``status.allocation`` and add the pod to ``status.reservedFor`` in one status update,
trying again on a conflict. The kubelet starts a pod only once its claims are reserved
for it, so this comes before the Binding (docs/dra.md). A Binding that fails undoes it
(:func:`undo`): the pod leaves ``reservedFor`` and, when no one else is left there, the
allocation Tessera wrote is cleared, so the devices are free again for the allocator
(services/device_allocator/dra.py sees the claim deallocated).

Since Kubernetes 1.36 the API server authorizes writes of these two fields through the
``resourceclaims/binding`` subresource as well as ``resourceclaims/status``: the binder's
ClusterRole has both (deploy/kustomize/base/rbac.yaml).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client import ApiException

from shared import events as ev
from shared import kube
from shared.core.model import PodRef

log = logging.getLogger(__name__)

RESOURCE = "/apis/resource.k8s.io/v1"
CONFLICT_RETRIES = 5
DENIED = 'cannot update resource "resourceclaims/'
"""What the API server writes when the binder's own account may not write a claim's
allocation (deploy/kustomize/base/rbac.yaml lacks a verb): the operator's to fix."""


def _path(claim: ev.ClaimAllocation) -> str:
    return f"{RESOURCE}/namespaces/{claim.namespace}/resourceclaims/{claim.name}"


def _results(allocation: dict[str, Any] | None) -> object:
    return ((allocation or {}).get("devices") or {}).get("results")


def _consumer(pod: PodRef) -> dict[str, str]:
    return {"resource": "pods", "name": pod.name, "uid": pod.uid}


async def _update(
    api: kube.Client,
    claim: ev.ClaimAllocation,
    change: Callable[[dict[str, Any]], str | None],
) -> str | None:
    """Read the claim, ``change`` its status (it returns why it cannot), write it back;
    a conflict reads it again. None when written (or nothing to do); else why not."""
    for _ in range(CONFLICT_RETRIES):
        try:
            obj = await kube.request(api, "GET", _path(claim))
        except ApiException as exc:
            if exc.status == 404:
                return f"resourceclaim {claim.namespace}/{claim.name} not found"
            raise
        if claim.uid and obj["metadata"].get("uid") != claim.uid:
            return f"resourceclaim {claim.namespace}/{claim.name} was replaced"
        obj.setdefault("status", {})
        why = change(obj["status"])
        if why is not None:
            return why or None
        try:
            await kube.request(api, "PUT", f"{_path(claim)}/status", obj)
            return None
        except ApiException as exc:
            if exc.status != 409:
                said = kube.refusal(exc)
                return f"resourceclaim {claim.namespace}/{claim.name}: {said.message or exc}"
    return f"resourceclaim {claim.namespace}/{claim.name}: conflicts, {CONFLICT_RETRIES} tries"


async def reserve(
    api: kube.Client, pod: PodRef, claims: tuple[ev.ClaimAllocation, ...]
) -> tuple[ev.BindCause, str] | None:
    """Write each claim's allocation and reserve it for ``pod``: None when every one is
    written, else why not, as a failed Binding's cause and words (those written are
    undone)."""
    try:
        why = await _reserve(api, pod, claims)
    except kube.UNREACHABLE as exc:
        return "transient", f"API unreachable writing the pod's ResourceClaims: {exc}"
    except ApiException as exc:
        return "refused", f"the pod's ResourceClaims cannot be read ({exc.status}): {exc.reason}"
    return ("refused", why) if why else None


async def _reserve(api: kube.Client, pod: PodRef, claims: tuple[ev.ClaimAllocation, ...]) -> str:
    done: list[ev.ClaimAllocation] = []
    for claim in claims:

        def change(status: dict[str, Any], claim: ev.ClaimAllocation = claim) -> str | None:
            allocation = status.get("allocation")
            if allocation and _results(allocation) != _results(claim.allocation):
                return f"resourceclaim {claim.namespace}/{claim.name} was allocated meanwhile"
            reserved = status.get("reservedFor") or []
            if allocation and any(r.get("uid") == pod.uid for r in reserved):
                return ""  # written before (a decision delivered again)
            if not allocation:
                status["allocation"] = claim.allocation
            status["reservedFor"] = [*reserved, _consumer(pod)]
            return None

        why = await _update(api, claim, change)
        if why:
            await undo(api, pod, tuple(done))
            return why
        done.append(claim)
    return ""


async def undo(api: kube.Client, pod: PodRef, claims: tuple[ev.ClaimAllocation, ...]) -> None:
    """The pod was not bound: it leaves each claim's ``reservedFor``, and the allocation
    Tessera wrote is cleared when no one else is left there. Never raises: a claim it
    cannot write is logged (kube-controller-manager's resourceclaim controller clears
    claims whose consumers are gone)."""
    for claim in claims:

        def change(status: dict[str, Any], claim: ev.ClaimAllocation = claim) -> str | None:
            before = status.get("reservedFor") or []
            reserved = [r for r in before if r.get("uid") != pod.uid]
            ours = not claim.reserve_only and _results(status.get("allocation")) == _results(
                claim.allocation
            )
            if len(reserved) == len(before) and not (ours and not reserved):
                return ""  # nothing of this pod's to undo
            if reserved:
                status["reservedFor"] = reserved
            else:
                status.pop("reservedFor", None)
                if ours:
                    status.pop("allocation", None)
            return None

        try:
            why = await _update(api, claim, change)
        except (ApiException, TimeoutError, OSError) as exc:  # kube.UNREACHABLE
            why = str(exc)
        if why:
            log.warning("cannot give back %s/%s of %s: %s", claim.namespace, claim.name, pod, why)
