"""Every constraint a real pod carries, on the real API server: for each kube-scheduler
filter, a pod that must not go where kube-scheduler would refuse it, and one that must
go to the only node that fits; pods that ask for no device; a mixed gang.

The nodes (all labelled ``suite: nodefit``, which every pod here selects, so nodes other
test modules left on the shared API server take no part):

=========  ====  ====================================  =======================
node       zone  what makes it special                 devices
=========  ====  ====================================  =======================
nf-a       a     ``pool: x``, 4 cpu                    2 x A100
nf-b       b     ``pool: y``, taint dedicated=gpu      2 x A100
nf-c       c     cordoned (``spec.unschedulable``)     2 x A100
nf-cpu     a     ``pool: cpu``, 8 cpu, 5 pods          none
=========  ====  ====================================  =======================
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.config import NatsConfig
from tests.integration.pipeline import Pipeline, pod, podgroup, start_pipeline

pytestmark = pytest.mark.integration

A100 = {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
SUITE = {"suite": "nodefit"}
ZONE = "topology.kubernetes.io/zone"
INVENTORY = {
    "nodes": [
        {
            "name": "nf-a",
            "labels": {**SUITE, ZONE: "a", "pool": "x"},
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "20"},
            "devices": [A100],
        },
        {
            "name": "nf-b",
            "labels": {**SUITE, ZONE: "b", "pool": "y"},
            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "20"},
            "devices": [A100],
        },
        {
            "name": "nf-c",
            "labels": {**SUITE, ZONE: "c", "pool": "z"},
            "unschedulable": True,
            "devices": [A100],
        },
        {
            "name": "nf-cpu",
            "labels": {**SUITE, ZONE: "a", "pool": "cpu"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "5"},
        },
    ]
}
GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}
TOLERATE = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    # Scheduled Events off here (test_pipeline.py checks them with the default): what a
    # pod is told when it does not fit, this module's subject, is written either way.
    p = await start_pipeline(
        tmp_path_factory.mktemp("nodefit"),
        kubeconfig,
        nats_admin,
        INVENTORY,
        settings={"scheduledEvents": False},
    )
    yield p
    await p.close()


def spec(
    name: str,
    limits: dict[str, Any] | None = None,
    *,
    requests: dict[str, str] | None = None,
    selector: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **pod_spec: Any,
) -> dict[str, Any]:
    """A pod of this suite: device limits, cpu/memory requests and any spec fields."""
    obj = pod(name, limits or {}, labels=labels)
    obj["spec"]["nodeSelector"] = {**SUITE, **(selector or {})}
    if requests:
        obj["spec"]["containers"][0]["resources"]["requests"] = requests
    obj["spec"].update(pod_spec)
    return obj


async def test_node_selector_and_required_affinity(pipeline: Pipeline, ns: str) -> None:
    await pipeline.create(ns, spec("sel", GPU, selector={"pool": "x"}))
    assert await pipeline.node_of(ns, "sel") == "nf-a"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}
                ]
            }
        }
    }
    await pipeline.create(ns, spec("aff", requests={"cpu": "100m"}, affinity=affinity))
    assert await pipeline.node_of(ns, "aff") == "nf-cpu"
    await pipeline.create(ns, spec("nowhere", GPU, selector={"pool": "nope"}))
    message = await pipeline.refused(ns, "nowhere")
    assert "node(s) didn't match Pod's node affinity/selector" in message


async def test_with_scheduled_events_off_a_bind_writes_no_event_a_refusal_still_does(
    pipeline: Pipeline, ns: str
) -> None:
    await pipeline.create(ns, spec("quiet", GPU, selector={"pool": "x"}))
    assert await pipeline.node_of(ns, "quiet") == "nf-a"
    await pipeline.create(ns, spec("told", GPU, selector={"pool": "nope"}))
    message = await pipeline.refused(ns, "told")  # written after "quiet"'s bind
    assert "node(s) didn't match Pod's node affinity/selector" in message
    assert [e["reason"] for e in await pipeline.events(ns, "quiet")] == []


async def test_taints_keep_pods_off_unless_tolerated(pipeline: Pipeline, ns: str) -> None:
    await pipeline.create(ns, spec("plain", GPU, selector={"pool": "y"}))
    message = await pipeline.refused(ns, "plain")
    assert "node(s) had untolerated taint(s)" in message  # nf-b (and any foreign node)
    await pipeline.create(ns, spec("tolerant", GPU, selector={"pool": "y"}, tolerations=TOLERATE))
    assert await pipeline.node_of(ns, "tolerant") == "nf-b"


async def test_a_cordoned_node_is_skipped(pipeline: Pipeline, ns: str) -> None:
    await pipeline.create(ns, spec("cordoned", GPU, selector={"pool": "z"}))
    message = await pipeline.refused(ns, "cordoned")
    assert "1 node(s) were unschedulable" in message


async def test_pods_that_ask_for_no_device_are_placed_and_a_full_node_is_skipped(
    pipeline: Pipeline, ns: str
) -> None:
    # 6 cpu fit only nf-cpu (8); a second one finds it full and nowhere else to go.
    await pipeline.create(ns, spec("big", requests={"cpu": "6", "memory": "1Gi"}))
    assert await pipeline.node_of(ns, "big") == "nf-cpu"
    await pipeline.create(ns, spec("bigger", requests={"cpu": "6"}))
    message = await pipeline.refused(ns, "bigger")
    assert "Insufficient cpu" in message
    # A GPU pod asking for more cpu than its GPU nodes have free goes nowhere either.
    await pipeline.create(ns, spec("gpu-cpu", GPU, requests={"cpu": "5"}))
    message = await pipeline.refused(ns, "gpu-cpu")
    assert "Insufficient cpu" in message
    await pipeline.delete(ns, "big")
    assert await pipeline.node_of(ns, "bigger") == "nf-cpu"


async def test_host_ports_conflict(pipeline: Pipeline, ns: str) -> None:
    ports = [
        {"name": "main", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 8080}]}
    ]
    await pipeline.create(ns, spec("web-1", selector={"pool": "cpu"}, containers=ports))
    assert await pipeline.node_of(ns, "web-1") == "nf-cpu"
    await pipeline.create(ns, spec("web-2", selector={"pool": "cpu"}, containers=ports))
    message = await pipeline.refused(ns, "web-2")
    assert "1 node(s) didn't have free ports for the requested pod ports" in message


async def test_pod_anti_affinity_and_the_existing_pods_own(pipeline: Pipeline, ns: str) -> None:
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}
            ]
        }
    }
    await pipeline.create(
        ns, spec("db-1", GPU, selector={"pool": "x"}, labels={"app": "db"}, affinity=anti)
    )
    assert await pipeline.node_of(ns, "db-1") == "nf-a"
    # Zone a is taken by db-1: the next db replica may not go to nf-cpu (zone a) either...
    await pipeline.create(
        ns, spec("db-2", labels={"app": "db"}, affinity=anti, selector={"pool": "cpu"})
    )
    message = await pipeline.refused(ns, "db-2")
    assert "node(s) didn't match pod anti-affinity rules" in message
    # ...and a pod db-1's own anti-affinity matches is kept out of zone a (the symmetric rule).
    await pipeline.create(ns, spec("intruder", labels={"app": "db"}, selector={"pool": "cpu"}))
    message = await pipeline.refused(ns, "intruder")
    assert "node(s) didn't satisfy existing pods anti-affinity rules" in message
    # It goes to the only other zone it may: b, tolerating the taint.
    await pipeline.create(
        ns, spec("db-3", GPU, labels={"app": "db"}, affinity=anti, tolerations=TOLERATE)
    )
    assert await pipeline.node_of(ns, "db-3") == "nf-b"


async def test_pod_affinity_follows_its_peer(pipeline: Pipeline, ns: str) -> None:
    await pipeline.create(ns, spec("cache", labels={"app": "cache"}, selector={"pool": "cpu"}))
    assert await pipeline.node_of(ns, "cache") == "nf-cpu"
    near = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": ZONE}
            ]
        }
    }
    # Zone a holds the cache: of the GPU nodes only nf-a is there.
    await pipeline.create(ns, spec("near", GPU, affinity=near, tolerations=TOLERATE))
    assert await pipeline.node_of(ns, "near") == "nf-a"


async def test_topology_spread_keeps_the_skew(pipeline: Pipeline, ns: str) -> None:
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    web = {"labels": {"app": "web"}, "topologySpreadConstraints": spread}
    await pipeline.create(ns, spec("w1", GPU, selector={"pool": "x"}, **web))
    assert await pipeline.node_of(ns, "w1") == "nf-a"
    # Zones a (1 web pod), b and c (none; c's node is cordoned but still a domain): a
    # second web pod may not go to zone a, and b's node needs the toleration.
    await pipeline.create(ns, spec("w2", GPU, **web))
    message = await pipeline.refused(ns, "w2")
    assert "2 node(s) didn't match pod topology spread constraints" in message
    await pipeline.create(ns, spec("w3", GPU, tolerations=TOLERATE, **web))
    assert await pipeline.node_of(ns, "w3") == "nf-b"


async def test_a_gang_may_mix_device_and_cpu_only_members(pipeline: Pipeline, ns: str) -> None:
    await podgroup(pipeline, ns, "mixed", 2)
    group = {"scheduling.k8s.io/group-name": "mixed"}
    for name, limits, requests in (
        ("launcher", {}, {"cpu": "500m"}),
        ("worker", GPU, {"cpu": "1"}),
    ):
        obj = spec(name, limits, requests=requests)
        obj["metadata"]["annotations"] = group
        obj["spec"]["schedulerName"] = "volcano"
        await pipeline.create(ns, obj)
    assert await pipeline.node_of(ns, "worker") in ("nf-a", "nf-b")
    assert await pipeline.node_of(ns, "launcher")
