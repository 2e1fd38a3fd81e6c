"""Nobody books a device they were not given: a grant annotation written by hand (on a
pod created straight onto a node) holds nothing, while the allocator runs and after it
rebuilds its ledger, and the pod is told why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.node_agent.simulate import expand, load_inventory
from shared.config import NatsConfig
from shared.core import annotations as ann
from shared.core.model import ContainerGrant, DeviceGrant
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, start_pipeline

pytestmark = pytest.mark.integration

NODE = "tr-a100"
INVENTORY = {
    "nodes": [
        {
            "name": NODE,
            "labels": {"suite": "trust"},
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 1}
            ],
        }
    ]
}
WHOLE = {"nvidia.com/gpu": 1}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("trust"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


def forged(p: Pipeline) -> dict[str, Any]:
    """A pod created on the node with a hand-written grant of its only card, whole."""
    [(_, devices)] = expand(load_inventory(p.inventory)).values()
    grant = ContainerGrant(
        container="main",
        devices=(DeviceGrant(uuid=devices[0].uuid, memory_mib=81920, cores=100, exclusive=True),),
    )
    obj = pod("thief", {})
    obj["metadata"]["annotations"] = {
        ann.GRANT: ann.encode_grants([grant]),
        ann.SIGNATURE: "v1:not-a-signature",
    }
    obj["spec"]["nodeName"] = NODE
    return obj


def whole_card(name: str) -> dict[str, Any]:
    obj = pod(name, WHOLE)
    obj["spec"]["nodeSelector"] = {"suite": "trust"}
    return obj


async def test_a_forged_grant_holds_no_device_now_or_after_a_rebuild(
    pipeline: Pipeline, ns: str
) -> None:
    await pipeline.create(ns, forged(pipeline))

    async def told() -> str | None:
        for e in await pipeline.events(ns, "thief"):
            if e["reason"] == "ForgedGrant":
                return str(e["message"])
        return None

    message = await eventually(told, what="the forged grant refused")
    assert "not written by Tessera" in message
    # Its card is free: a pod asking for the whole card gets it.
    await pipeline.create(ns, whole_card("honest-1"))
    await pipeline.bound(ns, "honest-1")
    await pipeline.delete(ns, "honest-1")
    # A new allocator rebuilds from the API server: the forged grant counts no more.
    pipeline.kill("device-allocator")
    await pipeline.create(ns, whole_card("honest-2"))
    bound = await pipeline.bound(ns, "honest-2", timeout_s=60)
    assert ann.SIGNATURE in bound["metadata"]["annotations"]  # Tessera's own is signed
