"""The whole pipeline on a real node: the pinned kubelet, containerd and runc run the
pods Tessera binds (tools/realnode.py), and each container prints what it was handed.

A pod of :func:`printing_pod` runs :data:`PRINT` in each container: its environment, then
its mount table, between markers, so a test reads what the container really got from
the kubelet's log files (:func:`handed`) and compares it with the pod's own grant.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, start_pipeline
from tools import realnode
from tools.localcluster import LocalCluster

PRINT = (
    "echo '--- env'; env; echo '--- mounts'; cat /proc/self/mountinfo; echo '--- dev'; "
    "ls /dev; echo '--- shm'; ls /dev/shm; echo '--- end'; "
    '[ -n "$STAY" ] && exec sleep 3600; true'
)
"""What each container runs: prints, then stays (``STAY`` set) or exits."""


def printing_pod(
    name: str,
    containers: list[tuple[str, dict[str, Any]]],
    *,
    init: list[tuple[str, dict[str, Any]]] | None = None,
    scheduler: str = "tessera",
    node: str | None = None,
) -> dict[str, Any]:
    """A pod whose containers (``(name, limits)``) print what they got and stay; init
    containers print and exit. ``node`` binds it there directly (no scheduler)."""

    def container(cname: str, limits: dict[str, Any], stay: bool) -> dict[str, Any]:
        return {
            "name": cname,
            "image": realnode.BUSYBOX_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", PRINT],
            "env": [{"name": "STAY", "value": "1" if stay else ""}],
            "resources": {"limits": {k: str(v) for k, v in limits.items()}},
        }

    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container(n, lim, True) for n, lim in containers],
    }
    if init:
        spec["initContainers"] = [container(n, lim, False) for n, lim in init]
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@dataclass(frozen=True)
class Handed:
    """What one container saw: its environment and its mounts (container path -> host
    source's last component is not visible inside; the mount points are)."""

    env: dict[str, str]
    mount_points: frozenset[str]
    dev: frozenset[str]
    """The names in its ``/dev``."""
    shm: frozenset[str]
    """The names in its ``/dev/shm``."""


def parse_printed(text: str) -> Handed | None:
    """The environment and mount points a container printed (None before it finished)."""
    if "--- end" not in text:
        return None
    env_part = text.split("--- env", 1)[1].split("--- mounts", 1)[0]
    mounts_part = text.split("--- mounts", 1)[1].split("--- dev", 1)[0]
    dev_part = text.split("--- dev", 1)[1].split("--- shm", 1)[0]
    shm_part = text.split("--- shm", 1)[1].split("--- end", 1)[0]
    env = dict(line.split("=", 1) for line in env_part.strip().splitlines() if "=" in line)
    points = frozenset(
        line.split()[4] for line in mounts_part.strip().splitlines() if len(line.split()) > 4
    )
    return Handed(env, points, frozenset(dev_part.split()), frozenset(shm_part.split()))


async def handed(ns: str, name: str, container: str, timeout_s: float = 60) -> Handed:
    """What ``container`` of pod ``ns/name`` printed, waiting until it has."""

    async def printed() -> Handed | None:
        return parse_printed(realnode.pod_logs(ns, name, container))

    return await eventually(printed, timeout_s=timeout_s, what=f"{ns}/{name}/{container} printed")


async def phase(
    p: Pipeline, ns: str, name: str, want: str, timeout_s: float = 60
) -> dict[str, Any]:
    """The pod once its phase is ``want``; on timeout, the assertion shows its status."""
    last: dict[str, Any] = {}

    async def reached() -> dict[str, Any] | None:
        nonlocal last
        obj = await p.get(ns, name)
        last = obj.get("status", {})
        return obj if last.get("phase") == want else None

    try:
        return await eventually(reached, timeout_s=timeout_s, what=f"{ns}/{name} {want}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its status: {last}") from None


def isolation_paths(workdir: Path) -> dict[str, str]:
    """The node agent's host-side isolation paths inside the test's folder; the library
    file exists (the DaemonSet's init container copies it on a real GPU node)."""
    vgpu = workdir / "vgpu"
    vgpu.mkdir(parents=True, exist_ok=True)
    (vgpu / "libvgpu.so").write_bytes(b"")
    return {
        "libraryHostPath": str(vgpu / "libvgpu.so"),
        "preloadHostPath": str(vgpu / "ld.so.preload"),
        "cacheHostDir": str(vgpu / "containers"),
        "lockDir": str(workdir / "vgpulock"),
    }


async def start_node_pipeline(
    cluster: LocalCluster,
    nats_admin: NatsConfig,
    workdir: Path,
    devices: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
) -> Pipeline:
    """Tessera's services on ``cluster``, with the agent of its real node reading
    ``devices`` from a file (no GPU here: the agent's ``file:`` source)."""
    node = cluster.node_name
    (workdir / f"{node}.yaml").write_text(
        yaml.safe_dump({"nodes": [{"name": node, "devices": devices}]})
    )
    agent = {"admissionWaitS": 5.0, "healthIntervalS": 1.0, "isolation": isolation_paths(workdir)}
    p = await start_pipeline(
        workdir,
        cluster.kubeconfig,
        nats_admin,
        {"nodes": []},
        config={
            "nodeAgent": agent,
            "telemetry": {"logLevel": "DEBUG", "metricsPort": 0},
            **(config or {}),
        },
    )
    await p.start(f"node-agent@{node}")
    return p


async def close_node_pipeline(p: Pipeline) -> None:
    """Delete every pod the test made (the kubelet stops them) and stop the services."""
    for ns in p.namespaces:
        await kube.request(p.api, "DELETE", f"/api/v1/namespaces/{ns}")
        left, _ = await kube.list_all(p.api, f"/api/v1/namespaces/{ns}/pods")
        for obj in left:
            await kube.delete_pod(p.api, ns, obj["metadata"]["name"], grace_s=0)
    await p.close()


@pytest.fixture
async def node_pipeline_factory(
    real_cluster: LocalCluster, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Any]:
    made: list[Pipeline] = []

    async def make(devices: list[dict[str, Any]], config: dict[str, Any] | None = None) -> Pipeline:
        p = await start_node_pipeline(
            real_cluster, nats_admin, tmp_path_factory.mktemp("realnode"), devices, config
        )
        made.append(p)
        return p

    yield make
    for p in made:
        await close_node_pipeline(p)
