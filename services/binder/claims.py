"""The ResourceClaims the allocator allocated for a pod, written before its Binding.

For each claim of the decision (``AllocationDecided.claims``): read it, check it is the
claim that was decided (its UID) and that nobody allocated it meanwhile, then write its
``status.allocation`` and add the pod to ``status.reservedFor`` in one status update,
trying again on a conflict. The kubelet starts a pod only once its claims are reserved
for it, so this comes before the Binding (docs/dra.md). A Binding that fails undoes it
(:func:`undo`): the pod leaves ``reservedFor`` and, when no one else is left there, the
allocation Tessera wrote is cleared, so the devices are free again for the allocator
(services/device_allocator/dra.py sees the claim deallocated).

The claim of a pod's extended resources served through DRA (``mappings`` set, its name
empty: shared/core/dra/extended.py) is created first, as kube-scheduler's PreBind
creates it: ``generateName`` ``<pod>-extended-resources-``, the annotation
``resource.kubernetes.io/extended-resource-claim: "true"``, the pod as its controlling
owner, the decided ``spec.devices``. Its allocation and reservation are written as for
any claim, then the pod's ``status.extendedResourceClaimStatus`` (each container's
resource mapped to its request, and the claim's name), all before the Binding. The
pod's status names the claim from then on, so a decision delivered again reuses it; a
failed Binding deletes it.

Before it writes an allocation the binder adds kube-scheduler's finalizer
``resource.kubernetes.io/delete-protection`` to the claim (a plain update: the status
subresource ignores metadata), as kube-scheduler's PreBind does: kube-controller-manager's
resourceclaim controller clears the allocation of a claim whose last consumer is gone
only when it carries it, so without it a claim written by hand would hold its devices
for good. :func:`undo`, clearing an allocation of its own, drops it again.

Since Kubernetes 1.36 the API server authorizes writes of these two fields through the
``resourceclaims/binding`` subresource as well as ``resourceclaims/status``: the binder's
ClusterRole has both, and ``update`` on ``resourceclaims`` for the finalizer
(deploy/kustomize/base/rbac.yaml).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiException

from shared import events as ev
from shared import kube
from shared.core.dra import binding, extended
from shared.core.model import PodRef

log = logging.getLogger(__name__)

RESOURCE = "/apis/resource.k8s.io/v1"
CONFLICT_RETRIES = 5
DENIED = 'cannot update resource "resourceclaims/'
FINALIZER = "resource.kubernetes.io/delete-protection"
"""On a claim whose allocation a scheduler wrote: kube-controller-manager deallocates it
once no consumer is left (and removes the finalizer)."""
"""What the API server writes when the binder's own account may not write a claim's
allocation (deploy/kustomize/base/rbac.yaml lacks a verb): the operator's to fix."""


def claim_path(namespace: str, name: str) -> str:
    """The API path of one ResourceClaim."""
    return f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"


def _path(claim: ev.ClaimAllocation) -> str:
    return claim_path(claim.namespace, claim.name)


async def read_claim(api: kube.Client, namespace: str, name: str, uid: str) -> dict[str, Any] | str:
    """The claim as the API server holds it now, or why not: gone, or replaced by a
    namesake (``uid`` not its own; empty: not checked)."""
    try:
        obj: dict[str, Any] = await kube.request(api, "GET", claim_path(namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return f"resourceclaim {namespace}/{name} not found"
        raise
    if uid and obj["metadata"].get("uid") != uid:
        return f"resourceclaim {namespace}/{name} was replaced"
    return obj


def _results(allocation: dict[str, Any] | None) -> object:
    return ((allocation or {}).get("devices") or {}).get("results")


def _consumer(pod: PodRef) -> dict[str, str]:
    return {"resource": "pods", "name": pod.name, "uid": pod.uid}


async def _update(
    api: kube.Client,
    claim: ev.ClaimAllocation,
    change: Callable[[dict[str, Any]], str | None],
    *,
    own: bool = False,
) -> str | None:
    """Read the claim, ``change`` its status (it returns why it cannot), write it back;
    a conflict reads it again. None when written (or nothing to do); else why not.
    ``own``: the allocation is Tessera's to write or clear, so :data:`FINALIZER` is
    added before an allocation is written and dropped once it is cleared."""
    for _ in range(CONFLICT_RETRIES):
        obj = await read_claim(api, claim.namespace, claim.name, claim.uid)
        if isinstance(obj, str):
            return obj
        obj.setdefault("status", {})
        why = change(obj["status"])
        if why is not None:
            return why or None
        finalizers = list(obj["metadata"].get("finalizers") or [])
        allocated = bool(obj["status"].get("allocation"))
        try:
            if own and allocated and FINALIZER not in finalizers:
                status = obj["status"]
                obj["metadata"]["finalizers"] = [*finalizers, FINALIZER]
                obj = await kube.request(api, "PUT", _path(claim), obj)
                obj["status"] = status
            written = await kube.request(api, "PUT", f"{_path(claim)}/status", obj)
            if own and not allocated and FINALIZER in finalizers:
                written["metadata"]["finalizers"] = [f for f in finalizers if f != FINALIZER]
                await kube.request(api, "PUT", _path(claim), written)
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


def _pod_path(pod: PodRef) -> str:
    return f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"


async def made(api: kube.Client, pod: PodRef) -> str:
    """The claim the pod's status names for its extended resources ('' when none): the
    name of the one :func:`reserve` created."""
    try:
        obj = await kube.request(api, "GET", _pod_path(pod))
    except ApiException as exc:
        if exc.status == 404:
            return ""
        raise
    if (obj.get("metadata") or {}).get("uid") != pod.uid:
        return ""
    status = (obj.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = str(status.get("resourceClaimName") or "")
    if not name:
        return ""
    # still there, the pod's (a failed bind deleted the one it named before)
    claim = await read_claim(api, pod.namespace, name, "")
    if isinstance(claim, str):
        return ""
    owners = (claim.get("metadata") or {}).get("ownerReferences") or ()
    return name if any(o.get("uid") == pod.uid for o in owners) else ""


async def _create(
    api: kube.Client, pod: PodRef, claim: ev.ClaimAllocation
) -> ev.ClaimAllocation | str:
    """The claim of the pod's extended resources, created (or the one its status names
    already); why not, as words."""
    if name := await made(api, pod):
        return msgspec.structs.replace(claim, name=name)
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod.name}-extended-resources-",
            "namespace": pod.namespace,
            "annotations": {extended.ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.name,
                    "uid": pod.uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": claim.devices},
    }
    path = f"{RESOURCE}/namespaces/{pod.namespace}/resourceclaims"
    try:
        created = await kube.request(api, "POST", path, obj)
    except ApiException as exc:
        said = kube.refusal(exc)
        return f"cannot create the claim of {pod}'s extended resources: {said.message or exc}"
    meta = created["metadata"]
    return msgspec.structs.replace(claim, name=str(meta["name"]), uid=str(meta["uid"]))


async def _name_it(api: kube.Client, pod: PodRef, claim: ev.ClaimAllocation) -> str:
    """Write the pod's ``status.extendedResourceClaimStatus`` naming ``claim``."""
    status = {
        "requestMappings": [
            {"containerName": c, "resourceName": r, "requestName": q} for c, r, q in claim.mappings
        ],
        "resourceClaimName": claim.name,
    }
    body = {"status": {"extendedResourceClaimStatus": status}}
    try:
        await kube.request(
            api,
            "PATCH",
            f"{_pod_path(pod)}/status",
            body,
            content_type="application/merge-patch+json",
        )
    except ApiException as exc:
        said = kube.refusal(exc)
        return f"pod {pod}: cannot name its extended resources' claim: {said.message or exc}"
    return ""


async def _reserve(api: kube.Client, pod: PodRef, claims: tuple[ev.ClaimAllocation, ...]) -> str:
    done: list[ev.ClaimAllocation] = []
    for claim in claims:
        if claim.mappings and not claim.name:
            made = await _create(api, pod, claim)
            if isinstance(made, str):
                await undo(api, pod, tuple(done))
                return made
            claim = made

        def change(status: dict[str, Any], claim: ev.ClaimAllocation = claim) -> str | None:
            allocation = status.get("allocation")
            if allocation and _results(allocation) != _results(claim.allocation):
                return f"resourceclaim {claim.namespace}/{claim.name} was allocated meanwhile"
            reserved = status.get("reservedFor") or []
            if allocation and any(r.get("uid") == pod.uid for r in reserved):
                return ""  # written before (a decision delivered again)
            if not allocation:  # stamped as kube-scheduler does: binding timeouts count from it
                status["allocation"] = {
                    **claim.allocation,
                    "allocationTimestamp": binding.timestamp(time.time()),
                }
            status["reservedFor"] = [*reserved, _consumer(pod)]
            return None

        why = await _update(api, claim, change, own=not claim.reserve_only)
        if not why and claim.mappings:
            why = await _name_it(api, pod, claim)
            if why:
                done.append(claim)
        if why:
            await undo(api, pod, tuple(done))
            return why
        done.append(claim)
    return ""


async def _delete(api: kube.Client, pod: PodRef, claim: ev.ClaimAllocation) -> None:
    """Delete the claim made for the pod's extended resources (its name from the pod's
    status when the decision did not know it), its :data:`FINALIZER` dropped first as
    kube-scheduler does (nothing else would clear it without kube-controller-manager)."""
    name = claim.name or await made(api, pod)
    if not name:
        return
    path = claim_path(pod.namespace, name)
    try:
        for _ in range(CONFLICT_RETRIES):  # the finalizer first, or the claim would wait
            obj = await kube.request(api, "GET", path)
            finalizers = obj["metadata"].get("finalizers") or []
            if FINALIZER not in finalizers:
                break
            obj["metadata"]["finalizers"] = [f for f in finalizers if f != FINALIZER]
            try:
                await kube.request(api, "PUT", path, obj)
                break
            except ApiException as exc:
                if exc.status != 409:
                    raise
        await kube.request(api, "DELETE", path)
    except ApiException as exc:
        if exc.status != 404:
            raise


async def undo(api: kube.Client, pod: PodRef, claims: tuple[ev.ClaimAllocation, ...]) -> None:
    """The pod was not bound: it leaves each claim's ``reservedFor``, and the allocation
    Tessera wrote is cleared when no one else is left there. Never raises: a claim it
    cannot write is logged (kube-controller-manager's resourceclaim controller clears
    claims whose consumers are gone)."""
    for claim in claims:
        if claim.mappings:  # made for the pod: deleted (the claim is the pod's alone)
            try:
                await _delete(api, pod, claim)
            except (ApiException, TimeoutError, OSError) as exc:  # kube.UNREACHABLE
                log.warning("cannot delete the claim of %s's extended resources: %s", pod, exc)
            continue

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
            why = await _update(api, claim, change, own=not claim.reserve_only)
        except (ApiException, TimeoutError, OSError) as exc:  # kube.UNREACHABLE
            why = str(exc)
        if why:
            log.warning("cannot give back %s/%s of %s: %s", claim.namespace, claim.name, pod, why)
