"""Kueue as the admission layer in front of Tessera (docs/compat.md, "Kueue").

Kueue admits a plain pod through scheduling gates: its webhook creates the pod of a
LocalQueue gated (``kueue.x-k8s.io/admission``; v0.17.0 adds ``kueue.x-k8s.io/topology``
too), labelled as managed and with its finalizer; on admission, in one update, it
removes the gates, merges its ResourceFlavor's ``nodeLabels`` into the pod's
``nodeSelector`` and adds its queue labels and the Workload's name. Tessera must leave
the pod alone while gated, then place it at once on a node of that flavor.

The first test does what Kueue does, writing what Kueue v0.17.0 writes; the second runs
Kueue's own manager (opt-in, tests/integration/kueue.py) and checks that it writes
exactly that, and that Tessera places what it admits the same way.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration import kueue as kueue_manager
from tests.integration.pipeline import Pipeline, pod, start_pipeline
from tests.integration.test_gates import UNGATED_BIND_S, seen_gated
from tools.localcluster import ClusterError

pytestmark = pytest.mark.integration

FLAVOR = "example.com/gpu-flavor"
"""The node label of Kueue's ResourceFlavors here (``spec.nodeLabels``)."""
A100 = {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 4}
INVENTORY = {
    "nodes": [
        {"name": "kq-spot", "labels": {FLAVOR: "spot"}, "devices": [A100]},
        {"name": "kq-reserved", "labels": {FLAVOR: "reserved"}, "devices": [A100]},
    ]
}
LIMITS = {"nvidia.com/gpu": 1}
QUEUE = "team-a"
CLUSTER_QUEUE = "tessera-test-kueue"

# What Kueue v0.17.0's webhook writes on a pod labelled with a LocalQueue...
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
GATES = ("kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology")
MANAGED = "kueue.x-k8s.io/managed"
"""A label (``"true"``) and the finalizer Kueue removes once the pod has ended."""
ROLE_HASH = "kueue.x-k8s.io/role-hash"
# ... and what its admission adds, besides its flavor's nodeSelector.
ADMITTED_LABELS = (
    "kueue.x-k8s.io/cluster-queue-name",
    "kueue.x-k8s.io/local-queue-name",
    "kueue.x-k8s.io/podset",
)
WORKLOAD = "kueue.x-k8s.io/workload"


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("kueue"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


@pytest.fixture(scope="module")
def kueue(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Kueue's manager running against the session's API server (its log), or a skip
    that says why it cannot run here."""
    why = kueue_manager.unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        kueue_manager.ensure_built()
    except ClusterError as exc:
        pytest.skip(f"Kueue {kueue_manager.VERSION} cannot be built here: {exc}")
    with kueue_manager.running(kubeconfig, tmp_path_factory.mktemp("kueue-manager")) as log:
        yield log


def queued(name: str) -> dict[str, Any]:
    """A pod of the LocalQueue ``QUEUE``, as its user writes it."""
    return pod(name, LIMITS, labels={QUEUE_NAME: QUEUE})


def gated_as_kueue(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod as Kueue's webhook leaves it."""
    doc["metadata"]["labels"][MANAGED] = "true"
    doc["metadata"]["annotations"][ROLE_HASH] = "b168d124"
    doc["metadata"]["finalizers"] = [MANAGED]
    doc["spec"]["schedulingGates"] = [{"name": g} for g in GATES]
    return doc


async def merge_patch(p: Pipeline, path: str, patch: dict[str, Any]) -> None:
    """A JSON merge patch of the object at ``path``, as the admin."""
    await kube.request(p.api, "PATCH", path, patch, content_type="application/merge-patch+json")


async def admit_as_kueue(p: Pipeline, ns: str, name: str) -> float:
    """Kueue's admission of the pod to flavor ``reserved``, in one update; when it was."""
    await merge_patch(
        p,
        f"/api/v1/namespaces/{ns}/pods/{name}",
        {
            "metadata": {
                "labels": dict(zip(ADMITTED_LABELS, (CLUSTER_QUEUE, QUEUE, "main"), strict=True)),
                "annotations": {WORKLOAD: f"pod-{name}-3f2a1"},
            },
            "spec": {"schedulingGates": None, "nodeSelector": {FLAVOR: "reserved"}},
        },
    )
    return time.monotonic()


async def release(p: Pipeline, ns: str, name: str) -> None:
    """Remove Kueue's finalizer, as Kueue does once the pod has ended: it can go."""
    with contextlib.suppress(ApiException):
        await merge_patch(
            p, f"/api/v1/namespaces/{ns}/pods/{name}", {"metadata": {"finalizers": None}}
        )


async def fill_spot(p: Pipeline, ns: str) -> None:
    """A pod on the ``spot`` node first: binpack would put the next pod beside it, were
    its flavor's selector not followed."""
    filler = pod("filler", LIMITS)
    filler["spec"]["nodeSelector"] = {FLAVOR: "spot"}
    await p.create(ns, filler)
    assert await p.node_of(ns, "filler") == "kq-spot"


async def placed_on_its_flavor(p: Pipeline, ns: str, name: str, admitted: float) -> dict[str, Any]:
    """The pod, bound to the ``reserved`` node within ``UNGATED_BIND_S`` of its admission."""
    bound = await p.bound(ns, name, timeout_s=10)
    took = time.monotonic() - admitted
    assert bound["spec"]["nodeName"] == "kq-reserved"
    assert took < UNGATED_BIND_S, f"bound {took:.1f}s after Kueue admitted it"
    return bound


async def test_a_pod_admitted_as_kueue_admits_it_is_placed_at_once_on_its_flavor(
    pipeline: Pipeline, ns: str
) -> None:
    await fill_spot(pipeline, ns)
    await pipeline.create(ns, gated_as_kueue(queued("job")))
    try:
        await seen_gated(pipeline, 1)
        assert not (await pipeline.get(ns, "job"))["spec"].get("nodeName")
        admitted = await admit_as_kueue(pipeline, ns, "job")
        await placed_on_its_flavor(pipeline, ns, "job", admitted)
        await seen_gated(pipeline, 0)
    finally:
        await release(pipeline, ns, "job")
    assert pipeline.loud() == []


async def test_kueues_own_manager_admits_a_pod_and_tessera_places_it_on_its_flavor(
    pipeline: Pipeline, ns: str, kueue: Path
) -> None:
    await merge_patch(
        pipeline, f"/api/v1/namespaces/{ns}", {"metadata": {"labels": kueue_manager.LABEL}}
    )
    group = "/apis/kueue.x-k8s.io/v1beta2"
    for path, obj in [
        (
            f"{group}/resourceflavors",
            {
                "kind": "ResourceFlavor",
                "metadata": {"name": "reserved"},
                "spec": {"nodeLabels": {FLAVOR: "reserved"}},
            },
        ),
        (
            f"{group}/clusterqueues",
            {
                "kind": "ClusterQueue",
                "metadata": {"name": CLUSTER_QUEUE},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": "reserved",
                                    "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}],
                                }
                            ],
                        }
                    ],
                },
            },
        ),
        (
            f"{group}/namespaces/{ns}/localqueues",
            {
                "kind": "LocalQueue",
                "metadata": {"name": QUEUE},
                "spec": {"clusterQueue": CLUSTER_QUEUE},
            },
        ),
    ]:
        try:
            await kube.request(
                pipeline.api, "POST", path, {"apiVersion": "kueue.x-k8s.io/v1beta2", **obj}
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: made by a run before, on this API server
                raise
    await fill_spot(pipeline, ns)
    created = await pipeline.create(ns, queued("job"))
    try:
        # Kueue's webhook wrote what the test above writes...
        expected = gated_as_kueue(queued("job"))
        assert [g["name"] for g in created["spec"]["schedulingGates"]] == list(GATES)
        assert created["metadata"]["labels"] == expected["metadata"]["labels"]
        assert created["metadata"]["finalizers"] == [MANAGED]
        assert set(created["metadata"]["annotations"]) == {ROLE_HASH}

        async def ungated() -> float | None:
            gates = (await pipeline.get(ns, "job"))["spec"].get("schedulingGates")
            return None if gates else time.monotonic()

        admitted = await eventually(ungated, interval_s=0.05, what=f"Kueue admitting job ({kueue})")
        bound = await placed_on_its_flavor(pipeline, ns, "job", admitted)
        # ... and its admission what admit_as_kueue writes.
        assert bound["spec"]["nodeSelector"] == {FLAVOR: "reserved"}
        labels = bound["metadata"]["labels"]
        assert [labels.get(k) for k in ADMITTED_LABELS] == [CLUSTER_QUEUE, QUEUE, "main"]
        assert set(bound["metadata"]["annotations"]) >= {ROLE_HASH, WORKLOAD}
    finally:
        await release(pipeline, ns, "job")
