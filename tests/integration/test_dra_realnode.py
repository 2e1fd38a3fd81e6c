"""The node agent as a DRA driver on the real node: the pinned kubelet registers it
through its plugin watcher, the agent publishes the node's ResourceSlice to the real API
server, and for a pod whose ResourceClaim the test allocates by hand (as a scheduler
would: ``status.allocation`` and ``reservedFor``, then the Binding) the kubelet calls
NodePrepareResources, containerd applies the claim's CDI spec, and the container prints
what it got: the same HAMi-core hand-out the device plugin gives for that share.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.core.model import NodeName, PodRef
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline
from tests.integration.realnode import handed, node_pipeline_factory, phase, printing_pod

pytestmark = pytest.mark.integration
_ = node_pipeline_factory  # the fixture, imported for this module

Factory = Callable[..., Awaitable[Pipeline]]
RESOURCE = "/apis/resource.k8s.io/v1"
H100 = [{"model": "NVIDIA-H100-80GB-HBM3", "memory": 81920, "count": 2}]
CACHE = "/usr/local/vgpu/cache"
REPO = Path(__file__).resolve().parents[2]


async def test_the_kubelet_prepares_a_hand_allocated_claim_and_the_container_gets_its_share(
    node_pipeline_factory: Factory,
) -> None:
    node = "real-0"
    p = await node_pipeline_factory(H100, {"nodeConfigs": [{"name": node, "deviceApi": "dra"}]})

    async def published() -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await kube.request(
                p.api, "GET", f"{RESOURCE}/resourceslices/{node}-gpu.tessera.io"
            )
        except ApiException:
            return None
        return obj

    slice_ = await eventually(published, timeout_s=60, what="the node's ResourceSlice")
    spec = slice_["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (
        "gpu.tessera.io",
        node,
        node,
    )
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    card = spec["devices"][0]
    assert card["allowMultipleAllocations"] is True
    assert card["capacity"]["memory"]["value"] == "80Gi"
    uuid0 = card["attributes"]["uuid"]["string"]

    # The shipped DeviceClasses pass the real API server (their CEL compiles there).
    for path in (
        REPO / "deploy/kustomize/components/dra/deviceclasses.yaml",
        REPO / "deploy/kustomize/components/dra-hami-compat/deviceclass.yaml",
    ):
        for doc in yaml.safe_load_all(path.read_text()):
            with contextlib.suppress(ApiException):  # left by an earlier run: same objects
                await kube.request(
                    p.api, "DELETE", f"{RESOURCE}/deviceclasses/{doc['metadata']['name']}"
                )
            await kube.request(p.api, "POST", f"{RESOURCE}/deviceclasses", doc)

    ns = await p.namespace()
    claim = await kube.request(
        p.api,
        "POST",
        f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "share"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.tessera.io",
                                "capacity": {"requests": {"cores": "30", "memory": "4Gi"}},
                            },
                        }
                    ]
                }
            },
        },
    )
    pod = printing_pod("dra", [("main", {})], scheduler="nobody")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "share"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    created = await p.create(ns, pod)
    ref = PodRef(namespace=ns, name="dra", uid=created["metadata"]["uid"])
    # What a scheduler writes before it binds: the allocation, and the pod it is for.
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.tessera.io",
                        "pool": node,
                        "device": "gpu-0",
                        "shareID": str(uuid.uuid4()),
                        "consumedCapacity": {"cores": "30", "memory": "4Gi"},
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "dra", "uid": ref.uid}],
    }
    await kube.request(
        p.api, "PUT", f"{RESOURCE}/namespaces/{ns}/resourceclaims/share/status", claim
    )
    await kube.bind(p.api, ref, NodeName(node))
    await phase(p, ns, "dra", "Running", timeout_s=90)
    got = await handed(ns, "dra", "main")
    claim_uid = claim["metadata"]["uid"]
    assert got.env["NVIDIA_VISIBLE_DEVICES"] == uuid0
    assert got.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert got.env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert got.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"{CACHE}/{claim_uid}_claim.cache"
    assert {CACHE, "/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"} <= got.mount_points
