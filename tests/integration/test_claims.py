"""Pods that claim volumes or DRA devices, on the real API server: each waits, with the
message a user reads in its Event and ``PodScheduled`` condition, until its claims let
it run, and then goes only where they allow; none is ever bound to fail.

No kube-controller-manager runs here: the tests play the PersistentVolume controller
(binding a claim) and whoever allocates and reserves a ResourceClaim.

=========  ====  ================
node       zone  devices
=========  ====  ================
cl-a       a     1 x A100
cl-b       b     1 x A100
=========  ====  ================
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared import kube
from shared.config import NatsConfig
from tests.integration.pipeline import Pipeline, pod, start_pipeline, told

pytestmark = pytest.mark.integration

A100 = {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 1}
SUITE = {"suite": "claims"}
ZONE = "topology.kubernetes.io/zone"
RESOURCES = {"cpu": "4", "memory": "16Gi", "pods": "20"}
INVENTORY = {
    "nodes": [
        {"name": name, "labels": {**SUITE, ZONE: zone}, "allocatable": RESOURCES, "devices": [A100]}
        for name, zone in (("cl-a", "a"), ("cl-b", "b"))
    ]
}
RESOURCE = "/apis/resource.k8s.io/v1"
UNBOUND = "pod has unbound immediate PersistentVolumeClaims"


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("claims"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


def claiming(
    name: str,
    *,
    volumes: list[dict[str, Any]] | None = None,
    claims: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A pod of this suite asking one GPU, with these volumes and ResourceClaims."""
    obj = pod(name, {"nvidia.com/gpu": 1})
    obj["spec"]["nodeSelector"] = SUITE
    obj["spec"]["volumes"] = volumes or []
    obj["spec"]["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return obj


def mount(claim: str) -> dict[str, Any]:
    return {"name": "data", "persistentVolumeClaim": {"claimName": claim}}


async def create(p: Pipeline, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    made: dict[str, Any] = await kube.request(p.api, "POST", path, obj)
    return made


async def create_pvc(
    p: Pipeline, ns: str, name: str, *, storage_class: str = "", volume: str = ""
) -> None:
    """A claim; with ``volume``, bound to it as the PersistentVolume controller does."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": storage_class,
    }
    meta: dict[str, Any] = {"name": name}
    if volume:
        spec["volumeName"] = volume
        meta["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
    obj = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}
    await create(p, f"/api/v1/namespaces/{ns}/persistentvolumeclaims", obj)


async def create_pv(
    p: Pipeline, name: str, *, node: str = "", labels: dict[str, str] | None = None
) -> None:
    """A volume; with ``node``, usable only from that node (a local volume)."""
    spec: dict[str, Any] = {
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "hostPath": {"path": f"/tmp/{name}"},
        "storageClassName": "",
    }
    if node:
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [term]}]}}
    meta = {"name": name, "labels": labels or {}}
    obj = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": meta, "spec": spec}
    await create(p, "/api/v1/persistentvolumes", obj)


async def create_claim(p: Pipeline, ns: str, name: str) -> None:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.test"}}]}
        },
    }
    await create(p, f"{RESOURCE}/namespaces/{ns}/resourceclaims", obj)


async def allocate(
    p: Pipeline, ns: str, name: str, node: str, reserved_for: dict[str, Any] | None = None
) -> None:
    """Allocate the claim on ``node``'s devices, as a DRA allocator would; reserve it
    for ``reserved_for`` (a pod object) too, as kube-scheduler does before binding."""
    path = f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}"
    obj = await kube.request(p.api, "GET", path)
    field = {"key": "metadata.name", "operator": "In", "values": [node]}
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.test", "pool": node, "device": "gpu-0"}
                ]
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [field]}]},
        }
    }
    if reserved_for is not None:
        meta = reserved_for["metadata"]
        consumer = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        obj["status"]["reservedFor"] = [consumer]
    await kube.request(p.api, "PUT", f"{path}/status", obj)


async def test_a_pod_whose_unallocated_claim_names_no_class_is_told_and_not_bound(
    pipeline: Pipeline, ns: str
) -> None:
    await create_claim(pipeline, ns, "gpu")
    await pipeline.create(ns, claiming("dra", claims=("gpu",)))
    # Tessera allocates it (tests/integration/test_dra_claims.py): here its class is missing.
    message = await told(pipeline, ns, "dra", "does not exist")
    assert message.endswith(
        "nodes are available: request gpu: device class gpu.test does not exist."
    ), message


async def test_a_claim_allocated_and_reserved_for_the_pod_takes_it_to_its_devices(
    pipeline: Pipeline, ns: str
) -> None:
    await create_claim(pipeline, ns, "gpu")
    made = await pipeline.create(ns, claiming("dra", claims=("gpu",)))
    await told(pipeline, ns, "dra", "does not exist")
    # Allocated by someone else, not reserved for the pod: the binder reserves it for the
    # pod before binding it (the kubelet refuses a pod its claim is not reserved for).
    await allocate(pipeline, ns, "gpu", "cl-b")
    assert await pipeline.node_of(ns, "dra") == "cl-b"
    path = f"{RESOURCE}/namespaces/{ns}/resourceclaims/gpu"
    status = (await kube.request(pipeline.api, "GET", path))["status"]
    assert [r["uid"] for r in status["reservedFor"]] == [made["metadata"]["uid"]]
    assert status["allocation"]["devices"]["results"][0]["pool"] == "cl-b"


async def test_an_unbound_immediate_claim_waits_then_the_pod_goes_where_its_volume_is(
    pipeline: Pipeline, ns: str
) -> None:
    await create_pvc(pipeline, ns, "data")
    await pipeline.create(ns, claiming("vol", volumes=[mount("data")]))
    message = await told(pipeline, ns, "vol", UNBOUND)
    assert message.endswith(f"nodes are available: {UNBOUND}."), message
    # The PersistentVolume controller binds it to a volume local to cl-a.
    await create_pv(pipeline, f"{ns}-local", node="cl-a")
    await kube.request(
        pipeline.api,
        "PATCH",
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data",
        {
            "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"volumeName": f"{ns}-local"},
        },
        content_type="application/merge-patch+json",
    )
    assert await pipeline.node_of(ns, "vol") == "cl-a"


async def test_a_bound_volume_keeps_the_pod_to_its_zone_and_its_node(
    pipeline: Pipeline, ns: str
) -> None:
    await create_pv(pipeline, f"{ns}-zonal", labels={ZONE: "b"})
    await create_pvc(pipeline, ns, "zonal", volume=f"{ns}-zonal")
    await pipeline.create(ns, claiming("zonal", volumes=[mount("zonal")]))
    assert await pipeline.node_of(ns, "zonal") == "cl-b"
    await create_pv(pipeline, f"{ns}-far", node="elsewhere")
    await create_pvc(pipeline, ns, "far", volume=f"{ns}-far")
    await pipeline.create(ns, claiming("far", volumes=[mount("far")]))
    message = await told(pipeline, ns, "far", "node(s) didn't match PersistentVolume's node")
    assert "2 node(s) didn't match PersistentVolume's node affinity" in message


async def test_a_claim_that_binds_once_a_node_is_chosen_waits_with_what_to_do(
    pipeline: Pipeline, ns: str
) -> None:
    late = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": f"{ns}-late"},
        "provisioner": "example.com/local",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    await create(pipeline, "/apis/storage.k8s.io/v1/storageclasses", late)
    await create_pvc(pipeline, ns, "late", storage_class=f"{ns}-late")
    await pipeline.create(ns, claiming("late", volumes=[mount("late")]))
    message = await told(pipeline, ns, "late", "WaitForFirstConsumer")
    assert message.endswith(
        f"pod uses PersistentVolumeClaim {ns}/late, whose StorageClass {ns}-late binds it only "
        "once a node is chosen (volumeBindingMode: WaitForFirstConsumer); Tessera does not "
        "choose nodes for volumes yet: use kube-scheduler for this pod."
    ), message
