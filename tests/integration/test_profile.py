"""The scheduling profile of the config reaches the allocator: ``scheduler.plugins``
without TaintToleration, a pod that tolerates nothing binds to a tainted node (on the
default profile it waits: "node(s) had untolerated taint(s)")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared import kube
from shared.config import NatsConfig
from tests.integration.pipeline import Pipeline, pod, start_pipeline

pytestmark = pytest.mark.integration
NODE = "profile-tainted"
INVENTORY = {
    "nodes": [
        {
            "name": NODE,
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 1}
            ],
        }
    ]
}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("profile"),
        kubeconfig,
        nats_admin,
        INVENTORY,
        {"plugins": {"filter": {"disabled": [{"name": "TaintToleration"}]}}},
    )
    yield p
    await p.close()


async def test_a_filter_the_profile_disables_refuses_nothing(pipeline: Pipeline) -> None:
    taint = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    await kube.request(
        pipeline.api,
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        {"spec": {"taints": [taint]}},
        content_type="application/merge-patch+json",
    )
    ns = await pipeline.namespace()
    await pipeline.create(ns, pod("untolerating", {"nvidia.com/gpu": 1}))
    assert await pipeline.node_of(ns, "untolerating") == NODE
