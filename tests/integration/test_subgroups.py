"""Gangs of gangs on the real API server (shared/core/subgroups.py): a PodGroup's
``subGroupPolicy`` gets whole subgroups bound and never a partial one, a policy that
cannot reach its ``minSubGroups`` tells its pods why, and a Volcano Job's
``partitionPolicy`` becomes its PodGroup's subgroup policy and a label on each pod."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from shared.core.request import GROUP_NAME
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline

pytestmark = pytest.mark.integration
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
PART = "volcano.sh/partition-id"
INVENTORY = {
    "nodes": [
        {
            "name": "sg-a100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 3}
            ],
        },
    ]
}
CARD = {"nvidia.com/gpu": 1}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("subgroups"), kubeconfig, nats_admin, INVENTORY
    )
    yield p
    await p.close()


def prefill(min_subgroups: int) -> dict[str, Any]:
    return {
        "name": "prefill",
        "subGroupSize": 2,
        "minSubGroups": min_subgroups,
        "labelSelector": {"matchLabels": {"role": "prefill"}},
        "matchLabelKeys": ["replica"],
    }


async def members(p: Pipeline, ns: str, group: str, replicas: list[str]) -> list[str]:
    names = []
    for i, replica in enumerate(replicas):
        name = f"{group}-{i}"
        labels = {"role": "prefill", "replica": replica}
        await p.create(ns, pod(name, CARD, annotations={GROUP_NAME: group}, labels=labels))
        names.append(name)
    return names


async def nodes(p: Pipeline, ns: str, names: list[str]) -> dict[str, str | None]:
    return {n: (await p.get(ns, n))["spec"].get("nodeName") for n in names}


async def test_two_subgroups_of_two_on_three_cards_get_one_whole_subgroup_bound(
    pipeline: Pipeline, ns: str
) -> None:
    """minMember 2 alone would bind three pods (the third as an extra that fits): each
    subgroup is whole or not at all, so exactly one subgroup is bound."""
    await podgroup(pipeline, ns, "pd", 2, subGroupPolicy=[prefill(1)])
    names = await members(pipeline, ns, "pd", ["0", "0", "1", "1"])

    async def two_bound() -> dict[str, str | None] | None:
        found = await nodes(pipeline, ns, names)
        return found if sum(1 for n in found.values() if n) >= 2 else None

    await eventually(two_bound, what="a whole subgroup bound")
    await asyncio.sleep(4.0)  # retries of the other subgroup come and go: it never fits whole
    found = await nodes(pipeline, ns, names)
    bound = sorted(n for n, node in found.items() if node)
    assert bound in (names[:2], names[2:]), found
    told = [e for e in await pipeline.events(ns, names[2]) if e["reason"] == "FailedScheduling"]
    if bound == names[:2]:
        assert told, "the subgroup left out is told why"
        assert "subgroup prefill/1: 2 pods together" in told[-1]["message"]


async def test_a_policy_short_of_min_sub_groups_tells_its_pods_why(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "short", 1, subGroupPolicy=[prefill(2)])
    names = await members(pipeline, ns, "short", ["0", "0", "1"])
    said = (
        'subGroupPolicy "prefill": 1 whole subgroup of 2 pods exists, minSubGroups is 2: '
        "the PodGroup's pods wait until enough subgroups are whole"
    )

    async def told() -> dict[str, Any] | None:
        pod_now = await pipeline.get(ns, names[0])
        conditions = (pod_now.get("status") or {}).get("conditions") or []
        scheduled = [c for c in conditions if c["type"] == "PodScheduled"]
        events = [e for e in await pipeline.events(ns, names[0]) if said in e["message"]]
        return scheduled[0] if scheduled and events else None

    condition = await eventually(told, what="the Event and condition saying why")
    assert condition["status"] == "False"
    assert said in condition["message"]
    assert set((await nodes(pipeline, ns, names)).values()) == {None}


async def test_a_volcano_job_with_a_partition_policy_gets_a_subgroup_policy(
    pipeline: Pipeline, ns: str
) -> None:
    jobs = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs"
    task = {
        "name": "prefill",
        "replicas": 4,
        "minAvailable": 2,
        "partitionPolicy": {"totalPartitions": 2, "partitionSize": 2, "minPartitions": 1},
        "template": {
            "spec": {
                "containers": [{"name": "main", "image": "busybox", "resources": {"limits": CARD}}],
                "restartPolicy": "OnFailure",
            }
        },
    }
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "pd"},
        "spec": {"minAvailable": 2, "schedulerName": "volcano", "tasks": [task]},
    }
    await kube.request(pipeline.api, "POST", jobs, job)

    async def podgroup_made() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await kube.request(
                pipeline.api, "GET", f"{VOLCANO}/namespaces/{ns}/podgroups/pd"
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    made = await eventually(podgroup_made, what="the Job's PodGroup")
    assert made["spec"]["subGroupPolicy"] == [
        {
            "name": "prefill",
            "subGroupSize": 2,
            "minSubGroups": 1,
            "labelSelector": {"matchLabels": {"volcano.sh/task-spec": "prefill"}},
            "matchLabelKeys": [PART],
        }
    ]
    names = [f"pd-prefill-{i}" for i in range(4)]

    async def made_pods() -> dict[str, str | None] | None:
        found = await kube.request(
            pipeline.api,
            "GET",
            f"/api/v1/namespaces/{ns}/pods",
            query={"labelSelector": "volcano.sh/job-name=pd"},
        )
        labels = {p["metadata"]["name"]: p["metadata"]["labels"].get(PART) for p in found["items"]}
        return labels if len(labels) == len(names) else None

    labels = await eventually(made_pods, what="the Job's four pods")
    assert labels == dict(zip(names, ["0", "0", "1", "1"], strict=True))

    async def one_partition_bound() -> dict[str, str | None] | None:
        found = await nodes(pipeline, ns, names)
        return found if sum(1 for n in found.values() if n) >= 2 else None

    await eventually(one_partition_bound, what="one whole partition bound")
    await asyncio.sleep(3.0)
    found = await nodes(pipeline, ns, names)
    bound = sorted(n for n, node in found.items() if node)
    assert bound in (names[:2], names[2:]), found
    await kube.request(pipeline.api, "DELETE", f"{jobs}/pd")
