"""Extended resources served through DRA, on the real API server: a DeviceClass whose
``extendedResourceName`` is ``nvidia.com/gpu``, one node whose card is offered by
ResourceSlice (as the node agent's DRA driver publishes it) and one whose card is
offered by Tessera's device plugin. A pod asking ``nvidia.com/gpu: 1`` goes to the
device plugin's card first, else to the DRA node as a claim the binder creates
(allocated there, reserved for the pod, named in its
``status.extendedResourceClaimStatus``), with the services' own ServiceAccounts.

=========  ==============================================
node       devices
=========  ==============================================
dx-dra     gpu-0 (ResourceSlice, driver below), no plugin
dx-dp      one A100 through the device plugin
=========  ==============================================
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from shared.core.dra.extended import ANNOTATION
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, start_pipeline, told
from tests.integration.test_dra_claims import RESOURCE, card, put
from tools.localcluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("released_claims")]

SUITE = {"suite": "dra-extended"}
GPU = "nvidia.com/gpu"
DRIVER = "dx.tessera.io"
CLASS = "dx-gpu.tessera.io"
RESOURCES = {"cpu": "4", "memory": "16Gi", "pods": "20"}
A100 = {"model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 1}
INVENTORY = {
    "nodes": [
        {"name": "dx-dra", "labels": {**SUITE, "api": "dra"}, "allocatable": RESOURCES},
        {
            "name": "dx-dp",
            "labels": {**SUITE, "api": "plugin"},
            "allocatable": RESOURCES,
            "devices": [A100],
        },
    ]
}
SLICE = f"dx-dra-{DRIVER}"


@pytest.fixture(scope="module")
async def pipeline(
    controllers: LocalCluster, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("drax"), controllers.kubeconfig, nats_admin, INVENTORY
    )
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
            "extendedResourceName": GPU,
        },
    }
    await put(p.api, f"{RESOURCE}/deviceclasses", device_class)
    made = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": SLICE},
        "spec": {
            "driver": DRIVER,
            "nodeName": "dx-dra",
            "pool": {"name": "dx-dra", "generation": 1, "resourceSliceCount": 1},
            "devices": [card("H100", 80)],
        },
    }
    await put(p.api, f"{RESOURCE}/resourceslices", made)
    yield p
    await kube.request(p.api, "DELETE", f"{RESOURCE}/resourceslices/{SLICE}")
    await kube.request(p.api, "DELETE", f"{RESOURCE}/deviceclasses/{CLASS}")
    await p.close()


def gpu_pod(name: str, selector: dict[str, str]) -> dict[str, Any]:
    obj = pod(name, {GPU: 1})
    obj["spec"]["nodeSelector"] = selector
    return obj


async def made_claims(p: Pipeline, ns: str) -> list[dict[str, Any]]:
    found = await kube.request(p.api, "GET", f"{RESOURCE}/namespaces/{ns}/resourceclaims")
    return [c for c in found["items"] if c["metadata"].get("annotations", {}).get(ANNOTATION)]


async def test_a_gpu_pod_with_only_a_dra_node_gets_a_claim_there(
    pipeline: Pipeline, ns: str
) -> None:
    made = await pipeline.create(ns, gpu_pod("only", {"api": "dra"}))
    assert await pipeline.node_of(ns, "only") == "dx-dra"
    [claim] = await made_claims(pipeline, ns)
    meta = claim["metadata"]
    assert meta["name"].startswith("only-extended-resources-")
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "Pod",
        made["metadata"]["uid"],
        True,
    )
    [request] = claim["spec"]["devices"]["requests"]
    assert request["name"] == "container-0-request-0"
    assert (request["exactly"]["deviceClassName"], request["exactly"]["count"]) == (CLASS, 1)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (DRIVER, "dx-dra", "gpu-0")
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [made["metadata"]["uid"]]
    status = (await pipeline.get(ns, "only"))["status"]["extendedResourceClaimStatus"]
    assert status == {
        "requestMappings": [
            {"containerName": "main", "resourceName": GPU, "requestName": "container-0-request-0"}
        ],
        "resourceClaimName": meta["name"],
    }


async def test_gpu_pods_fill_the_plugins_card_then_the_dra_card_and_no_more(
    pipeline: Pipeline, ns: str
) -> None:
    await pipeline.create(ns, gpu_pod("p1", SUITE))
    assert await pipeline.node_of(ns, "p1") == "dx-dp"
    assert not await made_claims(pipeline, ns)  # the device plugin serves it: no claim
    await pipeline.create(ns, gpu_pod("p2", SUITE))
    assert await pipeline.node_of(ns, "p2") == "dx-dra"
    [claim] = await made_claims(pipeline, ns)
    assert claim["metadata"]["name"].startswith("p2-extended-resources-")
    await pipeline.create(ns, gpu_pod("p3", SUITE))
    await told(pipeline, ns, "p3", "nodes are available")
    assert len(await made_claims(pipeline, ns)) == 1
    p1 = await pipeline.get(ns, "p1")
    assert "extendedResourceClaimStatus" not in p1["status"]


ADMISSION = "/apis/admissionregistration.k8s.io/v1"
POLICY = "dx-no-extended-claim-status"


async def refuse_claim_status(p: Pipeline, ns: str) -> None:
    """A ValidatingAdmissionPolicy refusing, in ``ns``, a pod status that names an
    extended resources' claim; in force once a probe pod's such write is refused."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["pods/status"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "!has(object.status.extendedResourceClaimStatus)",
                    "message": "this namespace takes no extendedResourceClaimStatus (test)",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {
            "policyName": POLICY,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
            },
        },
    }
    await put(p.api, f"{ADMISSION}/validatingadmissionpolicies", policy)
    await put(p.api, f"{ADMISSION}/validatingadmissionpolicybindings", binding)
    await p.create(ns, pod("probe", {GPU: 1}, scheduler="nobody"))
    mapping = {"containerName": "main", "resourceName": GPU, "requestName": "r"}
    body = {
        "status": {
            "extendedResourceClaimStatus": {
                "requestMappings": [mapping],
                "resourceClaimName": "probe",
            }
        }
    }

    async def refused() -> bool:
        try:
            await kube.request(
                p.api,
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/probe/status",
                body,
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            return exc.status in (400, 403, 422)
        return False

    await eventually(refused, what="the test's admission policy in force")


async def test_a_bind_that_fails_after_the_claim_was_made_deletes_it(
    pipeline: Pipeline, ns: str
) -> None:
    await refuse_claim_status(pipeline, ns)
    try:
        await pipeline.create(ns, gpu_pod("only", {"api": "dra"}))
        await told(pipeline, ns, "only", "cannot name its extended resources' claim")
    finally:
        await kube.request(
            pipeline.api, "DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{POLICY}"
        )
        await kube.request(
            pipeline.api, "DELETE", f"{ADMISSION}/validatingadmissionpolicies/{POLICY}"
        )
    # Placed again once the policy is gone: one claim, those of the failed tries deleted.
    assert (
        await pipeline.node_of(
            ns,
            "only",
        )
        == "dx-dra"
    )
    [claim] = await made_claims(pipeline, ns)
    name = (await pipeline.get(ns, "only"))["status"]["extendedResourceClaimStatus"]
    assert name["resourceClaimName"] == claim["metadata"]["name"]
