"""Preemption, reclaim and the starvation guard on the real API server, with the five
services as processes: a gang is never cut below its minMember, and a starved gang gets
the nodes it waits for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, start_pipeline
from tests.integration.test_batch import VOLCANO, member, podgroup, queue

pytestmark = pytest.mark.integration
WHOLE = {"nvidia.com/gpu": 1}
INVENTORY = {
    "nodes": [
        {
            "name": f"pr-{n}",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        }
        for n in ("a", "b")
    ]
}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("preemption"),
        kubeconfig,
        nats_admin,
        INVENTORY,
        {"starvationGuardS": 3.0},
    )
    try:
        await kube.request(
            p.api,
            "POST",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "tessera-test-high"},
                "value": 1000,
            },
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    yield p
    await p.close()


def high(spec: dict[str, Any]) -> dict[str, Any]:
    spec["spec"]["priorityClassName"] = "tessera-test-high"
    return spec


async def exists(p: Pipeline, ns: str, name: str) -> bool:
    try:
        await p.get(ns, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def told(p: Pipeline, ns: str, name: str, reason: str) -> list[str]:
    return [e["message"] for e in await p.events(ns, name) if e["reason"] == reason]


async def test_a_high_priority_gang_evicts_a_whole_lower_gang_never_part_of_it(
    pipeline: Pipeline, ns: str
) -> None:
    batch, prod = f"batch-{ns}", f"prod-{ns}"
    await queue(pipeline, batch, weight=1, reclaimable=True)
    await queue(pipeline, prod, weight=1)
    await podgroup(pipeline, ns, "low", 3, queue=batch)
    low = [f"low-{i}" for i in range(4)]
    for n in low:
        await pipeline.create(ns, member(n, "low", WHOLE))
    for n in low:
        await pipeline.bound(ns, n)
    # 4 cards, all held by "low" (minMember 3). Two of them for "top": taking 2 would
    # leave "low" at 2 < 3, so all of it goes.
    await podgroup(pipeline, ns, "top", 2, queue=prod)
    for n in ("top-0", "top-1"):
        await pipeline.create(ns, high(member(n, "top", WHOLE)))
    for n in ("top-0", "top-1"):
        await pipeline.bound(ns, n, timeout_s=60)

    async def low_gone() -> bool:
        return not any([await exists(pipeline, ns, n) for n in low])

    await eventually(low_gone, what="the whole lower gang evicted")
    preempted = await told(pipeline, ns, "low-0", "Preempted")
    assert preempted, "a Preempted Event on the victim"
    assert f"Preempted by gang {ns}/top" in preempted[0]
    assert "all of gang low (never below minMember 3)" in preempted[0]


async def test_a_member_beyond_min_member_goes_alone_and_the_gang_keeps_running(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "elastic", 2)
    names = [f"e-{i}" for i in range(4)]
    for n in names:
        await pipeline.create(ns, member(n, "elastic", WHOLE))
    for n in names:
        await pipeline.bound(ns, n)
    await pipeline.create(ns, high(pod("urgent", WHOLE)))
    await pipeline.bound(ns, "urgent", timeout_s=60)
    alive = [n for n in names if await exists(pipeline, ns, n)]
    assert len(alive) == 3, alive  # exactly one surplus member made room
    pg = await kube.request(pipeline.api, "GET", f"{VOLCANO}/namespaces/{ns}/podgroups/elastic")
    assert (pg.get("status") or {}).get("phase") == "Running"


async def test_a_lower_priority_pod_is_never_evicted_for_an_equal_one(
    pipeline: Pipeline, ns: str
) -> None:
    names = [f"full-{i}" for i in range(4)]
    for n in names:
        await pipeline.create(ns, pod(n, WHOLE))
    for n in names:
        await pipeline.bound(ns, n)
    await pipeline.create(ns, pod("equal", WHOLE))

    async def waits() -> list[str]:
        return await told(pipeline, ns, "equal", "FailedScheduling")

    await eventually(waits, what="the equal-priority pod told why it waits")
    await asyncio.sleep(2.0)
    assert all([await exists(pipeline, ns, n) for n in names])
    assert not (await pipeline.get(ns, "equal"))["spec"].get("nodeName")


async def test_a_starved_gang_gets_nodes_held_and_smaller_pods_stop_taking_them(
    pipeline: Pipeline, ns: str
) -> None:
    await pipeline.create(ns, pod("early", WHOLE))
    await pipeline.bound(ns, "early")
    await podgroup(pipeline, ns, "wide", 4)
    wide = [f"wide-{i}" for i in range(4)]
    for n in wide:
        await pipeline.create(ns, member(n, "wide", WHOLE))

    async def held() -> list[str]:
        return [m for m in await told(pipeline, ns, "wide-0", "FailedScheduling") if "held" in m]

    # Smaller pods are backfilled meanwhile; after starvationGuardS (3 s) the nodes the
    # gang would fit on are held for it.
    message = (await eventually(held, timeout_s=60, what="nodes held for the gang"))[0]
    assert "are held for it until their pods finish" in message
    await pipeline.create(ns, pod("late", WHOLE))

    async def late_told() -> list[str]:
        return [
            m
            for m in await told(pipeline, ns, "late", "FailedScheduling")
            if f"held for gang {ns}/wide" in m
        ]

    await eventually(late_told, what="the later pod told the nodes are held")
    await pipeline.delete(ns, "early")
    for n in wide:
        await pipeline.bound(ns, n, timeout_s=60)
    assert not (await pipeline.get(ns, "late"))["spec"].get("nodeName")


async def test_a_pod_within_its_queues_minimum_runtime_is_not_preempted_until_it_ends(
    pipeline: Pipeline, ns: str
) -> None:
    """KAI's ``preemptMinRuntime`` on a Volcano Queue: the high-priority pod waits, told
    when the protection ends, and then preempts."""
    guarded = f"guarded-{ns}"
    await queue(pipeline, guarded, weight=1, preemptMinRuntime="8s")
    await podgroup(pipeline, ns, "old", 1, queue=guarded)
    old = [f"old-{i}" for i in range(4)]
    for n in old:
        await pipeline.create(ns, member(n, "old", WHOLE))
    for n in old:
        await pipeline.bound(ns, n)
    await podgroup(pipeline, ns, "new", 1, queue=guarded)
    await pipeline.create(ns, high(member("new-0", "new", WHOLE)))

    async def protected() -> list[str]:
        return [
            m
            for m in await told(pipeline, ns, "new-0", "FailedScheduling")
            if "protected by their minimum runtime" in m
        ]

    said = await eventually(protected, what="the wait for the minimum runtime told")
    assert "the first may be evicted in" in said[0]
    assert all([await exists(pipeline, ns, n) for n in old]), "none evicted while protected"
    await pipeline.bound(ns, "new-0", timeout_s=90)  # then preemption goes ahead
