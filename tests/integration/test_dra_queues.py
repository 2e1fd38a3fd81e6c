"""Queues count claimed DRA devices (shared/core/claimed.py) on the real API server,
with the five services as processes under the ``capacity`` plugin: a Queue's
``deviceclass/<DeviceClass>`` capability holds a second claiming pod, told why in its
Event and condition, until the first is gone; a parent's capability bounds its
children's claims together; a claim another allocated counts what its allocation holds;
the Queue's status and ``tessera get queues`` show the claimed devices by class.

The slices and the class are test_dra_claims.py's kind (each card shared, a claim asking
nothing takes it whole), under a driver and class of this module's own.

=========  =====================================
node       devices (ResourceSlice, driver below)
=========  =====================================
dq-a       gpu-0: H100, 80Gi, shared
dq-b       gpu-0: A100, 40Gi, shared
=========  =====================================
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration.pipeline import (
    Pipeline,
    pod,
    podgroup,
    start_pipeline,
    told,
)
from tests.integration.test_batch import VOLCANO, queue
from tests.integration.test_dra_claims import GROUP, RESOURCE, card, put
from tests.service.test_ops import tessera
from tools.localcluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("released_claims")]

SUITE = {"suite": "dra-queues"}
RESOURCES = {"cpu": "4", "memory": "16Gi", "pods": "20"}
NODES = {"dq-a": ("H100", 80), "dq-b": ("A100", 40)}
INVENTORY = {
    "nodes": [{"name": n, "labels": SUITE, "allocatable": RESOURCES, "devices": []} for n in NODES]
}
DRIVER = "dq.tessera.io"
CLASS = "dq-gpu.tessera.io"
DEVICES = f"deviceclass/{CLASS}"
"""A queue's resource name for devices of the class."""


@pytest.fixture(scope="module")
async def pipeline(
    controllers: LocalCluster, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("dra-queues"),
        controllers.kubeconfig,
        nats_admin,
        INVENTORY,
        {"queuePlugin": "capacity", "starvationGuardS": 0},
    )
    selector = {"cel": {"expression": f"device.driver == '{DRIVER}'"}}
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [selector]},
    }
    await put(p.api, f"{RESOURCE}/deviceclasses", device_class)
    for node, (model, gib) in NODES.items():
        made = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [card(model, gib)],
            },
        }
        await put(p.api, f"{RESOURCE}/resourceslices", made)
    yield p
    for node in NODES:
        await kube.request(p.api, "DELETE", f"{RESOURCE}/resourceslices/{node}-{DRIVER}")
    await kube.request(p.api, "DELETE", f"{RESOURCE}/deviceclasses/{CLASS}")
    await p.close()


async def claimer(p: Pipeline, ns: str, name: str, in_queue: str, **capacity: str) -> None:
    """A pod in its own PodGroup of one in ``in_queue``, with its own claim of one
    device of the class (a whole card, or a share asking ``capacity``)."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    spec = {"requests": [{"name": "gpu", "exactly": exactly}]}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": spec},
    }
    await kube.request(p.api, "POST", f"{RESOURCE}/namespaces/{ns}/resourceclaims", claim)
    await podgroup(p, ns, name, 1, queue=in_queue)
    obj = pod(name, {}, annotations={GROUP: name})
    obj["spec"]["nodeSelector"] = SUITE
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    await p.create(ns, obj)


async def allocated(p: Pipeline, name: str) -> dict[str, Any]:
    found = await kube.request(p.api, "GET", f"{VOLCANO}/queues/{name}")
    return dict((found.get("status") or {}).get("allocated") or {})


async def test_a_capability_of_one_claimed_device_holds_the_second_claim_until_the_first_goes(
    pipeline: Pipeline, ns: str, controllers: LocalCluster
) -> None:
    small = f"small-{ns}"
    await queue(pipeline, small, capability={DEVICES: "1"})
    await claimer(pipeline, ns, "first", small)
    await pipeline.bound(ns, "first")
    # The cluster has a second card free: only the queue's capability holds this one.
    await claimer(pipeline, ns, "second", small)
    said = f'queue "{small}" has no room within its capability ({DEVICES} 2 > 1)'
    await told(pipeline, ns, "second", said)

    async def counted() -> bool:
        return (await allocated(pipeline, small)).get(DEVICES) == "1"

    await eventually(counted, what="the Queue's status.allocated counting one device")
    flags = ["--config", str(pipeline.config), "--kubeconfig", str(controllers.kubeconfig)]
    code, out, err, _ = await tessera("get", "queues", *flags)
    assert (code, err) == (0, ""), err
    [line] = [row for row in out.splitlines() if row.split()[:1] == [small]]
    assert f"{CLASS}: 1 claimed" in line, out
    await pipeline.delete(ns, "first")
    await pipeline.bound(ns, "second", timeout_s=60)


async def test_a_parents_capability_bounds_its_childrens_claims_together(
    pipeline: Pipeline, ns: str
) -> None:
    org, one, two = (f"{n}-{ns}" for n in ("org", "one", "two"))
    await queue(pipeline, org, capability={DEVICES: "1"})
    await queue(pipeline, one, parent=org)
    await queue(pipeline, two, parent=org)
    await claimer(pipeline, ns, "mine", one)
    await pipeline.bound(ns, "mine")
    await claimer(pipeline, ns, "theirs", two)
    said = f'queue "{two}" (its ancestor "{org}") has no room within its capability'
    message = await told(pipeline, ns, "theirs", said)
    assert f"({DEVICES} 2 > 1)" in message, message
    await pipeline.delete(ns, "mine")
    await pipeline.bound(ns, "theirs", timeout_s=60)


async def test_a_claim_another_allocated_counts_what_its_allocation_holds(
    pipeline: Pipeline, ns: str
) -> None:
    # Another scheduler allocated a claim asking nothing the whole H100 card (its
    # request policy's defaults); a pod of the queue names it. The queue counts what the
    # allocation holds, 100 cores, not the nothing the claim asks: a claim of 30 more
    # cores waits, though the A100 is free.
    cores = f"cores.deviceclass/{CLASS}"
    mine = f"cores-{ns}"
    await queue(pipeline, mine, capability={cores: "100"})
    spec = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "taken"},
        "spec": {"devices": spec},
    }
    path = f"{RESOURCE}/namespaces/{ns}/resourceclaims"
    made = await kube.request(pipeline.api, "POST", path, claim)
    field = {"key": "metadata.name", "operator": "In", "values": ["dq-a"]}
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "dq-a",
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"cores": "100", "memory": "80Gi"},
    }
    made["status"] = {
        "allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [field]}]},
        }
    }
    await kube.request(pipeline.api, "PUT", f"{path}/taken/status", made)
    await podgroup(pipeline, ns, "adopter", 1, queue=mine)
    obj = pod("adopter", {}, annotations={GROUP: "adopter"})
    obj["spec"]["nodeSelector"] = SUITE
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "taken"}]
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    await pipeline.create(ns, obj)
    assert await pipeline.node_of(ns, "adopter") == "dq-a"
    await claimer(pipeline, ns, "more", mine, cores="30")
    await told(pipeline, ns, "more", f"has no room within its capability ({cores} 130 > 100)")
