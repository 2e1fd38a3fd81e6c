"""NVLink topology inside a node on the real API server: a simulated node with two NVLink
islands reports its links in its inventory, and a pod with HAMi's
``hami.io/gpu-scheduler-policy: topology-aware`` asking 4 GPUs is bound to the 4 cards of
one island, the one left whole, as its grant annotation says."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.config import NatsConfig
from shared.core import annotations as ann
from tests.integration.pipeline import Pipeline, pod, start_pipeline

pytestmark = pytest.mark.integration

INVENTORY = {
    "nodes": [
        {
            "name": "tp-islands",
            "devices": [
                {
                    "vendor": "nvidia",
                    "model": "NVIDIA-A100-SXM4-80GB",
                    "memory": 81920,
                    "count": 8,
                    "numa": 2,
                    "nvlink": {"islands": 2, "links": 4},  # cards 0-3 and 4-7
                }
            ],
        },
    ]
}
TOPOLOGY = {"hami.io/gpu-scheduler-policy": "topology-aware"}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("topology"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


def indexes(obj: dict[str, Any]) -> list[int]:
    grants = json.loads(obj["metadata"]["annotations"][ann.GRANT])
    return sorted(d.get("index", 0) for c in grants for d in c.get("devices", []))


async def test_a_four_gpu_pod_gets_one_nvlink_island(pipeline: Pipeline, ns: str) -> None:
    # A card of the first island is taken: only the second is whole.
    await pipeline.create(
        ns, pod("pinned", {"nvidia.com/gpu": 1}, annotations={"volcano.sh/gpu-index": "1"})
    )
    assert indexes(await pipeline.bound(ns, "pinned")) == [1]
    await pipeline.create(ns, pod("linked", {"nvidia.com/gpu": 4}, annotations=TOPOLOGY))
    bound = await pipeline.bound(ns, "linked")
    assert bound["spec"]["nodeName"] == "tp-islands"
    assert indexes(bound) == [4, 5, 6, 7]
    # One card more: the rest of the broken island, not a card of a whole one.
    await pipeline.create(ns, pod("single", {"nvidia.com/gpu": 1}, annotations=TOPOLOGY))
    assert indexes(await pipeline.bound(ns, "single")) in ([0], [2], [3])
