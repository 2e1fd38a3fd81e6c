"""One user per MPS card, on the real API server: an MPS daemon serves one Linux user
per card at a time, so pods of two UIDs never share an MPS card (the second waits, told
why), one of the first UID joins, and a pod in MPS mode that sets no UID, or whose
container asks two MPS cards, is refused with the reason (shared/core/request.py,
shared/core/families.py). The simulated node's MPS card reports its daemon running
(services/node_agent/simulate.py), as a real agent does once the card's daemon answers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.config import NatsConfig
from shared.core import annotations as ann
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, start_pipeline

pytestmark = pytest.mark.integration

INVENTORY = {
    "nodes": [
        {
            "name": "mps-0",
            "devices": [
                {
                    "vendor": "nvidia",
                    "model": "NVIDIA-H100-80GB-HBM3",
                    "memory": 81559,
                    "mode": "mps",
                }
            ],
        }
    ]
}
SLICE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000, "nvidia.com/gpucores": 30}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("mps"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


def mps_pod(name: str, user: int | None, limits: dict[str, int] = SLICE) -> dict[str, Any]:
    obj = pod(name, limits, annotations={"nvidia.com/vgpu-mode": "mps"})
    if user is not None:
        obj["spec"]["securityContext"] = {"runAsUser": user}
    return obj


async def told(pipeline: Pipeline, ns: str, name: str, text: str) -> str:
    async def probe() -> str | None:
        for e in await pipeline.events(ns, name):
            if e["reason"] == "FailedScheduling" and text in e["message"]:
                return str(e["message"])
        return None

    return await eventually(probe, what=f"{name} told {text!r}")


def card(obj: dict[str, Any]) -> str:
    grants = ann.read_grants(obj["metadata"]["annotations"])
    assert grants is not None
    return grants[0].devices[0].uuid


async def test_two_users_never_share_an_mps_card(pipeline: Pipeline) -> None:
    ns = await pipeline.namespace()
    await pipeline.create(ns, mps_pod("first", 1000))
    first = card(await pipeline.bound(ns, "first"))
    await pipeline.create(ns, mps_pod("stranger", 2000))
    message = await told(pipeline, ns, "stranger", "serve another user's MPS clients")
    # Counted as kube-scheduler counts (other tests' nodes may share this API server).
    assert re.match(r"0/\d+ nodes are available: 1 device\(s\) serve another user's MPS", message)
    await pipeline.create(ns, mps_pod("same-user", 1000))
    assert card(await pipeline.bound(ns, "same-user")) == first
    assert not (await pipeline.get(ns, "stranger"))["spec"].get("nodeName")
    # The first user's pods end: the card now serves the other user.
    await pipeline.delete(ns, "first")
    await pipeline.delete(ns, "same-user")
    assert card(await pipeline.bound(ns, "stranger", timeout_s=60)) == first


async def test_an_mps_pod_without_a_user_is_told_to_set_one(pipeline: Pipeline) -> None:
    ns = await pipeline.namespace()
    await pipeline.create(ns, mps_pod("anyone", None))
    message = await told(pipeline, ns, "anyone", "must set runAsUser")
    assert message.startswith("invalid device request: securityContext.runAsUser: ")
    assert "nodeAgent.mps.unsetUser: exclusive" in message


async def test_an_mps_pod_asking_two_cards_in_one_container_is_told_why(pipeline: Pipeline) -> None:
    """A client reaches one card's MPS daemon: the watcher refuses the request as invalid,
    as it does a pod without a user (the webhook gives the same message at creation)."""
    ns = await pipeline.namespace()
    await pipeline.create(ns, mps_pod("two-cards", 1000, {**SLICE, "nvidia.com/gpu": 2}))
    message = await told(pipeline, ns, "two-cards", "2 cards asked in MPS mode")
    assert message.startswith("invalid device request: nvidia.com/gpu (container main): ")
