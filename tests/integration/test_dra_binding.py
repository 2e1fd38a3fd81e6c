"""Devices with binding conditions, on the real API server (services/binder/conditions.py):
a pod whose claim holds such a device is told ``BindingConditionsPending`` and bound only
once the device's controller (played here: it writes the claim's ``status.devices``)
reports every condition True; a failure condition True fails the bind with
kube-scheduler's words and deallocates the claim; a device never ready fails it at
``scheduler.bindingTimeoutS``. Meanwhile the allocator keeps the pod's reservation past
its usual 30 s (services/device_allocator/pods.py).

The session's cluster with kube-controller-manager (``controllers``, tests/conftest.py)
deallocates the claims of deleted pods between tests, as in any cluster.

=========  =====================================================
node       devices (ResourceSlice, driver below)
=========  =====================================================
bc-a       gpu-0, gpu-1, gpu-2: ``bindingConditions: [attached]``,
           ``bindingFailureConditions: [failed]``
=========  =====================================================
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from services.device_allocator.pods import BIND_TIMEOUT_S
from shared import kube
from shared.config import NatsConfig
from shared.core.dra import binding
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, start_pipeline, told
from tests.integration.test_dra_claims import RESOURCE, put
from tools.localcluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("released_claims")]

SUITE = {"suite": "dra-binding"}
RESOURCES = {"cpu": "4", "memory": "16Gi", "pods": "20"}
NODE = "bc-a"
INVENTORY = {"nodes": [{"name": NODE, "labels": SUITE, "allocatable": RESOURCES, "devices": []}]}
DRIVER = "bc.tessera.io"
CLASS = "bc-gpu.tessera.io"
TIMEOUT_S = 60.0
"""``scheduler.bindingTimeoutS`` here: past the allocator's usual 30 s (and its next
expiry round), short enough for a test to see it end."""


def device(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"type": {"string": "gpu"}},
        "bindingConditions": ["attached"],
        "bindingFailureConditions": ["failed"],
    }


@pytest.fixture(scope="module")
async def pipeline(
    controllers: LocalCluster, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("dra-binding"),
        controllers.kubeconfig,
        nats_admin,
        INVENTORY,
        settings={"bindingTimeoutS": TIMEOUT_S},
    )
    selector = {"cel": {"expression": f"device.driver == '{DRIVER}'"}}
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [selector]},
    }
    await put(p.api, f"{RESOURCE}/deviceclasses", device_class)
    made = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [device(f"gpu-{i}") for i in range(3)],
        },
    }
    await put(p.api, f"{RESOURCE}/resourceslices", made)
    yield p
    await kube.request(p.api, "DELETE", f"{RESOURCE}/resourceslices/{NODE}-{DRIVER}")
    await kube.request(p.api, "DELETE", f"{RESOURCE}/deviceclasses/{CLASS}")
    await p.close()


def path(ns: str, name: str) -> str:
    return f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}"


async def claimed(p: Pipeline, ns: str, name: str) -> str:
    """A claim of one device of the class, and a pod of ours using it: its name."""
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }
    await kube.request(p.api, "POST", f"{RESOURCE}/namespaces/{ns}/resourceclaims", obj)
    made = pod(name, {})
    made["spec"]["nodeSelector"] = SUITE
    made["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    made["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    await p.create(ns, made)
    return name


async def pending(p: Pipeline, ns: str, name: str) -> dict[str, Any]:
    """The pod's ``BindingConditionsPending`` Event (waiting for it); the pod unbound,
    its claim allocated and reserved for it."""

    async def told_pending() -> list[dict[str, Any]]:
        return [e for e in await p.events(ns, name) if e["reason"] == "BindingConditionsPending"]

    found = await eventually(told_pending, interval_s=0.5, what=f"{name} told it waits")
    [event] = found
    assert event["type"] == "Normal"
    assert event["message"] == f"waiting for binding conditions for device on node {NODE}"
    assert not (await p.get(ns, name))["spec"].get("nodeName")
    claim = await kube.request(p.api, "GET", path(ns, name))
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]
    return dict(claim)


async def report(p: Pipeline, ns: str, name: str, condition: str, message: str = "") -> None:
    """Play the device's controller: write ``condition`` True in the claim's
    ``status.devices`` for its allocated device."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for _ in range(5):
        obj = await kube.request(p.api, "GET", path(ns, name))
        [result] = obj["status"]["allocation"]["devices"]["results"]
        cond = {
            "type": condition,
            "status": "True",
            "reason": "Reported",
            "message": message,
            "lastTransitionTime": now,
        }
        entry = {k: result[k] for k in ("driver", "pool", "device")} | {"conditions": [cond]}
        obj["status"]["devices"] = [entry]
        try:
            await kube.request(p.api, "PUT", f"{path(ns, name)}/status", obj)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError(f"claim {ns}/{name}: status not written")


async def test_the_pod_waits_for_its_device_past_the_usual_bind_timeout_then_is_bound(
    pipeline: Pipeline, ns: str
) -> None:
    await claimed(pipeline, ns, "ready")
    await claimed(pipeline, ns, "never")  # its device never reports: it times out
    claim = await pending(pipeline, ns, "ready")
    at = binding.allocated_at(claim)
    assert at is not None, claim["status"]["allocation"]
    assert abs(at - time.time()) < 30, claim["status"]["allocation"]
    await pending(pipeline, ns, "never")
    # Past the allocator's usual expiry (and one more of its rounds, a third of it): the
    # reservation is kept, nobody is told the bind did not happen in time.
    await asyncio.sleep(BIND_TIMEOUT_S + BIND_TIMEOUT_S / 3 + 2 - (time.time() - at))
    for name in ("ready", "never"):
        assert not (await pipeline.get(ns, name))["spec"].get("nodeName")
        said = [e["message"] for e in await pipeline.events(ns, name)]
        assert not [m for m in said if "in time" in m], said
    await report(pipeline, ns, "ready", "attached")
    bound = await pipeline.bound(ns, "ready", timeout_s=15)
    assert bound["spec"]["nodeName"] == NODE
    # The other one's device never reported: its bind fails at the binding timeout.
    message = await told(pipeline, ns, "never", "device binding timeout: claim=never")
    assert "attached on bc.tessera.io/bc-a/gpu-" in message, message


async def test_a_failure_condition_fails_the_bind_and_deallocates_the_claim(
    pipeline: Pipeline, ns: str
) -> None:
    await claimed(pipeline, ns, "broken")
    await pending(pipeline, ns, "broken")
    await report(pipeline, ns, "broken", "failed", "no fabric link")
    message = await told(pipeline, ns, "broken", "device binding failed: claim=broken")
    assert 'reason=Reported, message="no fabric link"' in message, message
    assert not (await pipeline.get(ns, "broken"))["spec"].get("nodeName")

    # The allocation is cleared: the API server drops the failed device's status with it
    # (nothing else removes it). The pod is placed again after its backoff, and waits.
    async def cleared() -> bool:
        obj = await kube.request(pipeline.api, "GET", path(ns, "broken"))
        return not (obj.get("status") or {}).get("devices")

    await eventually(cleared, interval_s=0.5, what="the failed claim deallocated")
    assert not (await pipeline.get(ns, "broken"))["spec"].get("nodeName")


async def test_a_binder_stopped_while_a_pod_waits_gives_its_claim_back_and_the_next_one_waits(
    pipeline: Pipeline, ns: str
) -> None:
    await claimed(pipeline, ns, "held")
    await pending(pipeline, ns, "held")
    proc = pipeline.procs["binder"]
    proc.send_signal(signal.SIGTERM)  # a clean stop; its keeper starts it again
    await proc.wait()
    # Given up at shutdown: the claim is free again (no binder writes it until the next
    # one has started, seconds from now).
    status = (await kube.request(pipeline.api, "GET", path(ns, "held"))).get("status") or {}
    assert not status.get("reservedFor"), status
    assert not status.get("allocation"), status
    assert "given up at shutdown" in pipeline.log("binder")

    # Placed again at once: the next binder writes the claim again and waits for it.
    async def reserved() -> bool:
        obj = await kube.request(pipeline.api, "GET", path(ns, "held"))
        return [r["name"] for r in (obj.get("status") or {}).get("reservedFor") or ()] == ["held"]

    await eventually(reserved, timeout_s=60, interval_s=0.5, what="the claim reserved again")
    assert not (await pipeline.get(ns, "held"))["spec"].get("nodeName")
    await report(pipeline, ns, "held", "attached")
    assert (await pipeline.bound(ns, "held", timeout_s=15))["spec"]["nodeName"] == NODE
