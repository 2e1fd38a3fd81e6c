"""Volcano Jobs whose pods really run and fail on the real node (the pinned kubelet,
containerd and runc; tools/realnode.py): a ``dependsOn`` chain started in order, and a
failing pod restarting its Job until ``maxRetry`` ends it. One pipeline for the module,
both Jobs at once: real-node tests hold the machine's one kubelet."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline
from tests.integration.realnode import close_node_pipeline, phase, start_node_pipeline
from tests.integration.vcjobs import jobs_path, pods_of, reaches, status, task, vcjob
from tools import realnode
from tools.localcluster import LocalCluster

pytestmark = pytest.mark.integration
DEVICES = [{"model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}]


@pytest.fixture(scope="module")
async def node(
    real_cluster: LocalCluster, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_node_pipeline(
        real_cluster, nats_admin, tmp_path_factory.mktemp("vcjob-node"), DEVICES
    )

    async def registered() -> bool:
        obj = await kube.request(p.api, "GET", f"/api/v1/nodes/{real_cluster.node_name}")
        return (obj["status"].get("allocatable") or {}).get("nvidia.com/gpu") == "20"

    await eventually(registered, timeout_s=60, what="the real node's devices registered")
    yield p
    await close_node_pipeline(p)


def real(
    name: str, replicas: int, script: str, *, ready_after_s: int = 0, **more: Any
) -> dict[str, Any]:
    """A task whose busybox container runs ``script`` (deleted at once when asked), and
    is ready ``ready_after_s`` after it starts (a readiness probe's initial delay)."""
    made = task(name, replicas, image=realnode.BUSYBOX_IMAGE, command=["sh", "-c", script])
    spec = made["template"]["spec"]
    spec["terminationGracePeriodSeconds"] = 0
    container = spec["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    if ready_after_s:
        container["readinessProbe"] = {
            "exec": {"command": ["true"]},
            "initialDelaySeconds": ready_after_s,
            "periodSeconds": 1,
        }
    return {**made, **more}


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod["status"].get("conditions") or ()
    )


def when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def ready_at(pod: dict[str, Any]) -> dt.datetime:
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", pod["metadata"]["name"]
    return when(ready["lastTransitionTime"])


async def test_a_depends_on_chain_starts_in_order_and_failures_restart_until_max_retry(
    node: Pipeline,
) -> None:
    """``chain``: b depends on a, c on b; each task's pod is created only once the one
    before it runs with its container ready. ``flaky``: its pod exits 1, PodFailed
    restarts the whole Job; with maxRetry 2 the second failure ends it Failed, the
    failed pod kept."""
    ns = await node.namespace()
    jobs = jobs_path(ns)
    chain = vcjob(
        "chain",
        [
            real("a", 1, "exec sleep 3600", ready_after_s=3),
            real("b", 1, "exec sleep 3600", ready_after_s=3, dependsOn={"name": ["a"]}),
            real("c", 1, "exec sleep 3600", dependsOn={"name": ["b"]}),
        ],
        minAvailable=1,
    )
    flaky = vcjob(
        "flaky",
        [real("w", 1, "sleep 1; exit 1")],
        maxRetry=2,
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    await kube.request(node.api, "POST", jobs, chain)
    await kube.request(node.api, "POST", jobs, flaky)
    for before, after in (("chain-a-0", "chain-b-0"), ("chain-b-0", "chain-c-0")):
        await node.bound(ns, before, timeout_s=90)  # made once ready to be, then placed
        running = await phase(node, ns, before, "Running", timeout_s=90)
        if not _ready(running):  # running, its readiness probe not passed yet: not made
            assert after not in await pods_of(node, ns, "chain")
        made = await node.bound(ns, after, timeout_s=90)
        ready = await node.get(ns, before)
        assert _ready(ready)
        assert when(made["metadata"]["creationTimestamp"]) >= ready_at(ready)
    await phase(node, ns, "chain-c-0", "Running", timeout_s=90)

    failed = await reaches(node, ns, "flaky", "Failed", timeout_s=120)
    assert failed["retryCount"] == 2
    assert [c["status"] for c in failed["conditions"]][-2:] == ["Restarting", "Failed"]
    left = await pods_of(node, ns, "flaky")
    assert left["flaky-w-0"]["status"]["phase"] == "Failed"  # the last try, kept
    assert left["flaky-w-0"]["metadata"]["annotations"]["volcano.sh/job-retry-count"] == "1"
    assert (await status(node, ns, "chain"))["state"]["phase"] == "Running"
