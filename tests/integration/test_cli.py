"""The operator's CLI on the real pipeline (the services as processes, a real API server
and NATS): ``tessera get devices`` shows bound pods on their cards with their MiB,
``tessera explain pod`` says why a pod too big for any card waits and what would fit,
``tessera get jobs`` and ``get queues`` show a Volcano Job's and a PodGroup's state."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared import kube, views
from shared.config import NatsConfig
from shared.core import annotations as ann
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline
from tests.integration.test_batch import member, vcjob
from tests.integration.vcjobs import run_all
from tests.service.test_ops import tessera

pytestmark = pytest.mark.integration

INVENTORY = {
    "nodes": [
        {
            "name": "cli-a100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        },
        {
            "name": "cli-h100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-H100-80GB-HBM3", "memory": 81559, "count": 1}
            ],
        },
    ]
}
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
JOBS = "/apis/batch.volcano.sh/v1alpha1"


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("cli"), kubeconfig, nats_admin, INVENTORY)
    yield p
    await p.close()


def flags(p: Pipeline, kubeconfig: Path) -> list[str]:
    """The services' tessera.yaml (its bus; the CLI connects as ``admin``) and the
    admin's kubeconfig."""
    return ["--config", str(p.config), "--kubeconfig", str(kubeconfig)]


async def test_get_devices_shows_bound_pods_on_their_cards_with_their_mib(
    pipeline: Pipeline, ns: str, kubeconfig: Path
) -> None:
    asks = {"small": 20000, "medium": 30000}
    for name, mib in asks.items():
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib, "nvidia.com/gpucores": 30}
        await pipeline.create(ns, pod(name, limits))
    bound = {name: await pipeline.bound(ns, name) for name in asks}

    code, out, err, _ = await tessera("get", "devices", "-o", "json", *flags(pipeline, kubeconfig))
    assert (code, err) == (0, "")
    ledger = msgspec.json.decode(out, type=views.LedgerView)
    code, table, err, _ = await tessera("get", "devices", *flags(pipeline, kubeconfig))
    assert (code, err) == (0, "")
    rows = table.splitlines()
    assert rows[0].split() == [
        "NODE",
        "INDEX",
        "MODEL",
        "MODE",
        "MEMORY(MiB)",
        "CORES",
        "SLOTS",
        "HEALTH",
        "WHO",
    ]
    assert len(rows) == 1 + 3  # every card once
    for name, obj in bound.items():
        [grant] = [
            d for c in ann.read_grants(obj["metadata"]["annotations"]) or () for d in c.devices
        ]
        node, index = obj["spec"]["nodeName"], grant.index
        [row] = [r for r in rows if r.split()[:2] == [node, str(index)]]
        assert f"{ns}/{name}(main) {asks[name]}MiB 30%" in row
        [card] = [d for n in ledger.nodes if n.name == node for d in n.devices if d.index == index]
        assert card.used_memory_mib == sum(g.memory_mib for g in card.grants)
        assert {(g.pod, g.memory_mib, g.bound) for g in card.grants} >= {(name, asks[name], True)}
        assert f"   {card.used_memory_mib}/{card.memory_mib}   " in row

    code, out, err, _ = await tessera("top", "--once", "--config", str(pipeline.config))
    assert (code, err) == (0, "")
    assert "pods placed " in out.splitlines()[0]
    assert f"{ns}/small(main) 20000MiB 30%" in out


async def explain(p: Pipeline, ns: str, name: str, kubeconfig: Path) -> str:
    """``tessera explain pod --all`` once the pod has been told FailedScheduling (every
    node: other modules' Nodes may share this API server)."""

    async def told() -> bool:
        return any(e["reason"] == "FailedScheduling" for e in await p.events(ns, name))

    await eventually(told, what=f"{name} told FailedScheduling")
    command = ("explain", "pod", f"{ns}/{name}", "--all")
    code, out, err, _ = await tessera(*command, *flags(p, kubeconfig))
    assert (code, err) == (0, "")
    assert "State:      Pending, not bound\n" in out
    assert "  Event:        FailedScheduling" in out
    return out


async def test_explain_says_why_a_pod_too_big_for_any_card_waits(
    pipeline: Pipeline, ns: str, kubeconfig: Path
) -> None:
    """Larger than every card: refused before any node, unresolvable, with the fix."""
    await pipeline.create(ns, pod("too-big", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 200000}))
    out = await explain(pipeline, ns, "too-big", kubeconfig)
    now = out[out.index("Now ") :].splitlines()
    assert now[1:] == [
        "  nvidia.com/gpumem (container main): 200000 MiB is larger than any nvidia card in "
        "the cluster (81920 MiB); ask for at most 81920",
        "  Unresolvable: no pod leaving can help; only a new or changed node, or a changed pod.",
        "  No node was tried: no node could take the request as written.",
    ]


async def test_explain_lists_every_node_with_its_reason_and_what_would_fit(
    pipeline: Pipeline, ns: str, kubeconfig: Path
) -> None:
    """More cards than any node has: each node's reason, and the most it could take."""
    await pipeline.create(ns, pod("three-cards", {"nvidia.com/gpu": 3}))
    out = await explain(pipeline, ns, "three-cards", kubeconfig)
    # Other modules' Nodes may share this API server: count them all.
    assert re.search(r"\n  0/\d+ nodes are available: ", out), out
    verdicts = out[out.index("NODE ") :].splitlines()
    assert verdicts[0].split() == [
        "NODE",
        "FITS",
        "PLUGIN",
        "WHY",
        "NOT",
        "WHAT",
        "WOULD",
        "MAKE",
        "IT",
        "FIT",
    ]
    for node, cards in (("cli-a100", 2), ("cli-h100", 1)):
        [row] = [r for r in verdicts if r.startswith(f"{node} ")]
        assert row.split()[1:3] == ["no", "DeviceShare"]  # the device family decided
        assert f"nvidia.com/gpu: 3 devices asked, {cards} eligible on the node" in row
        assert f"ask for at most {cards} devices, or a node with more" in row


async def test_explain_of_an_invalid_request_prints_the_watchers_errors(
    pipeline: Pipeline, ns: str, kubeconfig: Path
) -> None:
    await pipeline.create(ns, pod("typo", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}))
    code, out, _, _ = await tessera("explain", "pod", f"{ns}/typo", *flags(pipeline, kubeconfig))
    assert code == 1
    assert "  invalid device request: nvidia.com/gpucores (container main): 150" in out


async def test_get_jobs_and_queues_show_a_job_and_a_podgroup_waiting(
    pipeline: Pipeline, ns: str, kubeconfig: Path
) -> None:
    await podgroup(pipeline, ns, "huge", 1)
    await pipeline.create(
        ns, member("huge-0", "huge", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 200000})
    )
    job = vcjob("mnist", 1, 1, {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 1000})
    await kube.request(pipeline.api, "POST", f"{JOBS}/namespaces/{ns}/jobs", job)
    try:
        await run_all(pipeline, ns, ["mnist-worker-0"])  # running, as its kubelet would say

        async def status(path: str) -> dict[str, Any]:
            found: dict[str, Any] = await kube.request(pipeline.api, "GET", path)
            return found.get("status") or {}

        async def settled() -> bool:
            group = await status(f"{VOLCANO}/namespaces/{ns}/podgroups/huge")
            running = await status(f"{JOBS}/namespaces/{ns}/jobs/mnist")
            unschedulable = any(c["type"] == "Unschedulable" for c in group.get("conditions", []))
            return unschedulable and (running.get("state") or {}).get("phase") == "Running"

        await eventually(settled, what="PodGroup huge unschedulable and Job mnist running")
        code, out, err, _ = await tessera("get", "jobs", "-n", ns, *flags(pipeline, kubeconfig))
        assert (code, err) == (0, "")
        rows = {r.split()[0]: r for r in out.splitlines()[1:]}
        assert rows["job/mnist"].split()[1:8] == ["Running", "1", "1", "0", "0", "0", "default"]
        assert rows["podgroup/mnist"].split()[1:3] == ["Running", "1"]
        assert rows["podgroup/huge"].split()[1:3] == ["Pending", "1"]
        assert rows["podgroup/huge"].endswith(
            "200000 MiB is larger than any nvidia card in "
            "the cluster (81920 MiB); ask for at most 81920"
        )

        code, out, _, _ = await tessera("get", "jobs", "-A", *flags(pipeline, kubeconfig))
        assert any(r.split()[:2] == [ns, "podgroup/huge"] for r in out.splitlines())

        code, out, err, _ = await tessera("get", "queues", *flags(pipeline, kubeconfig))
        assert (code, err) == (0, "")
        [gang] = [r for r in out.splitlines() if r.startswith(f"{ns}/huge ")]
        assert "   1 parked   " in gang  # unresolvable: no retry until something changes
        assert "   unresolvable: nvidia.com/gpumem (container main): 200000 MiB" in gang
    finally:
        await kube.request(pipeline.api, "DELETE", f"{JOBS}/namespaces/{ns}/jobs/mnist")
        await kube.request(pipeline.api, "DELETE", f"{VOLCANO}/namespaces/{ns}/podgroups/huge")
