"""What kube-scheduler users rely on in preemption, on the real API server with the
services as processes: a pod of preemptionPolicy Never waits and says so;
PodDisruptionBudgets steer the choice of victims and the preemptor is told which was
respected or broken; the preemptor's ``status.nominatedNodeName`` names its node until
it binds. The starvation guard is off here, so a waiting pod gets no nodes held."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from shared.core.preemption import NOT_ELIGIBLE
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, start_pipeline
from tests.integration.test_preemption import exists, high, told

pytestmark = pytest.mark.integration
WHOLE = {"nvidia.com/gpu": 1}
NODES = ("pp-a", "pp-b")
INVENTORY = {
    "nodes": [
        {
            "name": name,
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        }
        for name in NODES
    ]
}
CLASSES = {
    "tessera-test-high": {"value": 1000},
    "tessera-test-mid": {"value": 10},
    "tessera-test-never": {"value": 1000, "preemptionPolicy": "Never"},
}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("preemption-policy"),
        kubeconfig,
        nats_admin,
        INVENTORY,
        {"starvationGuardS": 0},
    )
    for name, fields in CLASSES.items():
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        try:
            await kube.request(
                p.api,
                "POST",
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {**body, "metadata": {"name": name}, **fields},
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
    yield p
    await p.close()


def classed(spec: dict[str, Any], name: str) -> dict[str, Any]:
    spec["spec"]["priorityClassName"] = name
    return spec


def on(spec: dict[str, Any], node: str) -> dict[str, Any]:
    spec["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


async def fill(p: Pipeline, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    names = [str(s["metadata"]["name"]) for s in pods]
    for spec in pods:
        await p.create(ns, spec)
    for name in names:
        await p.bound(ns, name)
    return names


async def budget(p: Pipeline, ns: str, name: str, app: str, **spec: Any) -> None:
    await kube.request(
        p.api,
        "POST",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": app}}, **spec},
        },
    )


async def ready(p: Pipeline, ns: str, name: str) -> None:
    """Mark a pod Running and Ready, as its kubelet would (no kubelet runs here)."""
    await kube.request(
        p.api,
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}/status",
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        content_type="application/strategic-merge-patch+json",
    )


async def test_a_pod_of_preemption_policy_never_waits_and_says_so(
    pipeline: Pipeline, ns: str
) -> None:
    low = await fill(pipeline, ns, [pod(f"low-{i}", WHOLE) for i in range(4)])
    created = await pipeline.create(ns, classed(pod("polite", WHOLE), "tessera-test-never"))
    assert created["spec"]["preemptionPolicy"] == "Never"  # from its PriorityClass
    assert created["spec"]["priority"] == 1000

    async def says() -> list[str]:
        return [
            m for m in await told(pipeline, ns, "polite", "FailedScheduling") if NOT_ELIGIBLE in m
        ]

    message = (await eventually(says, what="the Never pod told why it waits"))[0]
    assert message.startswith("0/2 nodes are available: ")
    assert message.endswith(f". {NOT_ELIGIBLE}")  # after the reasons, as kube-scheduler
    await asyncio.sleep(3.0)  # retried meanwhile: it never evicts anyone
    assert all([await exists(pipeline, ns, n) for n in low])
    assert not (await pipeline.get(ns, "polite"))["spec"].get("nodeName")
    assert not await told(pipeline, ns, "low-0", "Preempted")


async def test_the_node_whose_victims_break_no_budget_is_chosen_and_the_event_says_so(
    pipeline: Pipeline, ns: str
) -> None:
    await budget(pipeline, ns, "guard", "guarded", minAvailable=2)
    guarded = [on(pod(f"guarded-{i}", WHOLE, labels={"app": "guarded"}), "pp-a") for i in range(2)]
    # The pods of pp-b are of a higher priority (10 > 0): by priority alone, pp-a's go.
    busy = [
        on(classed(pod(f"busy-{i}", WHOLE, labels={"app": "busy"}), "tessera-test-mid"), "pp-b")
        for i in range(2)
    ]
    kept = await fill(pipeline, ns, guarded)
    gone = await fill(pipeline, ns, busy)
    for name in kept:
        await ready(pipeline, ns, name)  # 2 healthy, minAvailable 2: 0 disruptions allowed
    await pipeline.create(ns, high(pod("big", {"nvidia.com/gpu": 2})))
    assert (await pipeline.bound(ns, "big", timeout_s=60))["spec"]["nodeName"] == "pp-b"
    assert all([await exists(pipeline, ns, n) for n in kept])
    assert not any([await exists(pipeline, ns, n) for n in gone])
    [message] = [
        m for m in await told(pipeline, ns, "big", "FailedScheduling") if "Preempting" in m
    ]
    assert message.endswith(
        f"Preempting 2 pod(s) to make room on pp-b; PodDisruptionBudget {ns}/guard respected."
    )


async def test_when_every_choice_breaks_a_budget_the_preemptor_and_victims_are_told(
    pipeline: Pipeline, ns: str
) -> None:
    await budget(pipeline, ns, "all", "web", maxUnavailable=1)
    names = await fill(
        pipeline, ns, [pod(f"web-{i}", WHOLE, labels={"app": "web"}) for i in range(4)]
    )
    for name in names:
        await ready(pipeline, ns, name)  # bare pods: maxUnavailable allows nothing of them
    await pipeline.create(ns, high(pod("big", {"nvidia.com/gpu": 2})))
    node = str((await pipeline.bound(ns, "big", timeout_s=60))["spec"]["nodeName"])
    [message] = [
        m for m in await told(pipeline, ns, "big", "FailedScheduling") if "Preempting" in m
    ]
    assert message.endswith(
        f"Preempting 2 pod(s) to make room on {node}; violating PodDisruptionBudget {ns}/all"
        " (it allows 0 disruption(s)): no choice that respects it makes room."
    )
    evicted = [n for n in names if not await exists(pipeline, ns, n)]
    assert len(evicted) == 2
    [preempted] = await told(pipeline, ns, evicted[0], "Preempted")
    assert preempted.endswith(f"; violates PodDisruptionBudget {ns}/all")


async def test_the_preemptor_is_nominated_to_its_node_until_it_binds(
    pipeline: Pipeline, ns: str
) -> None:
    await fill(pipeline, ns, [pod(f"low-{i}", WHOLE) for i in range(4)])
    seen: list[tuple[str, str]] = []
    """Every state of the preemptor's (nominatedNodeName, nodeName), as the API server
    published them."""

    async def record(_kind: str, obj: dict[str, Any]) -> None:
        status, spec = obj.get("status") or {}, obj.get("spec") or {}
        seen.append((status.get("nominatedNodeName", ""), spec.get("nodeName", "")))

    async def nothing(_items: list[dict[str, Any]]) -> None:
        return None

    watch = asyncio.create_task(
        kube.list_watch(
            pipeline.api,
            f"/api/v1/namespaces/{ns}/pods",
            record,
            on_relist=nothing,
            query={"fieldSelector": "metadata.name=urgent"},
        )
    )
    try:
        await asyncio.sleep(0.5)  # the watch is open
        await pipeline.create(ns, high(pod("urgent", WHOLE)))
        node = str((await pipeline.bound(ns, "urgent", timeout_s=60))["spec"]["nodeName"])

        async def bound_seen() -> bool:
            return any(n for _, n in seen)

        await eventually(bound_seen, what="the watch saw the Binding")
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    nominated = [i for i, (nominee, _) in enumerate(seen) if nominee]
    assert nominated, seen
    assert {seen[i][0] for i in nominated} == {node}
    first_bound = next(i for i, (_, n) in enumerate(seen) if n)
    assert nominated[0] < first_bound  # named before it was bound
    assert seen[-1] == ("", node)  # and cleared when it was
    assert not (await pipeline.get(ns, "urgent"))["status"].get("nominatedNodeName")
