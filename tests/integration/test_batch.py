"""Gangs and queues on the real API server: PodGroup minMember all-or-nothing with status,
weighted fair share under contention, capability caps, Closed queues."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.node_agent.simulate import _uuid
from shared import kube
from shared.config import NatsConfig
from shared.core.request import GROUP_NAME, TASK_SPEC
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline
from tests.integration.vcjobs import run_all

pytestmark = pytest.mark.integration
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
INVENTORY = {
    "nodes": [
        {
            "name": "bt-a100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 3}
            ],
        },
    ]
}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("batch"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


async def queue(p: Pipeline, name: str, **spec: Any) -> None:
    await kube.request(
        p.api,
        "POST",
        f"{VOLCANO}/queues",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


async def cordon(p: Pipeline, uuids: str) -> None:
    """Cordon these device UUIDs (``hami.io/device-cordon``); empty uncordons all."""
    await kube.request(
        p.api,
        "PATCH",
        "/api/v1/nodes/bt-a100",
        {"metadata": {"annotations": {"hami.io/device-cordon": uuids or None}}},
        content_type="application/merge-patch+json",
    )


def member(
    name: str, group: str, limits: dict[str, Any], task: str | None = None
) -> dict[str, Any]:
    annotations = {GROUP_NAME: group}
    if task:
        annotations[TASK_SPEC] = task
    return pod(name, limits, annotations=annotations)


async def nodes_of(p: Pipeline, ns: str, names: list[str]) -> dict[str, str | None]:
    return {n: (await p.get(ns, n))["spec"].get("nodeName") for n in names}


def vcjob(name: str, replicas: int, min_available: int, limits: dict[str, Any]) -> dict[str, Any]:
    """A Volcano Job as users write it (the seed's example shape)."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "minAvailable": min_available,
            "schedulerName": "volcano",
            "queue": "default",
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "plugins": {"env": [], "svc": []},
            "tasks": [
                {
                    "replicas": replicas,
                    "name": "worker",
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "worker",
                                    "image": "pytorch/pytorch",
                                    "resources": {"limits": limits},
                                }
                            ],
                            "restartPolicy": "OnFailure",
                        }
                    },
                }
            ],
        },
    }


async def job_pods(p: Pipeline, ns: str, job: str) -> list[dict[str, Any]]:
    found = await kube.request(
        p.api,
        "GET",
        f"/api/v1/namespaces/{ns}/pods",
        query={"labelSelector": f"volcano.sh/job-name={job}"},
    )
    items: list[dict[str, Any]] = found["items"]
    return items


async def test_volcano_job_starts_both_workers_or_none_and_deletes_its_pods(
    pipeline: Pipeline, ns: str
) -> None:
    jobs = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs"
    await kube.request(
        pipeline.api,
        "POST",
        jobs,
        vcjob("mnist", 2, 2, {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 20000}),
    )
    # bound together, then running as their kubelet would say (no node runs them here)
    await run_all(pipeline, ns, ["mnist-worker-0", "mnist-worker-1"])
    pod0 = await pipeline.get(ns, "mnist-worker-0")
    env = {e["name"]: e.get("value") for e in pod0["spec"]["containers"][0]["env"]}
    assert (env["VC_TASK_INDEX"], pod0["spec"]["subdomain"]) == ("0", "mnist")

    async def running() -> bool:
        job = await kube.request(pipeline.api, "GET", f"{jobs}/mnist")
        return ((job.get("status") or {}).get("state") or {}).get("phase") == "Running"

    await eventually(running, what="the Job Running")
    # The status as Volcano writes it: counts per task and a condition per phase.
    status = (await kube.request(pipeline.api, "GET", f"{jobs}/mnist"))["status"]
    assert status["taskStatusCount"] == {"worker": {"phase": {"Running": 2}}}
    assert (status["running"], status["minAvailable"]) == (2, 2)
    assert [c["status"] for c in status["conditions"]][-1] == "Running"
    assert status["state"]["lastTransitionTime"] == status["conditions"][-1]["lastTransitionTime"]
    # a job too wide for the 3 cards: 4 workers of a whole card each, minAvailable 4
    await kube.request(pipeline.api, "POST", jobs, vcjob("wide", 4, 4, {"nvidia.com/gpu": 1}))

    async def wide_told() -> bool:
        return all(
            [
                any(
                    e["reason"] == "FailedScheduling"
                    for e in await pipeline.events(ns, f"wide-worker-{i}")
                )
                for i in range(4)
            ]
        )

    await eventually(wide_told, what="all four wide workers told why they wait")
    assert all(not p["spec"].get("nodeName") for p in await job_pods(pipeline, ns, "wide"))
    # deleting a Job deletes its pods (no garbage collector runs here)
    await kube.request(pipeline.api, "DELETE", f"{jobs}/mnist")

    async def gone() -> bool:
        return not await job_pods(pipeline, ns, "mnist")

    await eventually(gone, what="the Job's pods deleted")
    await kube.request(pipeline.api, "DELETE", f"{jobs}/wide")


async def test_a_restart_job_policy_restarts_every_pod_when_one_is_evicted(
    pipeline: Pipeline, ns: str
) -> None:
    jobs = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs"
    limits = {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 10000}
    await kube.request(pipeline.api, "POST", jobs, vcjob("rs", 2, 2, limits))
    names = ["rs-worker-0", "rs-worker-1"]
    first = {n: (await pipeline.bound(ns, n))["metadata"]["uid"] for n in names}
    await pipeline.delete(ns, "rs-worker-0")  # evicted (no kubelet here: deleted at once)

    async def all_new_and_bound() -> bool:
        pods = {p["metadata"]["name"]: p for p in await job_pods(pipeline, ns, "rs")}
        return set(pods) == set(names) and all(
            pods[n]["metadata"]["uid"] != first[n] and pods[n]["spec"].get("nodeName")
            for n in names
        )

    await eventually(all_new_and_bound, timeout_s=60, what="both workers new and bound")
    await kube.request(pipeline.api, "DELETE", f"{jobs}/rs")


async def test_min_task_member_holds_a_gang_until_every_role_is_there(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "roles", 2, min_task_member={"ps": 1, "worker": 1})
    small = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}
    for n in ("worker-0", "worker-1"):
        await pipeline.create(ns, member(n, "roles", small, task="worker"))
    await asyncio.sleep(3.0)  # minMember 2 is met by the workers alone; no ps yet
    assert set((await nodes_of(pipeline, ns, ["worker-0", "worker-1"])).values()) == {None}
    await pipeline.create(ns, member("ps-0", "roles", small, task="ps"))
    for n in ("ps-0", "worker-0", "worker-1"):
        await pipeline.bound(ns, n)


async def test_gang_of_4_that_fits_3_waits_whole_while_a_later_pod_is_placed(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "train", 4)
    names = [f"worker-{i}" for i in range(4)]
    for n in names:
        await pipeline.create(ns, member(n, "train", {"nvidia.com/gpu": 1}))

    async def unschedulable() -> dict[str, Any] | None:
        pg = await kube.request(pipeline.api, "GET", f"{VOLCANO}/namespaces/{ns}/podgroups/train")
        found = [
            c
            for c in (pg.get("status") or {}).get("conditions", [])
            if c["type"] == "Unschedulable"
        ]
        return found[0] if found else None

    cond = await eventually(unschedulable, what="the PodGroup's Unschedulable condition")
    assert cond["message"].startswith("4/4 tasks in gang unschedulable: 0/1 nodes are available")
    await pipeline.create(ns, pod("small", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}))
    await pipeline.bound(ns, "small")
    assert set((await nodes_of(pipeline, ns, names)).values()) == {None}
    told = [e for e in await pipeline.events(ns, "worker-0") if e["reason"] == "FailedScheduling"]
    assert told
    assert "tasks in gang unschedulable" in told[0]["message"]


async def test_gang_that_fits_is_placed_whole_and_the_podgroup_runs(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "pair", 2)
    for n in ("a", "b"):
        await pipeline.create(
            ns, member(n, "pair", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000})
        )
    for n in ("a", "b"):
        await pipeline.bound(ns, n)

    async def running() -> bool:
        pg = await kube.request(pipeline.api, "GET", f"{VOLCANO}/namespaces/{ns}/podgroups/pair")
        return (pg.get("status") or {}).get("phase") == "Running"

    await eventually(running, what="PodGroup phase Running")


async def test_closed_queue_holds_its_pods_with_a_reason(pipeline: Pipeline, ns: str) -> None:
    await queue(pipeline, f"closed-{ns}", weight=1, state="Closed")
    await podgroup(pipeline, ns, "held", 1, queue=f"closed-{ns}")
    await pipeline.create(
        ns, member("held-0", "held", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    )

    async def told() -> str | None:
        found = [
            e["message"]
            for e in await pipeline.events(ns, "held-0")
            if e["reason"] == "FailedScheduling"
        ]
        return found[0] if found else None

    assert f'queue "closed-{ns}" is Closed' in await eventually(told, what="the reason")
    assert not (await pipeline.get(ns, "held-0"))["spec"].get("nodeName")


async def test_capability_caps_a_queue_even_with_the_cluster_free(
    pipeline: Pipeline, ns: str
) -> None:
    await queue(pipeline, f"capped-{ns}", weight=1, capability={"nvidia.com/gpumem": "40960"})
    await podgroup(pipeline, ns, "capped", 1, queue=f"capped-{ns}")
    names = [f"c-{i}" for i in range(4)]
    for n in names:
        await pipeline.create(
            ns, member(n, "capped", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480})
        )

    async def bound() -> list[str]:
        return [n for n, v in (await nodes_of(pipeline, ns, names)).items() if v is not None]

    first = await eventually(bound, what="pods of the capped queue bound")
    await eventually(lambda: _bound_count(pipeline, ns, names, 2), what="two of four bound")
    await asyncio.sleep(2.0)  # the cluster has room for 10 more: the cap alone holds them
    assert await _bound_count(pipeline, ns, names, 2)
    await pipeline.delete(ns, first[0])  # room within the cap: one more may go
    rest = [n for n in names if n != first[0]]
    await eventually(lambda: _bound_count(pipeline, ns, rest, 2), what="a replacement bound")


async def _bound_count(p: Pipeline, ns: str, names: list[str], want: int) -> bool:
    return sum(v is not None for v in (await nodes_of(p, ns, names)).values()) == want


async def test_queues_weighted_1_to_3_share_a_contended_cluster_1_to_3(
    pipeline: Pipeline, ns: str
) -> None:
    light, heavy = f"light-{ns}", f"heavy-{ns}"
    await queue(pipeline, light, weight=1)
    await queue(pipeline, heavy, weight=3)
    await podgroup(pipeline, ns, "pg-light", 1, queue=light)
    await podgroup(pipeline, ns, "pg-heavy", 1, queue=heavy)
    # every card cordoned: both queues' pods queue up; uncordoned, they contend at once
    cards = ",".join(_uuid("bt-a100", "nvidia", i) for i in range(3))
    await cordon(pipeline, cards)
    # 3 cards x 4 slices of 20 GiB = 12 pods fit; each queue asks for 12
    light_pods = [f"l-{i}" for i in range(12)]
    heavy_pods = [f"h-{i}" for i in range(12)]
    for n in light_pods:
        await pipeline.create(
            ns, member(n, "pg-light", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480})
        )
    for n in heavy_pods:
        await pipeline.create(
            ns, member(n, "pg-heavy", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480})
        )

    async def all_told() -> bool:
        for n in [*light_pods, *heavy_pods]:
            if not any(e["reason"] == "FailedScheduling" for e in await pipeline.events(ns, n)):
                return False
        return True

    try:
        await eventually(all_told, what="every pod waiting for a card")
    finally:
        await cordon(pipeline, "")

    async def full() -> bool:
        nodes = await nodes_of(pipeline, ns, light_pods + heavy_pods)
        return sum(v is not None for v in nodes.values()) == 12

    await eventually(full, timeout_s=60, what="the cluster full")
    nodes = await nodes_of(pipeline, ns, light_pods + heavy_pods)
    got_light = sum(nodes[n] is not None for n in light_pods) * 20480
    got_heavy = sum(nodes[n] is not None for n in heavy_pods) * 20480
    assert got_heavy / got_light == pytest.approx(3.0, rel=0.10), (got_light, got_heavy)
