"""The node side against the real thing: the pinned kubelet calls the node agent's
device plugin, containerd and runc start the containers, and each container prints what
it got. Nothing here plays the kubelet (tests/kubelet.py is the unit-level stand-in).

The agent reads its devices from a file (no GPU on this machine); everything after that
is real: registration with the kubelet, the Node's allocatable, the kubelet's admission
order and its Allocate calls, its checkpoint, its restart, the runtime's mounts.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.node_agent.admission import KUBELET_CHECKPOINT, admitted_in_checkpoint
from shared import kube
from shared.core import annotations as ann
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline
from tests.integration.realnode import handed, node_pipeline_factory, phase, printing_pod
from tests.mpsfake import FAKE, need_unshare
from tools import realnode
from tools.localcluster import LocalCluster

pytestmark = pytest.mark.integration
_ = node_pipeline_factory  # the fixture, imported for this module

Factory = Callable[..., Awaitable[Pipeline]]
A100 = [{"model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 8}]
CACHE = "/usr/local/vgpu/cache"


async def allocatable(p: Pipeline, node: str) -> dict[str, str]:
    obj = await kube.request(p.api, "GET", f"/api/v1/nodes/{node}")
    return dict(obj["status"].get("allocatable", {}))


async def registered(p: Pipeline, node: str, resource: str, amount: str) -> None:
    async def shown() -> bool:
        return (await allocatable(p, node)).get(resource) == amount

    await eventually(shown, timeout_s=60, what=f"{node} allocatable {resource}={amount}")


def grants_of(obj: dict[str, Any]) -> dict[str, Any]:
    grants = ann.read_grants(obj["metadata"]["annotations"])
    assert grants is not None, obj["metadata"]["name"]
    return {g.container: g for g in grants}


def assert_own_grant(obj: dict[str, Any], container: str, got: Any) -> None:
    """The container got exactly its own grant: its cards, its memory on each, its
    cores, its own accounting file and directory, the isolation library's mounts."""
    grant = grants_of(obj)[container]
    uid = obj["metadata"]["uid"]
    env = got.env
    where = f"{obj['metadata']['name']}/{container}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in grant.devices), where
    limits = [env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}") for i in range(len(grant.devices))]
    assert limits == [f"{d.memory_mib}m" for d in grant.devices], where
    assert f"CUDA_DEVICE_MEMORY_LIMIT_{len(grant.devices)}" not in env, where
    assert env["CUDA_DEVICE_SM_LIMIT"] == str(max(d.cores for d in grant.devices)), where
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"{CACHE}/{uid}_{container}.cache", where
    assert {CACHE, "/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"} <= got.mount_points, where


async def served_while_untouched(
    p: Pipeline, ns: str, name: str, limits: dict[str, Any], running: str
) -> None:
    """A new pod ``name`` runs with its own grant, and pod ``running`` still runs, its
    container never restarted."""
    await p.create(ns, printing_pod(name, [("main", limits)]))
    await phase(p, ns, name, "Running", timeout_s=90)
    assert_own_grant(await p.get(ns, name), "main", await handed(ns, name, "main"))
    obj = await p.get(ns, running)
    assert obj["status"]["phase"] == "Running"
    assert obj["status"]["containerStatuses"][0]["restartCount"] == 0


SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    # one card, its own memory and cores
    "one": lambda i: {
        "containers": [
            (
                "main",
                {
                    "nvidia.com/gpu": 1,
                    "nvidia.com/gpumem": 1000 + 37 * i,
                    "nvidia.com/gpucores": 10 + i,
                },
            )
        ]
    },
    # two cards
    "two": lambda i: {
        "containers": [("main", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1200 + 41 * i})]
    },
    # an init container with a card, then the main container with another size
    "init": lambda i: {
        "init": [("setup", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 900 + 13 * i})],
        "containers": [("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500 + 29 * i})],
    },
    # two containers with devices
    "pair": lambda i: {
        "containers": [
            ("a", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 800 + 11 * i}),
            ("b", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 700 + 17 * i}),
        ]
    },
}


async def test_a_burst_of_pods_of_four_shapes_each_container_gets_its_own_grant(
    node_pipeline_factory: Factory,
) -> None:
    """The concurrency case: 24 pods of 4 shapes (1 and 2 cards, init containers, two
    containers with devices), every pod its own sizes, created at once on one node: the
    real kubelet admits them in its own order and every container prints its own limits."""
    p = await node_pipeline_factory(A100)
    node = "real-0"
    await registered(p, node, "nvidia.com/gpu", "80")
    ns = await p.namespace()
    pods = {}
    for shape, make in SHAPES.items():
        for i in range(6):
            parts = make(i)
            name = f"{shape}-{i}"
            pods[name] = parts
    began = time.monotonic()
    await asyncio.gather(
        *(
            p.create(ns, printing_pod(name, parts["containers"], init=parts.get("init")))
            for name, parts in pods.items()
        )
    )
    for name in pods:
        await phase(p, ns, name, "Running", timeout_s=120)
    print(f"\nburst: {len(pods)} pods Running {time.monotonic() - began:.1f} s after creation")
    for name, parts in pods.items():
        obj = await p.get(ns, name)
        assert obj["spec"]["nodeName"] == node
        for cname, _ in parts.get("init", []) + parts["containers"]:
            assert_own_grant(obj, cname, await handed(ns, name, cname))
    calls = p.log(f"node-agent@{node}").count("Allocate nvidia.com/gpu")
    containers = sum(len(v.get("init", [])) + len(v["containers"]) for v in pods.values())
    assert calls == containers
    # The kubelet's own checkpoint names every pod it gave devices to.
    text = (realnode.DEVICE_PLUGIN_DIR / KUBELET_CHECKPOINT).read_text()
    admitted = admitted_in_checkpoint(text)
    assert admitted is not None
    uids = {(await p.get(ns, name))["metadata"]["uid"] for name in pods}
    assert uids <= admitted


async def test_a_pod_another_scheduler_bound_is_refused_at_once_and_takes_no_grant(
    node_pipeline_factory: Factory,
) -> None:
    """A pod bound to the node by someone else asks for Tessera's devices: the kubelet
    calls Allocate for it like any other, and the agent refuses at once (never waiting
    for a grant that a Tessera pod bound meanwhile would bring: it would take that pod's
    limits). The kubelet fails the pod with the agent's reason, no container starts, and
    the Tessera pod of the same shape bound right behind it gets its own grant."""
    p = await node_pipeline_factory(A100)
    node = "real-0"
    await registered(p, node, "nvidia.com/gpu", "80")
    ns = await p.namespace()
    await p.create(ns, printing_pod("stray", [("main", {"nvidia.com/gpu": 1})], node=node))
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1234}
    await p.create(ns, printing_pod("next", [("main", limits)]))
    obj = await phase(p, ns, "stray", "Failed", timeout_s=60)
    assert obj["status"]["reason"] == "UnexpectedAdmissionError"
    assert f"pod {ns}/stray bound to {node} by another scheduler" in obj["status"]["message"]
    assert realnode.pod_logs(ns, "stray", "main") == ""
    await phase(p, ns, "next", "Running", timeout_s=90)
    assert_own_grant(await p.get(ns, "next"), "main", await handed(ns, "next", "main"))


ASCEND = [
    {"vendor": "ascend", "model": "Ascend910B3", "chip": "910B3", "memory": 65536, "count": 2}
]
ASCEND_NODES = ("davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc")


@pytest.fixture
def ascend_device_nodes() -> Iterator[None]:
    """Stand-ins for an Ascend node's device files (char devices with /dev/null's
    numbers): the runtime creates each one the hand-out names inside the container."""
    null = os.stat("/dev/null").st_rdev
    made = []
    for name in ASCEND_NODES:
        path = Path("/dev") / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, null)
            made.append(path)
    yield
    for path in made:
        path.unlink()


async def test_whole_cards_and_ascend_templates_get_their_hand_out(
    node_pipeline_factory: Factory, ascend_device_nodes: None
) -> None:
    """One pod per mode besides slices: Volcano's whole cards get their cards and no
    limit; an Ascend vNPU template gets its device index, its template and the device
    files, as the container sees them."""
    p = await node_pipeline_factory(A100 + ASCEND)
    node = "real-0"
    await registered(p, node, "huawei.com/Ascend910B3", str(2 * 4))
    ns = await p.namespace()
    await p.create(ns, printing_pod("whole", [("main", {"volcano.sh/gpu-number": 2})]))
    npu = {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 12000}
    await p.create(ns, printing_pod("npu", [("main", npu)]))
    for name in ("whole", "npu"):
        await phase(p, ns, name, "Running", timeout_s=90)
    whole = await handed(ns, "whole", "main")
    grant = grants_of(await p.get(ns, "whole"))["main"]
    assert whole.env["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in grant.devices)
    assert len(grant.devices) == 2
    assert all(d.exclusive for d in grant.devices)
    assert not any(k.startswith("CUDA_DEVICE_MEMORY_LIMIT") for k in whole.env)
    assert CACHE not in whole.mount_points
    got = await handed(ns, "npu", "main")
    (d,) = grants_of(await p.get(ns, "npu"))["main"].devices
    assert got.env["ASCEND_VISIBLE_DEVICES"] == str(d.index)
    assert got.env["ASCEND_VNPU_SPECS"] == d.vnpu_template
    assert {f"davinci{d.index}", "davinci_manager", "devmm_svm", "hisi_hdc"} <= got.dev
    assert f"davinci{1 - d.index}" not in got.dev


async def test_the_agent_re_registers_after_a_kubelet_restart_and_pods_keep_running(
    node_pipeline_factory: Factory, real_cluster: LocalCluster
) -> None:
    """The kubelet removes every plugin socket when it starts; the agent serves and
    registers again, running pods are untouched, and the next pod gets its grant."""
    p = await node_pipeline_factory(A100)
    node = real_cluster.node_name
    await registered(p, node, "nvidia.com/gpu", "80")
    ns = await p.namespace()
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}
    await p.create(ns, printing_pod("before", [("main", limits)]))
    await phase(p, ns, "before", "Running", timeout_s=90)
    await asyncio.to_thread(real_cluster.restart, "kubelet")
    agent = f"node-agent@{node}"

    async def registered_again() -> bool:
        return p.log(agent).count("registered nvidia.com/gpu") >= 2

    await eventually(registered_again, timeout_s=60, what="nvidia.com/gpu registered again")
    await registered(p, node, "nvidia.com/gpu", "80")
    await served_while_untouched(p, ns, "after", {**limits, "nvidia.com/gpumem": 3000}, "before")


async def test_an_agent_restart_leaves_running_pods_alone_and_serves_the_next(
    node_pipeline_factory: Factory,
) -> None:
    """The agent killed outright (an OOM kill, an upgrade) while pods run: they keep
    running; the restarted agent registers again and hands the next pod its own grant."""
    p = await node_pipeline_factory(A100)
    node = "real-0"
    await registered(p, node, "nvidia.com/gpu", "80")
    ns = await p.namespace()
    limits = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 2500}
    await p.create(ns, printing_pod("running", [("main", limits)]))
    await phase(p, ns, "running", "Running", timeout_s=90)
    agent = f"node-agent@{node}"
    p.kill(agent)  # its keeper starts it again, as the DaemonSet would

    async def restarted() -> bool:
        return any(r.startswith(agent) for r in p.restarts) and (
            p.log(agent).count("registered nvidia.com/gpu") >= 2
        )

    await eventually(restarted, timeout_s=60, what="the agent restarted and registered")
    await served_while_untouched(p, ns, "next", {**limits, "nvidia.com/gpumem": 3500}, "running")


async def test_a_pod_deleted_during_its_admission_leaves_nothing_behind(
    node_pipeline_factory: Factory,
) -> None:
    """A pod (bound by another scheduler) deleted while the kubelet admits it: its
    Allocate is answered, nothing of it stays with the agent, and the next pod of the
    same shape gets its own grant."""
    p = await node_pipeline_factory(A100)
    node = "real-0"
    await registered(p, node, "nvidia.com/gpu", "80")
    ns = await p.namespace()
    await p.create(ns, printing_pod("gone", [("main", {"nvidia.com/gpu": 1})], node=node))
    agent = f"node-agent@{node}"

    async def allocating() -> bool:
        return "an Allocate of 1 ID(s) looks for its pod" in p.log(agent)

    await eventually(allocating, timeout_s=30, what="the kubelet's Allocate for the pod")
    await p.delete(ns, "gone")
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1234}
    await p.create(ns, printing_pod("next", [("main", limits)]))
    await phase(p, ns, "next", "Running", timeout_s=90)
    assert_own_grant(await p.get(ns, "next"), "main", await handed(ns, "next", "main"))
    assert realnode.pod_logs(ns, "gone", "main") == ""


async def test_a_card_turning_unhealthy_leaves_the_kubelets_allocatable(
    node_pipeline_factory: Factory, real_cluster: LocalCluster
) -> None:
    """ListAndWatch: a card the agent reads as unhealthy is reported so, and the real
    kubelet takes its device IDs out of the Node's allocatable."""
    p = await node_pipeline_factory(A100)
    node = real_cluster.node_name
    await registered(p, node, "nvidia.com/gpu", "80")
    source = p.workdir / f"{node}.yaml"
    doc = yaml.safe_load(source.read_text())
    doc["nodes"][0]["devices"][0]["unhealthy"] = [0]
    source.write_text(yaml.safe_dump(doc))
    await registered(p, node, "nvidia.com/gpu", "70")
    doc["nodes"][0]["devices"][0]["unhealthy"] = []
    source.write_text(yaml.safe_dump(doc))
    await registered(p, node, "nvidia.com/gpu", "80")


H100_MPS = [{"model": "NVIDIA-H100-80GB-HBM3", "memory": 81559, "count": 2, "mode": "mps"}]


async def test_an_mps_client_container_gets_its_cards_pipes_and_shared_memory(
    node_pipeline_factory: Factory, real_cluster: LocalCluster, tmp_path: Path
) -> None:
    """MPS on the real node, with the stand-in daemon (tests/fakes/): the supervisor
    runs one daemon per card; an MPS pod's container really has its card's pipe
    directory and, as its /dev/shm, the very directory its card's daemon uses, with its
    share of the SMs and its memory limit addressed to its own device (ordinal 0)."""
    need_unshare()
    host_dir = tmp_path / "mps"
    mps = {"controlCommand": str(FAKE), "hostDir": str(host_dir), "checkIntervalS": 0.2}
    p = await node_pipeline_factory(H100_MPS, {"nodeAgent": {"mps": mps}})
    node = real_cluster.node_name
    source = ["--node", node, "--source", f"file:{p.workdir / node}.yaml"]
    log = (p.workdir / "mps-control.log").open("ab")
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.node_agent",
        "mps-control",
        "--config",
        str(p.config),
        *source,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    log.close()
    try:
        ns = await p.namespace()
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000, "nvidia.com/gpucores": 30}
        obj = printing_pod("mps", [("main", limits)])
        obj["metadata"]["annotations"] = {"nvidia.com/vgpu-mode": "mps"}
        obj["spec"]["securityContext"] = {"runAsUser": 1000}
        await p.create(ns, obj)
        bound = await p.bound(ns, "mps", timeout_s=60)
        (card,) = grants_of(bound)["main"].devices
        shm = host_dir / card.uuid / "shm"

        async def made() -> bool:
            return shm.is_dir()

        await eventually(made, timeout_s=30, what=f"{shm} made by the supervisor")
        (shm / "daemon-marker").write_text("")
        await phase(p, ns, "mps", "Running", timeout_s=90)
        got = await handed(ns, "mps", "main")
        assert got.env["CUDA_MPS_PIPE_DIRECTORY"] in got.mount_points
        assert "/dev/shm" in got.mount_points
        assert "daemon-marker" in got.shm  # the card's directory, not a /dev/shm of its own
        assert got.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert got.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8000M"
        assert got.env["NVIDIA_VISIBLE_DEVICES"] == card.uuid
    finally:
        supervisor.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await supervisor.wait()
        shutil.rmtree(host_dir, ignore_errors=True)  # ends the fake daemons


async def test_controllers_run_deployments_jobs_and_disruption_budgets(
    node_pipeline_factory: Factory,
) -> None:
    """kube-controller-manager runs beside the real node: a Deployment's ReplicaSet makes
    pods that Tessera places and the kubelet runs, a Job's pod runs to completion and the
    Job succeeds, and a PodDisruptionBudget's status counts the healthy pods."""
    p = await node_pipeline_factory(A100)
    ns = await p.namespace()
    template = printing_pod("x", [("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})])
    labels = {"app": "infer"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {**template["spec"], "restartPolicy": "Always"},
            },
        },
    }
    await kube.request(p.api, "POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)
    job_spec = printing_pod("y", [("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 500})])
    job_spec["spec"]["containers"][0]["env"] = []  # print and exit
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {"backoffLimit": 0, "template": {"spec": job_spec["spec"]}},
    }
    await kube.request(p.api, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "infer"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    await kube.request(p.api, "POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb)

    async def deployment_available() -> bool:
        obj = await kube.request(p.api, "GET", f"/apis/apps/v1/namespaces/{ns}/deployments/infer")
        return obj.get("status", {}).get("availableReplicas") == 2

    await eventually(deployment_available, timeout_s=120, what="2 replicas available")
    pods, _ = await kube.list_all(
        p.api, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": "app=infer"}
    )
    for obj in pods:
        name = obj["metadata"]["name"]
        assert_own_grant(obj, "main", await handed(ns, name, "main"))

    async def job_complete() -> bool:
        obj = await kube.request(p.api, "GET", f"/apis/batch/v1/namespaces/{ns}/jobs/once")
        return obj.get("status", {}).get("succeeded") == 1

    await eventually(job_complete, timeout_s=120, what="the Job succeeded")

    async def budget_counted() -> bool:
        path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/infer"
        status = (await kube.request(p.api, "GET", path)).get("status", {})
        return status.get("currentHealthy") == 2 and status.get("disruptionsAllowed") == 1

    await eventually(budget_counted, timeout_s=60, what="the budget's status")
