"""Tessera against kube-scheduler on one real API server, side by side in one run.

    python bench/e2e.py [--nodes 1000] [--pods 10000]

Starts etcd, kube-apiserver, kube-scheduler (same release, client QPS/burst 5000 as in
Kubernetes' scheduler_perf), nats-server and Tessera's five services, with ``--nodes``
simulated nodes of 8 x A100-80GB. The Node objects advertise ``nvidia.com/gpu: 8`` as
NVIDIA's device plugin would, so kube-scheduler places whole-GPU pods by that extended
resource; Tessera places by its device ledger. Then, on the same nodes, one after the
other (each run's pods deleted before the next):

1. kube-scheduler: ``--pods`` pods asking ``nvidia.com/gpu: 1``;
2. Tessera: the same whole-GPU pods (``schedulerName: tessera``);
3. Tessera: fractional vGPU pods (1 device, 20 % memory, 25 % cores).

Pods are created as fast as the API server takes them (``--writers`` at once). Per run it
prints pods bound per second (first create to last bound) and the p50/p99/max time from
a pod's creation to its binding (bench/harness.py says how both are clocked), then the
ratios against kube-scheduler. With more whole-GPU pods than GPUs the cluster fills: the
figures are over the pods bound, and both schedulers face the same overflow.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Binds, connect, cpu_seconds, namespace, pct, tessera, wait_nodes

from shared import kube
from tools.localcluster import LocalCluster

WHOLE = {"nvidia.com/gpu": 1}
SLICE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 20, "nvidia.com/gpucores": 25}
RUNS = [
    ("kube-scheduler, whole GPU", "default-scheduler", WHOLE),
    ("Tessera, whole GPU", "tessera", WHOLE),
    ("Tessera, vGPU 20% mem 25% cores", "tessera", SLICE),
]


def bench_pod(name: str, scheduler: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def advertise_whole_gpus(api: kube.Client, nodes: list[dict[str, Any]]) -> None:
    """``nvidia.com/gpu`` as NVIDIA's device plugin advertises it: one per card; and no
    ``not-ready`` taint (the node-lifecycle controller, not run here, lifts the one the
    TaintNodesByCondition admission puts on every new Node once it reports Ready)."""
    slots = asyncio.Semaphore(32)

    async def one(node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        resources = {**node["status"]["allocatable"], "nvidia.com/gpu": "8"}
        async with slots:
            await kube.request(
                api,
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": None}},
                content_type="application/merge-patch+json",
            )
            await kube.request(
                api,
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": {"capacity": resources, "allocatable": resources}},
                content_type="application/strategic-merge-patch+json",
            )

    await asyncio.gather(*(one(n) for n in nodes))


async def one_run(
    api: kube.Client, ns: str, scheduler: str, limits: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    await namespace(api, ns)
    binds = Binds(api, ns, args.pods)
    binds.start()
    created: dict[str, float] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(args.pods):
        queue.put_nowait(i)

    async def writer() -> None:
        while not queue.empty():
            name = f"p-{queue.get_nowait():05d}"
            await kube.request(
                api, "POST", f"/api/v1/namespaces/{ns}/pods", bench_pod(name, scheduler, limits)
            )
            created[name] = time.monotonic()

    start = time.monotonic()
    await asyncio.gather(*(writer() for _ in range(args.writers)))
    create_s = time.monotonic() - start
    await binds.wait(args.timeout, settle_s=args.settle)
    latencies = sorted(binds.at[n] - created[n] for n in binds.at if n in created)
    end = max(binds.at.values(), default=start)
    return {
        "pods": args.pods,
        "bound": len(binds.at),
        "create_s": round(create_s, 2),
        "total_s": round(end - start, 2),
        "pods_per_s": round(len(binds.at) / (end - start), 1) if binds.at else 0.0,
        "p50_ms": round(pct(latencies, 0.50) * 1000),
        "p99_ms": round(pct(latencies, 0.99) * 1000),
        "max_ms": round(latencies[-1] * 1000) if latencies else 0,
    }


async def clear(api: kube.Client, ns: str) -> None:
    """Delete a run's pods at once (no kubelet confirms a graceful delete). A delete of
    thousands of pods can outlast the API server's request timeout (it goes on there):
    wait for the pods to go, asking again whenever progress stops."""
    asked_at = progress_at = 0.0
    left = math.inf
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if time.monotonic() - progress_at > 15 and time.monotonic() - asked_at > 15:
            asked_at = time.monotonic()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    kube.request(
                        api,
                        "DELETE",
                        f"/api/v1/namespaces/{ns}/pods",
                        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                    ),
                    timeout=5,
                )
        page = await kube.request(  # one item and a count: listing all would load the server
            api, "GET", f"/api/v1/namespaces/{ns}/pods", query={"limit": "1"}
        )
        if not page["items"]:
            return
        count = 1 + int(page["metadata"].get("remainingItemCount") or 0)
        if count < left:
            left, progress_at = count, time.monotonic()
        await asyncio.sleep(2.0)


async def run(
    args: argparse.Namespace, cluster: LocalCluster, pids: dict[str, int]
) -> list[dict[str, Any]]:
    api = await connect(cluster)
    async with api:
        nodes = await wait_nodes(api, args.nodes)
        await advertise_whole_gpus(api, nodes)
        await asyncio.sleep(5)  # let every scheduler's node cache catch up
        results = []
        for i, (label, scheduler, limits) in enumerate(RUNS):
            ns = f"e2e-{i}"
            before = cpu_seconds(pids)
            result = {"run": label, **await one_run(api, ns, scheduler, limits, args)}
            after = cpu_seconds(pids)
            result["cpu_s"] = {k: round(after[k] - before.get(k, 0.0), 1) for k in after}
            print(json.dumps(result), flush=True)
            results.append(result)
            if i < len(RUNS) - 1:  # the last run's pods go with the control plane
                await clear(api, ns)
                await asyncio.sleep(args.settle)  # releases reach the ledger before the next

        return results


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    base = results[0]
    lines = [
        f"end to end on one API server: {args.nodes} simulated nodes x 8 A100-80GB, "
        f"{args.pods} pods per run, {args.writers} writers",
        "| run | bound | pods/s | p50 ms | p99 ms | max ms | pods/s vs kube-scheduler "
        "| p99 vs kube-scheduler |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        speed = r["pods_per_s"] / base["pods_per_s"] if base["pods_per_s"] else 0.0
        p99 = r["p99_ms"] / base["p99_ms"] if base["p99_ms"] else 0.0
        lines.append(
            f"| {r['run']} | {r['bound']}/{r['pods']} | {r['pods_per_s']:.1f} | {r['p50_ms']} "
            f"| {r['p99_ms']} | {r['max_ms']} | {speed:.2f}x | {p99:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--writers", type=int, default=32, help="creates in flight")
    parser.add_argument("--timeout", type=float, default=300, help="per run, after creation")
    parser.add_argument(
        "--settle", type=float, default=10, help="a run ends after this long with no new bind"
    )
    parser.add_argument("--keep", action="store_true", help="keep the control plane's logs")
    parser.add_argument("--log-level", default="WARNING", help="of Tessera's services")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tessera-bench-e2e-"))
    with (
        LocalCluster(workdir=workdir / "cluster", with_scheduler=True, keep=args.keep) as cluster,
        tessera(workdir, cluster, args.nodes, args.log_level) as services,
    ):
        pids = {p.name: p.popen.pid for p in cluster.procs} | services
        results = asyncio.run(run(args, cluster, pids))
    print(table(results, args))
    print("CPU seconds per process during each run (2 cores shared by all):")
    for r in results:
        busy = sorted(r["cpu_s"].items(), key=lambda kv: -kv[1])
        print(f"  {r['run']}: " + ", ".join(f"{k} {v:.1f}" for k, v in busy if v >= 0.1))
    print(f"(service logs: {workdir})")


if __name__ == "__main__":
    main()
