"""Allocator shards on the real API server and NATS: two allocators, each placing its own
pool (``scheduler.shards``, docs/sharding.md).

Each shard owns one node of two whole A100s: ``sh-a`` (``pool: a``) and ``sh-b``
(``pool: b``). Nodes other test modules left on the shared API server belong to no
shard, so no allocator here places on them; every pod here selects ``suite: shards``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared import busauth, kube
from shared.bus import ask, connect
from shared.config import NatsConfig
from shared.core.request import GROUP_NAME
from shared.core.shards import Shard, Shards
from shared.views import VIEW_LEDGER_SUBJECT, LedgerQuery, LedgerView
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline

pytestmark = pytest.mark.integration

SUITE = {"suite": "shards"}
A100 = {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
INVENTORY = {
    "nodes": [
        {"name": "sh-a", "labels": {**SUITE, "pool": "a"}, "devices": [A100]},
        {"name": "sh-b", "labels": {**SUITE, "pool": "b"}, "devices": [A100]},
    ]
}
SHARDS = [
    {"name": "pool-a", "nodeSelector": {**SUITE, "pool": "a"}},
    {"name": "pool-b", "nodeSelector": {**SUITE, "pool": "b"}},
]
POOLS = Shards(Shard(str(s["name"]), dict(s["nodeSelector"])) for s in SHARDS)
WHOLE = {"nvidia.com/gpu": 1}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("shards"),
        kubeconfig,
        nats_admin,
        INVENTORY,
        settings={"shards": SHARDS},
    )
    yield p
    await p.close()


def spec(name: str, *, selector: dict[str, str] | None = None, group: str = "") -> dict[str, Any]:
    obj = pod(name, WHOLE, annotations={GROUP_NAME: group} if group else None)
    obj["spec"]["nodeSelector"] = {**SUITE, **(selector or {})}
    return obj


def first_offered_to(ns: str, shard: str, prefix: str, count: int) -> list[str]:
    """``count`` pod names whose route (a hash of ``ns/name``) starts at ``shard``."""
    names = (f"{prefix}-{i}" for i in itertools.count())
    return list(
        itertools.islice((n for n in names if POOLS.route(f"{ns}/{n}", [SUITE])[0] == shard), count)
    )


async def test_each_shard_places_on_its_own_nodes_only(pipeline: Pipeline, ns: str) -> None:
    await pipeline.create(ns, spec("to-a", selector={"pool": "a"}))
    await pipeline.create(ns, spec("to-b", selector={"pool": "b"}))
    assert await pipeline.node_of(ns, "to-a") == "sh-a"
    assert await pipeline.node_of(ns, "to-b") == "sh-b"
    # The ledger view reads as one allocator's: each shard answers for its node.
    nc = await connect(pipeline.nats_admin, busauth.ADMIN)
    try:
        query = LedgerQuery(nodes=("sh-a", "sh-b"))
        view = await ask(nc, VIEW_LEDGER_SUBJECT, query, LedgerView, service="device-allocator")
    finally:
        await nc.close()
    assert [n.name for n in view.nodes] == ["sh-a", "sh-b"]
    assert len(view.instance.split(",")) == 2
    held = {n.name: [g.pod for d in n.devices for g in d.grants] for n in view.nodes}
    assert held == {"sh-a": ["to-a"], "sh-b": ["to-b"]}
    for shard, mine, other in (("pool-a", "sh-a", "sh-b"), ("pool-b", "sh-b", "sh-a")):
        log = pipeline.log(f"device-allocator:{shard}")
        # Its node, known at start or from the Node's labels when it came.
        assert (
            f"node {mine} joined shard {shard}" in log
            or f"ledger rebuilt for shard {shard}: 1 nodes" in log
        ), log[-3000:]
        assert f"node {other} joined" not in log


async def test_a_pod_its_first_shard_cannot_place_goes_on_to_the_next(
    pipeline: Pipeline, ns: str
) -> None:
    for i in range(2):  # sh-a full
        await pipeline.create(ns, spec(f"fill-{i}", selector={"pool": "a"}))
        assert await pipeline.node_of(ns, f"fill-{i}") == "sh-a"
    names = first_offered_to(ns, "pool-a", "spill", 2)
    for n in names:
        await pipeline.create(ns, spec(n))
    assert [await pipeline.node_of(ns, n) for n in names] == ["sh-b", "sh-b"]
    assert "passed" in await metric_results(pipeline, "device-allocator:pool-a")
    # Both full now: the pod is told what both shards found, over both nodes.
    await pipeline.create(ns, spec("late"))
    message = await pipeline.refused(ns, "late")
    assert message.startswith("0/2 nodes are available: 2 "), message


async def test_a_gang_no_shard_fits_whole_is_placed_across_shards_or_not_at_all(
    pipeline: Pipeline, ns: str
) -> None:
    await podgroup(pipeline, ns, "wide", 4)
    wide = [f"wide-{i}" for i in range(4)]
    for n in wide:
        await pipeline.create(ns, spec(n, group="wide"))
    nodes = [await pipeline.node_of(ns, n) for n in wide]
    assert sorted(nodes) == ["sh-a", "sh-a", "sh-b", "sh-b"]
    assert "placed across shards" in (
        pipeline.log("device-allocator:pool-a") + pipeline.log("device-allocator:pool-b")
    )

    # A gang of 2 finds no GPU in either shard: neither shard holds any part of it.
    await podgroup(pipeline, ns, "pair", 2)
    for n in ("pair-0", "pair-1"):
        await pipeline.create(ns, spec(n, group="pair"))

    async def unschedulable() -> str | None:
        pg = await kube.request(
            pipeline.api,
            "GET",
            f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups/pair",
        )
        for c in (pg.get("status") or {}).get("conditions", []):
            if c["type"] == "Unschedulable":
                return str(c["message"])
        return None

    message = await eventually(unschedulable, what="the pair's Unschedulable condition")
    assert "0/2 nodes are available" in message, message
    assert "minMember is 2" in message, message
    for n in ("pair-0", "pair-1"):
        assert not (await pipeline.get(ns, n))["spec"].get("nodeName")

    # Three of the wide gang end: the pair is placed (one GPU on each node, or both on one).
    for n in wide[:3]:
        await pipeline.delete(ns, n)
    placed = [await pipeline.node_of(ns, n) for n in ("pair-0", "pair-1")]
    assert set(placed) <= {"sh-a", "sh-b"}


async def test_a_selector_no_shard_allows_is_told_over_every_shards_nodes(
    pipeline: Pipeline, ns: str
) -> None:
    await pipeline.create(ns, spec("nowhere", selector={"pool": "c"}))
    message = await pipeline.refused(ns, "nowhere")
    assert message == (
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    ), message


async def metric_results(p: Pipeline, service: str) -> set[str]:
    """The ``result`` labels of ``tessera_placements_total`` on one allocator."""
    text = await p.metrics(service)
    return {
        line.split('result="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("tessera_placements_total{")
    }
