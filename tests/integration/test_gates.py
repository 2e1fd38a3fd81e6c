"""Scheduling gates on the real API server (kube-scheduler's SchedulingGates): a gated
pod is neither placed nor bound nor told anything while gated, keeps the condition the
API server gave it at creation, and is placed within seconds of its last gate's removal;
a gated member of a PodGroup does not count toward ``minMember``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared import kube
from shared.config import NatsConfig
from shared.core.request import GROUP_NAME
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline

pytestmark = pytest.mark.integration

INVENTORY = {
    "nodes": [
        {
            "name": "gt-a100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 4}
            ],
        },
    ]
}
GATE = "example.com/quota"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
"""The condition the API server writes on a pod created with gates
(kube-apiserver's pod strategy; kube-scheduler itself writes nothing while gated)."""
SETTLE_S = 3.0
"""How long a gated pod is watched for binding attempts (the bug: about 19 a second)."""
UNGATED_BIND_S = 2.0
"""How soon a pod must be bound once its last gate is gone."""


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("gates"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


def gated(doc: dict[str, Any], *gates: str) -> dict[str, Any]:
    doc["spec"]["schedulingGates"] = [{"name": g} for g in gates or (GATE,)]
    return doc


async def ungate(p: Pipeline, ns: str, name: str) -> float:
    """Remove every gate (as Kueue or a user's controller does); when it was done."""
    await kube.request(
        p.api,
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}",
        {"spec": {"schedulingGates": None}},
        content_type="application/merge-patch+json",
    )
    return time.monotonic()


async def gated_now(p: Pipeline) -> float:
    """The watcher's ``tessera_gated_pods``."""
    text = await p.metrics("watcher")
    [value] = [
        line.split()[1] for line in text.splitlines() if line.startswith("tessera_gated_pods ")
    ]
    return float(value)


async def seen_gated(p: Pipeline, count: int) -> None:
    """Wait until the watcher holds ``count`` gated pods."""

    async def probe() -> bool:
        return await gated_now(p) == count

    await eventually(probe, timeout_s=10, what=f"{count} gated pod(s) at the watcher")


def bind_lines(p: Pipeline, ns: str, name: str) -> list[str]:
    """The binder's log lines about this pod (each refused Binding writes one)."""
    return [line for line in p.log("binder").splitlines() if f"{ns}/{name} " in line]


async def assert_silently_gated(p: Pipeline, ns: str, name: str) -> None:
    """Unbound, with the API server's ``SchedulingGated`` condition, no FailedScheduling
    Event and no Binding tried."""
    obj = await p.get(ns, name)
    assert not obj["spec"].get("nodeName")
    [scheduled] = [c for c in obj["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (scheduled["status"], scheduled["reason"], scheduled["message"]) == (
        "False",
        "SchedulingGated",
        GATED_MESSAGE,
    )
    assert [e["reason"] for e in await p.events(ns, name)] == []
    assert bind_lines(p, ns, name) == []


async def test_a_gated_pod_is_left_alone_then_bound_once_ungated(
    pipeline: Pipeline, ns: str
) -> None:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}
    await pipeline.create(ns, gated(pod("held", limits), GATE, "example.com/second"))
    await seen_gated(pipeline, 1)
    # A pod created after it is bound: the services have seen the gated one by then.
    await pipeline.create(ns, pod("free", limits))
    await pipeline.bound(ns, "free")
    await asyncio.sleep(SETTLE_S)
    await assert_silently_gated(pipeline, ns, "held")

    # One gate of two removed: still gated.
    await kube.request(
        pipeline.api,
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/held",
        [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        content_type="application/json-patch+json",
    )
    await asyncio.sleep(1.0)
    await assert_silently_gated(pipeline, ns, "held")

    removed = await ungate(pipeline, ns, "held")
    bound = await pipeline.bound(ns, "held", timeout_s=10)
    took = time.monotonic() - removed
    assert took < UNGATED_BIND_S, f"bound {took:.1f}s after its last gate was removed"
    [scheduled] = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["status"] == "True"
    assert [line for line in bind_lines(pipeline, ns, "held") if "failed" in line] == []
    await seen_gated(pipeline, 0)


async def test_a_gated_member_does_not_count_toward_min_member(pipeline: Pipeline, ns: str) -> None:
    await podgroup(pipeline, ns, "pair", min_member=2)
    limits = {"nvidia.com/gpu": 1}
    await pipeline.create(ns, pod("first", limits, annotations={GROUP_NAME: "pair"}))
    await pipeline.create(ns, gated(pod("second", limits, annotations={GROUP_NAME: "pair"})))
    await seen_gated(pipeline, 1)
    # A lone pod created after them is bound: both members have been seen by then.
    await pipeline.create(ns, pod("probe", limits))
    await pipeline.bound(ns, "probe")
    await asyncio.sleep(SETTLE_S)
    # One member is pending, the other gated: the gang of two waits whole.
    assert not (await pipeline.get(ns, "first"))["spec"].get("nodeName")
    await assert_silently_gated(pipeline, ns, "second")

    removed = await ungate(pipeline, ns, "second")
    nodes = [
        (await pipeline.bound(ns, name, timeout_s=10))["spec"]["nodeName"]
        for name in ("first", "second")
    ]
    took = time.monotonic() - removed
    assert nodes == ["gt-a100", "gt-a100"]
    assert took < UNGATED_BIND_S, f"the gang was bound {took:.1f}s after its gate was removed"
