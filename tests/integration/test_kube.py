"""The real control plane: nodes, pods, one-write binding with annotations, events, conditions."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import KubernetesConfig
from shared.core.model import NodeName, PodRef, PodUID
from tools import localcluster
from tools.localcluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[kube.Client]:
    client = await kube.connect(KubernetesConfig(kubeconfig=str(kubeconfig)))
    async with client:
        yield client


async def _create_node(api: kube.Client, name: str) -> None:
    await kube.request(
        api,
        "POST",
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"volcano.sh/vgpu.enabled": "true"}},
        },
    )


async def _create_pod(api: kube.Client, ns: str, name: str) -> PodRef:
    created = await kube.request(
        api,
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "tessera-test-unserved",
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {
                            "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}
                        },
                    }
                ],
            },
        },
    )
    return PodRef(namespace=ns, name=name, uid=PodUID(created["metadata"]["uid"]))


async def test_pod_is_bound_with_annotations_in_one_write(api: kube.Client) -> None:
    node = NodeName(f"gpu-{uuid.uuid4().hex[:6]}")
    await _create_node(api, node)
    pod = await _create_pod(api, "default", f"p-{uuid.uuid4().hex[:6]}")
    grant = {"tessera.io/grant": '[{"container":"main"}]', "hami.io/bind-phase": "success"}

    await kube.bind(api, pod, node, grant)

    got = await kube.request(api, "GET", f"/api/v1/namespaces/default/pods/{pod.name}")
    # Its hand-written grant would be read (and refused, with a warning) by every later
    # allocator that rebuilds its ledger from this session's API server.
    await kube.delete_pod(api, "default", pod.name, grace_s=0)
    assert got["spec"]["nodeName"] == node
    for key, value in grant.items():
        assert got["metadata"]["annotations"][key] == value
    # No kubelet: the pod stays Pending with nodeName set, the expected end state.
    assert got["status"]["phase"] == "Pending"
    conditions = {c["type"]: c["status"] for c in got["status"].get("conditions", [])}
    assert conditions.get("PodScheduled") == "True"


async def test_binding_a_replaced_pod_fails_on_uid(api: kube.Client) -> None:
    node = NodeName(f"gpu-{uuid.uuid4().hex[:6]}")
    await _create_node(api, node)
    pod = await _create_pod(api, "default", f"p-{uuid.uuid4().hex[:6]}")
    stale = PodRef(namespace=pod.namespace, name=pod.name, uid=PodUID(str(uuid.uuid4())))
    with pytest.raises(ApiException) as info:
        await kube.bind(api, stale, node, {})
    assert info.value.status == 409
    await kube.bind(api, pod, node, {})  # the real one still binds
    with pytest.raises(ApiException) as again:
        await kube.bind(api, pod, node, {})  # and only once
    assert again.value.status == 409


async def test_event_and_condition_reach_the_pod(api: kube.Client) -> None:
    pod = await _create_pod(api, "default", f"bad-{uuid.uuid4().hex[:6]}")
    message = "nvidia.com/gpucores (container main): 150 exceeds 100; ask for at most 100"
    await kube.tell(
        api,
        pod,
        reason="FailedScheduling",
        message=message,
        kind="Warning",
        component="tessera-test",
        condition=kube.Condition("PodScheduled", "False", "Unschedulable"),
    )
    evs = await kube.request(
        api,
        "GET",
        "/api/v1/namespaces/default/events",
        query={"fieldSelector": f"involvedObject.uid={pod.uid}"},
    )
    assert [(e["reason"], e["type"], e["message"]) for e in evs["items"]] == [
        ("FailedScheduling", "Warning", message)
    ]
    got = await kube.request(api, "GET", f"/api/v1/namespaces/default/pods/{pod.name}")
    [cond] = [c for c in got["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", message)


def test_kubectl_works_and_anonymous_requests_are_refused(kube: LocalCluster) -> None:
    out = subprocess.run(
        [
            localcluster.kubectl(),
            "--kubeconfig",
            str(kube.kubeconfig),
            "get",
            "namespaces",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "namespace/default" in out
    ctx = ssl._create_unverified_context()
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{kube.server}/api/v1/nodes", context=ctx, timeout=5)
    assert info.value.code in (401, 403)


def test_calls_and_watches_go_on_across_an_api_server_restart(tmp_path: Path) -> None:
    """shared/http1.py against the real thing: the API server killed and started again
    (its connections gone under the client's pool and its watch) costs nothing but a
    reconnect: the next write succeeds, once, and the watch resumes where it was."""
    path = "/api/v1/namespaces/default/configmaps"

    def configmap(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}

    async def scenario(cluster: LocalCluster) -> None:
        api = await kube.connect(KubernetesConfig(kubeconfig=str(cluster.kubeconfig)))
        seen: list[tuple[str, str]] = []
        changed = asyncio.Event()

        async def on_event(kind: str, obj: dict[str, Any]) -> None:
            seen.append((kind, obj["metadata"]["name"]))
            changed.set()

        async def on_relist(items: list[dict[str, Any]]) -> None:
            seen.extend(("LISTED", obj["metadata"]["name"]) for obj in items)
            changed.set()

        async def until(what: tuple[str, str]) -> None:
            async with asyncio.timeout(30):
                while what not in seen:
                    changed.clear()
                    await changed.wait()

        async with api:
            watch = asyncio.create_task(
                kube.list_watch(api, path, on_event, on_relist=on_relist, max_backoff_s=0.5)
            )
            for i in range(8):  # several kept connections
                await kube.request(api, "POST", path, configmap(f"before-{i}"))
            await until(("ADDED", "before-7"))
            kept = len(api.pool._free)
            assert kept >= 1
            await asyncio.to_thread(cluster.restart_apiserver)
            await kube.request(api, "POST", path, configmap("after"))
            await until(("ADDED", "after"))
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            names = [n for _, n in seen]
            assert names.count("after") == 1  # the write went once, and was seen once
            listed, _ = await kube.list_all(api, path)
            assert sorted(o["metadata"]["name"] for o in listed) == sorted(
                [f"before-{i}" for i in range(8)] + ["after"]
            )

    with LocalCluster(workdir=tmp_path / "cluster", with_nats=False, with_crds=False) as cluster:
        asyncio.run(scenario(cluster))


def test_a_status_write_to_an_unreachable_api_server_says_so_and_returns(
    kubeconfig: Path, tmp_path: Path
) -> None:
    """``patch_status`` serves writers that run for a service's life (PodGroup, Queue and
    Job status): an API server that is down (restarting) is a False, never an exception
    that ends the writer and its service (bench/chaos.py saw one)."""
    port = localcluster.free_port()
    text = kubeconfig.read_text()
    server = next(
        line.split("server:", 1)[1].strip() for line in text.splitlines() if "server:" in line
    )
    dead = tmp_path / "kubeconfig"
    dead.write_text(text.replace(server, f"https://127.0.0.1:{port}"))

    async def scenario() -> bool:
        api = await kube.connect(KubernetesConfig(kubeconfig=str(dead)))
        async with api:
            return await kube.patch_status(api, "/api/v1/namespaces/default/status", {})

    assert asyncio.run(scenario()) is False
