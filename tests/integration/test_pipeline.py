"""End to end: the five services as processes on a real API server and NATS.

Pods written as HAMi and Volcano users write them are bound with the right grants;
unschedulable and invalid pods are told why; deletions free devices; an allocator killed
mid-stream double-books nothing; external tools read the allocation events.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from nats.aio.msg import Msg

from shared import events as ev
from shared import kube
from shared.bus import connect
from shared.config import NatsConfig
from shared.core import annotations as ann
from tests.helpers import eventually
from tests.integration.pipeline import REPO, Pipeline, pod, start_pipeline

pytestmark = pytest.mark.integration

INVENTORY = {
    "nodes": [
        {
            "name": "pl-a100-{i}",
            "replicas": 2,
            "devices": [
                {
                    "vendor": "nvidia",
                    "model": "NVIDIA-A100-SXM4-80GB",
                    "memory": 81920,
                    "count": 4,
                    "numa": 2,
                }
            ],
        },
        {
            "name": "pl-h100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-H100-80GB-HBM3", "memory": 81559, "count": 2}
            ],
        },
        {
            "name": "pl-mig",
            "devices": [
                {
                    "vendor": "nvidia",
                    "model": "NVIDIA-A100-SXM4-40GB",
                    "memory": 40960,
                    "count": 2,
                    "mode": "mig",
                }
            ],
        },
        {
            "name": "pl-910b3",
            "devices": [
                {
                    "vendor": "ascend",
                    "model": "Ascend910B3",
                    "chip": "910B3",
                    "memory": 65536,
                    "count": 2,
                }
            ],
        },
        {
            "name": "pl-310p",
            "devices": [
                {
                    "vendor": "ascend",
                    "model": "Ascend310P3",
                    "chip": "310P3",
                    "memory": 21527,
                    "count": 2,
                }
            ],
        },
    ]
}
CAPACITY = {"pl-a100-0": 81920, "pl-a100-1": 81920, "pl-h100": 81559, "pl-mig": 40960}


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("pipeline"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


def grants_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    text = obj["metadata"]["annotations"][ann.GRANT]
    return [d for c in json.loads(text) for d in c.get("devices", [])]


async def test_every_request_kind_is_bound_with_the_right_grant(
    pipeline: Pipeline, ns: str
) -> None:
    docs = [
        d
        for d in yaml.safe_load_all((REPO / "examples/workloads/demo.yaml").read_text())
        if d["metadata"]["name"] not in ("too-big", "invalid-cores")
    ]
    for doc in docs:
        await pipeline.create(ns, doc)
    bound = {d["metadata"]["name"]: await pipeline.bound(ns, d["metadata"]["name"]) for d in docs}

    def one(name: str) -> dict[str, Any]:
        [grant] = grants_of(bound[name])
        return grant

    assert (one("hami-vgpu")["memory_mib"], one("hami-vgpu")["cores"]) == (20000, 30)
    two = grants_of(bound["hami-two-cards"])
    assert bound["hami-two-cards"]["spec"]["nodeName"] == "pl-h100"
    assert len({g["uuid"] for g in two}) == 2
    assert {g["memory_mib"] for g in two} == {81559 // 2}
    assert (one("volcano-vgpu")["memory_mib"], one("volcano-vgpu")["cores"]) == (8192, 25)
    assert one("volcano-gpu-share")["memory_mib"] == 4096
    assert "cores" not in one("volcano-gpu-share")
    whole = grants_of(bound["volcano-gpu-number"])
    assert len(whole) == 2
    assert all(g["exclusive"] for g in whole)
    assert bound["mig-small"]["spec"]["nodeName"] == "pl-mig"
    assert one("mig-small")["mig_profile"] == "2g.10gb"
    assert bound["ascend-template"]["spec"]["nodeName"] == "pl-910b3"
    assert one("ascend-template")["vnpu_template"] == "vir05_1c_16g"
    assert bound["mindcluster-vnpu"]["spec"]["nodeName"] == "pl-310p"
    assert one("mindcluster-vnpu")["vnpu_template"] == "vir04"

    async def scheduled() -> list[dict[str, Any]]:
        # Written after the Binding, from the binder's queue of Scheduled Events.
        return [e for e in await pipeline.events(ns, "hami-vgpu") if e["reason"] == "Scheduled"]

    told = await eventually(scheduled, what="the Scheduled Event of hami-vgpu")
    assert "Successfully assigned" in told[0]["message"]
    # Volcano's scheduler name is served too (configured), with the same result
    await pipeline.create(
        ns,
        pod(
            "volcano-named",
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 1024},
            scheduler="volcano",
        ),
    )
    await pipeline.bound(ns, "volcano-named")


async def test_unfittable_pod_waits_with_reasons_then_binds_when_capacity_frees(
    pipeline: Pipeline, ns: str
) -> None:
    await pipeline.create(ns, pod("blocker", {"huawei.com/npu-core": 16}))
    await pipeline.bound(ns, "blocker")
    await pipeline.create(ns, pod("waiter", {"huawei.com/npu-core": 8}))

    async def told() -> str | None:
        for e in await pipeline.events(ns, "waiter"):
            if e["reason"] == "FailedScheduling":
                return str(e["message"])
        return None

    message = await eventually(told, what="FailedScheduling on the waiter")
    # Every Node of the API server counts (other modules' nodes too), as kube-scheduler's.
    assert re.match(r"0/\d+ nodes are available: ", message), message
    assert "1 no idle device for an exclusive request" in message
    waiting = await pipeline.get(ns, "waiter")
    assert not waiting["spec"].get("nodeName")
    [cond] = [c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    await pipeline.delete(ns, "blocker")
    placed = await pipeline.bound(ns, "waiter")
    assert placed["spec"]["nodeName"] == "pl-310p"


async def told_invalid(pipeline: Pipeline, ns: str, name: str) -> tuple[str, str]:
    """The pod's ``PodScheduled=False`` (``InvalidRequest``) message and its Warning
    ``FailedScheduling`` Event's, once the watcher has written both."""

    async def condition() -> dict[str, Any] | None:
        obj = await pipeline.get(ns, name)
        found = [c for c in obj["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return found[0] if found else None

    cond = await eventually(condition, what="the PodScheduled condition")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidRequest")
    [event] = [e for e in await pipeline.events(ns, name) if e["reason"] == "FailedScheduling"]
    assert event["type"] == "Warning"
    return str(cond["message"]), str(event["message"])


async def test_invalid_pod_gets_an_event_and_a_condition(pipeline: Pipeline, ns: str) -> None:
    await pipeline.create(ns, pod("typo", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}))
    condition, event = await told_invalid(pipeline, ns, "typo")
    assert "nvidia.com/gpucores (container main): 150 exceeds 100" in condition
    assert "ask for at most 100" in event
    big = pod("huge", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 300000})
    await pipeline.create(ns, big)

    async def told() -> str | None:
        found = [e["message"] for e in await pipeline.events(ns, "huge")]
        return found[0] if found else None

    assert "larger than any nvidia card in the cluster" in await eventually(told, what="event")
    assert "typo" not in pipeline.log("watcher").lower() or "Traceback" not in pipeline.log(
        "watcher"
    )


async def test_a_pod_asking_memory_without_a_count_is_told_the_fix_not_placed(
    pipeline: Pipeline, ns: str
) -> None:
    """Without the webhook (none runs here) a container asking only memory would be
    placed and then get no Allocate from its kubelet: no devices, no limits, and its
    shape held on the node. It is refused instead, naming the container and the fix."""
    two = pod("mem-only", {"nvidia.com/gpumem": 2048, "nvidia.com/gpucores": 20})
    two["spec"]["containers"].append(
        {
            "name": "side",
            "image": "busybox",
            "resources": {"limits": {"volcano.sh/vgpu-memory-percentage": 10}},
        }
    )
    await pipeline.create(ns, two)
    condition, message = await told_invalid(pipeline, ns, "mem-only")
    assert message == condition
    assert message.startswith(
        "invalid device request: nvidia.com/gpumem (container main): nvidia.com/gpumem, "
        "nvidia.com/gpucores without a device count"
    )
    assert "add nvidia.com/gpu: 1 (Tessera's admission webhook adds it" in message
    assert (
        "volcano.sh/vgpu-memory-percentage (container side): volcano.sh/vgpu-memory-percentage "
        "without a device count" in message
    )
    assert "add volcano.sh/vgpu-number: 1" in message
    assert not (await pipeline.get(ns, "mem-only"))["spec"].get("nodeName")


async def test_deleting_a_pod_frees_its_grant(pipeline: Pipeline, ns: str) -> None:
    nc = await connect(pipeline.nats_admin, "reader")
    sub = await nc.subscribe("tessera.v1.allocation.released.>")
    try:
        await pipeline.create(ns, pod("all-910b3", {"huawei.com/Ascend910B3": 2}))
        first = await pipeline.bound(ns, "all-910b3")
        await pipeline.create(ns, pod("next", {"huawei.com/Ascend910B3": 2}))
        await asyncio.sleep(1.0)
        assert not (await pipeline.get(ns, "next"))["spec"].get("nodeName")
        await pipeline.delete(ns, "all-910b3")
        event = ev.decode((await sub.next_msg(timeout=20)).data)
        assert isinstance(event, ev.AllocationReleased)
        assert event.pod.uid == first["metadata"]["uid"]
        assert event.reason == "pod deleted"
        await pipeline.bound(ns, "next")
    finally:
        await sub.unsubscribe()
        await nc.close()


async def test_external_subscriber_sees_decided_then_bound_and_the_schema_validates(
    pipeline: Pipeline, ns: str
) -> None:
    schema = json.loads((REPO / "docs/events.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    seen: list[tuple[str, dict[str, Any]]] = []
    nc = await connect(pipeline.nats_admin, "reader")

    async def record(msg: Msg) -> None:  # bound is per node: tessera.v1.allocation.bound.<node>
        seen.append((".".join(msg.subject.split(".")[:4]), json.loads(msg.data)))

    sub = await nc.subscribe("tessera.v1.allocation.>", cb=record)
    try:
        names = [f"ext-{i}" for i in range(3)]
        for name in names:
            await pipeline.create(ns, pod(name, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048}))
        uids = {(await pipeline.bound(ns, n))["metadata"]["uid"] for n in names}

        async def both() -> bool:
            kinds = Counter(s for s, d in seen if d.get("pod", {}).get("uid") in uids)
            return (
                kinds["tessera.v1.allocation.decided"] >= 3
                and kinds["tessera.v1.allocation.bound"] >= 3
            )

        await eventually(both, what="decided and bound for each pod")
    finally:
        await sub.unsubscribe()
        await nc.close()
    mine = [(s, d) for s, d in seen if d.get("pod", {}).get("uid") in uids]
    assert Counter(s for s, _ in mine) == {
        "tessera.v1.allocation.decided": 3,
        "tessera.v1.allocation.bound": 3,
    }
    for _, data in mine:
        validator.validate(data)
        assert data["type"] in ("allocation.decided", "allocation.bound")


async def test_a_healthy_run_logs_nothing_above_info(pipeline: Pipeline, ns: str) -> None:
    """What this module's pipeline did before (every request kind bound, pods told why
    they wait or are refused, deletions, an external reader) and one more pod bound is a
    healthy run: no service logged a WARNING or an ERROR (a user's invalid pod is told on
    the pod, not in Tessera's logs). It runs before the test that kills the allocator."""
    await pipeline.create(ns, pod("quiet", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}))
    await pipeline.bound(ns, "quiet")
    assert pipeline.loud() == []


async def test_killing_the_allocator_mid_stream_double_books_nothing(
    pipeline: Pipeline, ns: str
) -> None:
    names = [f"burst-{i}" for i in range(24)]
    creating = asyncio.gather(
        *(
            pipeline.create(ns, pod(n, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000}))
            for n in names
        )
    )
    await asyncio.sleep(0.3)
    pipeline.kill("device-allocator")  # restarted by its keeper, as a kubelet would
    await creating

    async def settled() -> bool:
        done = 0
        for n in names:
            obj = await pipeline.get(ns, n)
            told = any(e["reason"] == "FailedScheduling" for e in await pipeline.events(ns, n))
            done += bool(obj["spec"].get("nodeName")) or told
        return done == len(names)

    await eventually(settled, timeout_s=60, what="every burst pod bound or told why not")
    # sum every grant of every bound pod in the cluster, per device
    used: Counter[str] = Counter()
    where: dict[str, str] = {}
    for item in (await kube.request(pipeline.api, "GET", "/api/v1/pods"))["items"]:
        node = item["spec"].get("nodeName")
        if not node or ann.GRANT not in item["metadata"].get("annotations", {}):
            continue
        for g in grants_of(item):
            used[g["uuid"]] += g["memory_mib"]
            where[g["uuid"]] = node
    for uuid, total in used.items():
        if where[uuid] in CAPACITY:
            assert total <= CAPACITY[where[uuid]], (uuid, total)
    bound = [n for n in names if (await pipeline.get(ns, n))["spec"].get("nodeName")]
    # 2 x 30 GiB fit per 80 GiB card: 8 A100 + 2 H100 cards hold 20; MIG takes 2 more
    assert len(bound) >= 20


async def test_a_pod_with_a_600_kb_variable_is_placed_and_the_watcher_stays_up(
    pipeline: Pipeline, ns: str
) -> None:
    """Regression: one watch event over 512 KiB stopped the watcher (aiohttp's line
    limit), and it died again on each restart: any user could stop all scheduling."""
    big = pod("big-env", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024})
    big["spec"]["containers"][0]["env"] = [{"name": "BLOB", "value": "x" * 600_000}]
    await pipeline.create(ns, big)
    await pipeline.bound(ns, "big-env")
    await pipeline.create(ns, pod("after-it", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024}))
    await pipeline.bound(ns, "after-it")
    assert not [r for r in pipeline.restarts if r.startswith("watcher")]
