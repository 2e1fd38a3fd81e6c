"""Preemption that frees DRA devices, on the real API server with the real
kube-controller-manager: a high-priority pod whose claim wants the only card evicts the
low-priority pod holding it through its claim; the controller-manager's resourceclaim
controller makes each pod's claim from its ResourceClaimTemplate, and its garbage
collector deletes the victim's claim once the pod is gone (nothing emulates them). And
a claim written by hand, allocated by Tessera's binder, is deallocated by the
controller-manager once its pod is gone (it carries kube-scheduler's finalizer).

The module runs on the session's cluster with kube-controller-manager (``controllers``,
tests/conftest.py), with one simulated node, ``dp-a``, whose ResourceSlice offers one
card."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, start_pipeline
from tests.integration.test_dra_claims import RESOURCE, card
from tools.localcluster import LocalCluster

pytestmark = pytest.mark.integration
NODE = "dp-a"
SUITE = {"suite": "dra-preemption"}
INVENTORY = {
    "nodes": [
        {
            "name": NODE,
            "labels": SUITE,
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "20"},
            "devices": [],
        }
    ]
}
DRIVER = "dp.tessera.io"
CLASS = "dp-gpu.tessera.io"
HIGH = "tessera-dra-high"


@pytest.fixture(scope="module")
async def pipeline(
    controllers: LocalCluster, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("dra-preemption"), controllers.kubeconfig, nats_admin, INVENTORY
    )
    selector = {"cel": {"expression": f"device.driver == '{DRIVER}'"}}
    await kube.request(
        p.api,
        "POST",
        f"{RESOURCE}/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": CLASS},
            "spec": {"selectors": [selector]},
        },
    )
    await kube.request(
        p.api,
        "POST",
        f"{RESOURCE}/resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [card("A100", 40)],
            },
        },
    )
    await kube.request(
        p.api,
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": HIGH},
            "value": 1000,
        },
    )
    yield p
    await p.close()


@pytest.fixture
async def ns(pipeline: Pipeline) -> AsyncIterator[str]:
    """A fresh namespace with the template ``one-gpu`` (a whole card)."""
    name = await pipeline.namespace()
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}
            }
        },
    }
    path = f"{RESOURCE}/namespaces/{name}/resourceclaimtemplates"
    await kube.request(pipeline.api, "POST", path, template)
    yield name
    found = await kube.request(pipeline.api, "GET", f"/api/v1/namespaces/{name}/pods")
    for item in found["items"]:
        await pipeline.delete(name, item["metadata"]["name"])


def whole_card(name: str, *, priority: str = "") -> dict[str, Any]:
    obj = pod(name, {})
    obj["spec"]["nodeSelector"] = SUITE
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    if priority:
        obj["spec"]["priorityClassName"] = priority
    return obj


async def claim_of(p: Pipeline, ns: str, name: str) -> dict[str, Any]:
    """The claim kube-controller-manager made for pod ``name`` from its template."""

    async def made() -> str | None:
        statuses = (await p.get(ns, name)).get("status", {}).get("resourceClaimStatuses") or []
        return str(statuses[0]["resourceClaimName"]) if statuses else None

    claim = await eventually(made, what=f"the claim of {ns}/{name}")
    found: dict[str, Any] = await kube.request(
        p.api, "GET", f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim}"
    )
    return found


async def test_a_high_priority_claim_preempts_the_pod_holding_the_only_card(
    pipeline: Pipeline, ns: str
) -> None:
    await pipeline.create(ns, whole_card("low"))
    assert await pipeline.node_of(ns, "low") == NODE
    held = await claim_of(pipeline, ns, "low")
    [result] = held["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (NODE, "gpu-0")
    low_uid = (await pipeline.get(ns, "low"))["metadata"]["uid"]
    assert [r["uid"] for r in held["status"]["reservedFor"]] == [low_uid]

    await pipeline.create(ns, whole_card("high", priority=HIGH))
    placed = await pipeline.bound(ns, "high", timeout_s=90)
    assert placed["spec"]["nodeName"] == NODE
    mine = await claim_of(pipeline, ns, "high")
    [result] = mine["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (NODE, "gpu-0")

    async def low_gone() -> bool:
        try:
            await pipeline.get(ns, "low")
        except ApiException as exc:
            return exc.status == 404
        return False

    await eventually(low_gone, what="the low-priority pod evicted")
    preempted = [e for e in await pipeline.events(ns, "low") if e["reason"] == "Preempted"]
    assert preempted, "a Preempted Event on the victim"

    async def victim_claim_gone() -> bool:  # kube-controller-manager's garbage collector
        name = held["metadata"]["name"]
        try:
            await kube.request(
                pipeline.api, "GET", f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}"
            )
        except ApiException as exc:
            return exc.status == 404
        return False

    await eventually(victim_claim_gone, timeout_s=60, what="the victim's claim deleted")


async def test_a_hand_written_claim_is_deallocated_by_the_controller_manager_once_its_pod_goes(
    pipeline: Pipeline, ns: str
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mine"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }
    path = f"{RESOURCE}/namespaces/{ns}/resourceclaims"
    await kube.request(pipeline.api, "POST", path, claim)
    obj = whole_card("user")
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
    await pipeline.create(ns, obj)
    assert await pipeline.node_of(ns, "user") == NODE
    held = await kube.request(pipeline.api, "GET", f"{path}/mine")
    assert held["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert "resource.kubernetes.io/delete-protection" in held["metadata"]["finalizers"]

    await pipeline.delete(ns, "user")

    async def deallocated() -> dict[str, Any] | None:
        found: dict[str, Any] = await kube.request(pipeline.api, "GET", f"{path}/mine")
        status = found.get("status") or {}
        done = not status.get("allocation") and not status.get("reservedFor")
        return found if done and not found["metadata"].get("finalizers") else None

    await eventually(deallocated, timeout_s=60, what="the claim deallocated, its finalizer gone")
    # the card is free again: a second pod naming the same claim gets it
    await pipeline.create(ns, dict(obj, metadata={"name": "again"}))
    assert await pipeline.node_of(ns, "again") == NODE
