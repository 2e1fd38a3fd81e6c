"""What the running scheduler shows of itself, on the real API server and NATS: every
service's ``/metrics`` (HAMi's, Volcano's and Tessera's names, with values that agree
with the grants), the live views (ledger, queues, explain) as the reader user asks
them, and Queue status as Volcano writes it."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.watcher.translate import pending_event
from shared import busauth, kube
from shared.bus import ViewUnavailable, ask, connect
from shared.config import NatsConfig, load, request_parser
from shared.core.hosts import pod_spec
from shared.core.model import PodRef, PodUID
from shared.views import (
    VIEW_EXPLAIN_SUBJECT,
    VIEW_LEDGER_SUBJECT,
    VIEW_QUEUES_SUBJECT,
    ExplainQuery,
    ExplainView,
    LedgerQuery,
    LedgerView,
    QueuesView,
)
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline

pytestmark = pytest.mark.integration

VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
INVENTORY = {
    "nodes": [
        {
            "name": "ob-a100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        },
    ]
}
MIB = 1 << 20

Samples = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("observe"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


async def scrape(p: Pipeline, service: str) -> Samples:
    text = await p.metrics(service)
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(samples: Samples, name: str, **labels: str) -> float:
    found = [v for ls, v in samples.get(name, []) if labels.items() <= ls.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for ls, v in samples.get(name, []) if labels.items() <= ls.items())


async def place_workload(p: Pipeline, ns: str) -> None:
    """Two vGPU pods and a gang of two in their own queue, all bound."""
    await p.create(
        ns,
        pod(
            "infer-a", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}
        ),
    )
    await p.create(
        ns,
        pod(
            "infer-b", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 20}
        ),
    )
    await kube.request(
        p.api,
        "POST",
        f"{VOLCANO}/queues",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": f"{ns}-q"},
            "spec": {"weight": 2},
        },
    )
    await podgroup(p, ns, "train", 2, queue=f"{ns}-q")
    for i in range(2):
        worker = pod(
            f"train-{i}",
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},
            annotations={"scheduling.k8s.io/group-name": "train"},
        )
        await p.create(ns, worker)
    for name in ("infer-a", "infer-b", "train-0", "train-1"):
        await p.bound(ns, name)


async def test_every_service_exposes_its_metrics_and_they_agree_with_the_grants(
    pipeline: Pipeline, ns: str
) -> None:
    await place_workload(pipeline, ns)

    async def allocator_caught_up() -> Samples | None:
        got = await scrape(pipeline, "device-allocator")
        pods = total(got, "hami_vgpu_memory_allocated_bytes", namespace=ns)
        return got if pods == (20000 + 10000 + 8000 + 8000) * MIB else None

    alloc = await eventually(allocator_caught_up, what="the allocator's metrics show the grants")
    # HAMi's per-card figures agree with the per-container ones, card by card.
    per_card: dict[str, float] = {}
    for labels, value in alloc["hami_vgpu_memory_allocated_bytes"]:
        per_card[labels["device_uuid"]] = per_card.get(labels["device_uuid"], 0) + value
    for labels, value in alloc["hami_gpu_memory_allocated_bytes"]:
        assert value == per_card.get(labels["device_uuid"], 0), labels
        uuid, node = labels["device_uuid"], labels["node"]
        assert one(alloc, "hami_gpu_memory_limit_bytes", device_uuid=uuid) == 81920 * MIB
        assert one(alloc, "volcano_vgpu_device_allocated_memory", devID=uuid) == value / MIB
        assert one(alloc, "volcano_vgpu_device_memory_limit", devID=uuid, NodeName=node) == 81920
        ratio = one(alloc, "hami_node_gpu_memory_allocated_ratio", device_uuid=uuid)
        assert math.isclose(ratio, value / (81920 * MIB))
        shared = one(alloc, "hami_gpu_shared_count", device_uuid=uuid)
        assert shared == one(alloc, "volcano_vgpu_device_shared_number", devID=uuid)
    assert sum(v for _, v in alloc["hami_gpu_shared_count"]) >= 4
    cores = {
        ls["pod"]: v for ls, v in alloc["hami_vgpu_core_allocated_ratio"] if ls["namespace"] == ns
    }
    assert cores["infer-a"] == 30
    assert cores["infer-b"] == 20
    for name in (
        "hami_gpu_core_limit_ratio",
        "hami_gpu_core_allocated_ratio",
        "hami_node_gpu_overview",
        "volcano_vgpu_device_allocated_cores",
        "volcano_vgpu_device_memory_allocation_for_a_certain_pod",
        "volcano_vgpu_device_core_allocation_for_a_certain_pod",
        "tessera_ledger_nodes",
        "tessera_ledger_devices",
        "tessera_ledger_pods",
    ):
        assert alloc.get(name), name
    assert total(alloc, "tessera_placements_total", result="placed") >= 3
    assert total(alloc, "volcano_e2e_job_scheduling_latency_milliseconds_count") >= 1
    assert total(alloc, "tessera_stage_latency_seconds_count", stage="decided") >= 4
    assert one(alloc, "tessera_active", service="device-allocator") == 1

    binder = await scrape(pipeline, "binder")
    assert total(binder, "tessera_binds_total") >= 4
    assert total(binder, "volcano_e2e_scheduling_latency_milliseconds_count") >= 4
    # Each pod bound within the minute: its latency is in a bucket below 60 s.
    assert (
        total(binder, "volcano_e2e_scheduling_latency_milliseconds_sum")
        / total(binder, "volcano_e2e_scheduling_latency_milliseconds_count")
        < 60_000
    )
    assert total(binder, "tessera_stage_latency_seconds_count", stage="bound") >= 4
    assert total(binder, "tessera_bind_failures_total") == 0

    coordinator = await scrape(pipeline, "gang-coordinator")
    for stage in ("pending", "ready"):
        assert total(coordinator, "tessera_stage_latency_seconds_count", stage=stage) >= 4
    queue = f"{ns}-q"
    assert one(coordinator, "volcano_queue_weight", queue_name=queue) == 2
    assert one(coordinator, "volcano_queue_pod_group_running_count", queue_name=queue) == 1
    allocated = {
        ls["resource"]: v
        for ls, v in coordinator["volcano_queue_allocated_scalar_resources"]
        if ls["queue_name"] == queue
    }
    assert allocated["nvidia.com/gpumem"] == 16000
    assert allocated["nvidia.com/gpu"] == 2
    for name in (
        "volcano_queue_deserved_scalar_resources",
        "volcano_queue_request_scalar_resources",
        "volcano_queue_share",
        "volcano_queue_overused",
        "volcano_queue_pod_group_pending_count",
        "volcano_queue_pod_group_inqueue_count",
    ):
        assert coordinator.get(name), name
    # Every consuming service reports how far behind its consumer is (caught up: 0).
    for service in ("gang-coordinator", "device-allocator", "binder"):
        got = await scrape(pipeline, service)
        assert one(got, "tessera_bus_pending_messages", consumer=service) >= 0
        assert total(got, "tessera_events_handled_total") > 0
    watcher = await scrape(pipeline, "watcher")
    assert total(watcher, "tessera_events_published_total", type="pod.pending") >= 4


async def test_queue_status_is_written_as_volcano_writes_it(pipeline: Pipeline, ns: str) -> None:
    await place_workload(pipeline, ns)

    async def written() -> dict[str, Any] | None:
        q = await kube.request(pipeline.api, "GET", f"{VOLCANO}/queues/{ns}-q")
        status = q.get("status") or {}
        return status if status.get("running") == 1 else None

    status = await eventually(written, what="the queue's status")
    assert status["state"] == "Open"
    assert status["pending"] == 0
    assert status["inqueue"] == 0
    assert status["allocated"] == {
        "nvidia.com/gpu": "2",
        "nvidia.com/gpumem": "16000",
        "nvidia.com/gpucores": "0",
    }


async def test_views_show_the_ledger_the_queues_and_why_a_pod_waits(
    pipeline: Pipeline, ns: str
) -> None:
    await place_workload(pipeline, ns)
    nc = await connect(
        msgspec.structs.replace(pipeline.nats_admin, user=busauth.READER), busauth.READER
    )
    try:
        ledger = await ask(
            nc,
            VIEW_LEDGER_SUBJECT,
            LedgerQuery(nodes=("ob-a100",)),
            LedgerView,
            service="device-allocator",
        )
        (node,) = ledger.nodes
        assert node.name == "ob-a100"
        assert len(node.devices) == 2
        grants = {g.pod: g for d in node.devices for g in d.grants if g.namespace == ns}
        assert grants["infer-a"].memory_mib == 20000
        assert grants["infer-a"].cores == 30
        assert grants["train-0"].group == f"{ns}/train"
        for d in node.devices:
            assert d.used_memory_mib == sum(g.memory_mib for g in d.grants)

        async def running() -> Any:
            # The coordinator counts a PodGroup running once it has read its pods' binds,
            # which may be a moment after the API server shows them.
            queues = await ask(
                nc, VIEW_QUEUES_SUBJECT, None, QueuesView, service="gang-coordinator"
            )
            mine = {q.name: q for q in queues.queues}[f"{ns}-q"]
            return mine if mine.podgroups == {"Running": 1} else None

        mine = await eventually(running, timeout_s=10, what="the PodGroup counted running")
        assert mine.weight == 2
        assert mine.allocated["nvidia.memory"] == 16000
        assert mine.podgroups == {"Running": 1}

        # A pod the node cannot hold now, wherever the grants above landed (and whatever
        # grants of this module's earlier tests are still being released): two cards of
        # 70,000 MiB each, where 46,000 of the two cards' 163,840 are granted. Explain
        # says why, node by node, and what would help.
        big = pod("huge", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 70000})
        created = await pipeline.create(ns, big)
        parser = request_parser(load(str(pipeline.config)))
        request = parser.parse(created)
        assert not isinstance(request, tuple), request
        ref = PodRef(namespace=ns, name="huge", uid=PodUID(created["metadata"]["uid"]))
        host = pod_spec(created, frozenset(parser.table.by_name))
        pending = pending_event(created, ref, request, host)
        answer = await ask(
            nc,
            VIEW_EXPLAIN_SUBJECT,
            ExplainQuery(pod=ref, request=pending.request, spec=pending.spec),
            ExplainView,
            service="device-allocator",
        )
        # (Other modules' Nodes may share this API server: count them all.)
        assert re.match(r"0/\d+ nodes are available: ", answer.message), answer.message
        assert "insufficient nvidia.com/gpumem" in answer.message
        (verdict,) = [v for v in answer.nodes if v.node == "ob-a100"]
        assert not verdict.fits
        assert verdict.texts
        assert all(verdict.hints)
        assert "more nvidia.com/gpumem" in verdict.hints[0], verdict.hints

        # The reader may ask views, never anything else.
        with pytest.raises(ViewUnavailable):
            await ask(nc, "tessera.ctl.ping", None, LedgerView, service="anyone", timeout_s=1)
    finally:
        await nc.close()
