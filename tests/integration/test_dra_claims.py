"""Tessera allocates DRA ResourceClaims, on the real API server: slices published for
simulated nodes as the node agent's DRA driver publishes them
(services/node_agent/dra/slices.py), a DeviceClass, claims from a template and written
directly; the pod is bound where its claim was allocated, the claim's
``status.allocation`` and ``reservedFor`` written by the binder's own account first;
gangs whose members contend for the cards (spread, refused whole, or placed without a
member no device serves, under ``minMember``).

The session's cluster with kube-controller-manager (``controllers``, tests/conftest.py)
makes a template's claim for its pod and deallocates claims whose pods are gone, as in
any cluster.

=========  =====================================
node       devices (ResourceSlice, driver below)
=========  =====================================
dw-a       gpu-0: H100, 80Gi, shared
dw-b       gpu-0: A100, 40Gi, shared
=========  =====================================
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from tests.integration.pipeline import (
    Pipeline,
    pod,
    podgroup,
    start_pipeline,
    told,
)
from tests.service.test_ops import tessera
from tools.localcluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("released_claims")]

SUITE = {"suite": "dra-claims"}
RESOURCES = {"cpu": "4", "memory": "16Gi", "pods": "20"}
NODES = {"dw-a": ("H100", 80), "dw-b": ("A100", 40)}
INVENTORY = {
    "nodes": [{"name": n, "labels": SUITE, "allocatable": RESOURCES, "devices": []} for n in NODES]
}
RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "dw.tessera.io"
CLASS = "dw-gpu.tessera.io"
GROUP = "scheduling.k8s.io/group-name"


def card(model: str, gib: int) -> dict[str, Any]:
    mem = f"{gib}Gi"
    return {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "attributes": {"type": {"string": "gpu"}, "productName": {"string": model}},
        "capacity": {
            "cores": {
                "value": "100",
                "requestPolicy": {
                    "default": "100",
                    "validRange": {"min": "1", "max": "100", "step": "1"},
                },
            },
            "memory": {
                "value": mem,
                "requestPolicy": {
                    "default": mem,
                    "validRange": {"min": "1Mi", "max": mem, "step": "1Mi"},
                },
            },
        },
    }


async def put(api: kube.Client, path: str, obj: dict[str, Any]) -> None:
    """Create ``obj`` (replacing one an earlier run left)."""
    name = obj["metadata"]["name"]
    try:
        await kube.request(api, "DELETE", f"{path}/{name}")
    except ApiException as exc:
        if exc.status != 404:
            raise
    await kube.request(api, "POST", path, obj)


@pytest.fixture(scope="module")
async def pipeline(
    controllers: LocalCluster, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("dra"), controllers.kubeconfig, nats_admin, INVENTORY
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


def devices(model: str = "", **capacity: str) -> dict[str, Any]:
    """``spec.devices`` of a claim: one device of the class, of ``model``, a share."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS}
    if model:
        expression = f"device.attributes['{DRIVER}'].productName == '{model}'"
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"requests": [{"name": "gpu", "exactly": exactly}]}


def claiming(name: str, entry: dict[str, str]) -> dict[str, Any]:
    obj = pod(name, {})
    obj["spec"]["nodeSelector"] = SUITE
    obj["spec"]["resourceClaims"] = [{"name": "gpu", **entry}]
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return obj


async def create_claim(p: Pipeline, ns: str, name: str, spec: dict[str, Any]) -> None:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": spec},
    }
    await kube.request(p.api, "POST", f"{RESOURCE}/namespaces/{ns}/resourceclaims", obj)


async def claim(p: Pipeline, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await kube.request(
        p.api, "GET", f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}"
    )
    return found


async def test_a_template_claim_is_allocated_by_tessera_and_the_pod_bound_there(
    pipeline: Pipeline, ns: str
) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "h100"},
        "spec": {"spec": {"devices": devices("H100")}},
    }
    await kube.request(
        pipeline.api, "POST", f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template
    )
    made = await pipeline.create(ns, claiming("tpl", {"resourceClaimTemplateName": "h100"}))
    # kube-controller-manager's resourceclaim controller makes the pod's own claim and
    # names it in the pod's status; Tessera waits for it, then allocates it
    assert await pipeline.node_of(ns, "tpl") == "dw-a"
    [named] = (await pipeline.get(ns, "tpl"))["status"]["resourceClaimStatuses"]
    status = (await claim(pipeline, ns, named["resourceClaimName"]))["status"]
    [result] = status["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (DRIVER, "dw-a", "gpu-0")
    assert [r["uid"] for r in status["reservedFor"]] == [made["metadata"]["uid"]]


async def test_two_30_percent_shares_go_to_one_card(pipeline: Pipeline, ns: str) -> None:
    for name in ("s1", "s2"):
        await create_claim(pipeline, ns, name, devices("A100", cores="30", memory="4Gi"))
        await pipeline.create(ns, claiming(name, {"resourceClaimName": name}))
    for name in ("s1", "s2"):
        assert await pipeline.node_of(ns, name) == "dw-b"
    results = [
        (await claim(pipeline, ns, name))["status"]["allocation"]["devices"]["results"][0]
        for name in ("s1", "s2")
    ]
    assert {(r["pool"], r["device"]) for r in results} == {("dw-b", "gpu-0")}
    assert [r["consumedCapacity"]["cores"] for r in results] == ["30", "30"]
    assert results[0]["shareID"] != results[1]["shareID"]


async def test_a_claim_no_device_can_serve_tells_the_pod_why(
    pipeline: Pipeline, ns: str, controllers: LocalCluster
) -> None:
    await create_claim(pipeline, ns, "huge", devices(memory="100Gi"))
    await pipeline.create(ns, claiming("huge", {"resourceClaimName": "huge"}))
    message = await told(pipeline, ns, "huge", "cannot allocate all claims")
    assert "outside the request policy's range" in message, message
    assert "allocation" not in (await claim(pipeline, ns, "huge")).get("status", {})
    # tessera explain: the last attempt's reason, and the same from trying it now.
    flags = ["--config", str(pipeline.config), "--kubeconfig", str(controllers.kubeconfig)]
    code, out, err, _ = await tessera("explain", "pod", f"{ns}/huge", *flags)
    assert (code, err) == (0, ""), err
    now = out.split("Now (", 1)[1]
    assert "cannot allocate all claims" in now, out
    assert "outside the request policy's range" in now, out


def in_gang(name: str, group: str, entry: dict[str, str]) -> dict[str, Any]:
    obj = claiming(name, entry)
    obj["metadata"]["annotations"] = {GROUP: group}
    return obj


async def test_a_gang_whose_claims_contend_for_one_card_is_refused_whole_then_fits(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "pair", 2)
    for name in ("g1", "g2"):  # each alone fits the A100; both together do not
        await create_claim(pipeline, ns, name, devices("A100", cores="60", memory="4Gi"))
        await pipeline.create(ns, in_gang(name, "pair", {"resourceClaimName": name}))
    message = await told(pipeline, ns, "g1", "cannot allocate all claims")
    assert "2/2 tasks in gang unschedulable" in message, message
    for name in ("g1", "g2"):
        assert not (await pipeline.get(ns, name))["spec"].get("nodeName")
        assert "allocation" not in (await claim(pipeline, ns, name)).get("status", {})
    # The other gang member asks less: both go, their claims on the one card.
    await pipeline.delete(ns, "g2")
    await kube.request(pipeline.api, "DELETE", f"{RESOURCE}/namespaces/{ns}/resourceclaims/g2")
    await create_claim(pipeline, ns, "g3", devices("A100", cores="40", memory="4Gi"))
    await pipeline.create(ns, in_gang("g3", "pair", {"resourceClaimName": "g3"}))
    assert await pipeline.node_of(ns, "g1") == "dw-b"
    assert await pipeline.node_of(ns, "g3") == "dw-b"


async def test_a_gang_of_two_whole_card_claims_is_spread_over_the_two_nodes(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "wide", 2)
    prefer_a = {
        "weight": 100,
        "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["dw-a"]}]
        },
    }
    for name in ("w1", "w2"):  # each a whole card; each alone fits either node
        await create_claim(pipeline, ns, name, devices())
        obj = in_gang(name, "wide", {"resourceClaimName": name})
        # Both would rather go to dw-a: the second must see the first took its card.
        obj["spec"]["affinity"] = {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [prefer_a]}
        }
        await pipeline.create(ns, obj)
    placed = {name: await pipeline.node_of(ns, name) for name in ("w1", "w2")}
    assert sorted(placed.values()) == ["dw-a", "dw-b"], placed
    for name, node in placed.items():
        status = (await claim(pipeline, ns, name))["status"]
        [result] = status["allocation"]["devices"]["results"]
        assert (result["pool"], result["device"]) == (node, "gpu-0")
        assert [r["name"] for r in status["reservedFor"]] == [name]


async def test_a_gang_with_min_member_below_its_size_places_the_member_whose_claim_fits(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "some", 1)
    # The member whose claim no device serves comes first: alone it makes the gang ready.
    await create_claim(pipeline, ns, "never", devices("B200"))
    await pipeline.create(ns, in_gang("never", "some", {"resourceClaimName": "never"}))
    await create_claim(pipeline, ns, "fits", devices("A100", cores="30", memory="4Gi"))
    await pipeline.create(ns, in_gang("fits", "some", {"resourceClaimName": "fits"}))
    assert await pipeline.node_of(ns, "fits") == "dw-b"
    assert (await claim(pipeline, ns, "fits"))["status"]["allocation"]
    await told(pipeline, ns, "never", "cannot allocate all claims")
    assert not (await pipeline.get(ns, "never"))["spec"].get("nodeName")
    assert "allocation" not in (await claim(pipeline, ns, "never")).get("status", {})


async def test_a_deleted_claim_gives_its_share_back(pipeline: Pipeline, ns: str) -> None:
    await create_claim(pipeline, ns, "big", devices("A100", cores="80", memory="4Gi"))
    await pipeline.create(ns, claiming("big", {"resourceClaimName": "big"}))
    assert await pipeline.node_of(ns, "big") == "dw-b"
    await create_claim(pipeline, ns, "next", devices("A100", cores="50", memory="4Gi"))
    await pipeline.create(ns, claiming("next", {"resourceClaimName": "next"}))
    await told(pipeline, ns, "next", "cannot allocate all claims")
    # The pod ends and its claim is deleted (kube-controller-manager's part, played here).
    await pipeline.delete(ns, "big")
    await kube.request(pipeline.api, "DELETE", f"{RESOURCE}/namespaces/{ns}/resourceclaims/big")
    placed = await pipeline.bound(ns, "next", timeout_s=60)
    assert placed["spec"]["nodeName"] == "dw-b"


async def test_one_claim_named_by_two_pods_is_allocated_once_and_reserved_for_both(
    pipeline: Pipeline, ns: str
) -> None:
    await create_claim(pipeline, ns, "both", devices("H100", cores="30", memory="4Gi"))
    made = [
        await pipeline.create(ns, claiming(name, {"resourceClaimName": "both"}))
        for name in ("u1", "u2")
    ]
    for name in ("u1", "u2"):
        placed = await pipeline.bound(ns, name, timeout_s=60)
        assert placed["spec"]["nodeName"] == "dw-a"
    status = (await claim(pipeline, ns, "both"))["status"]
    assert len(status["allocation"]["devices"]["results"]) == 1
    assert sorted(r["uid"] for r in status["reservedFor"]) == sorted(
        m["metadata"]["uid"] for m in made
    )
