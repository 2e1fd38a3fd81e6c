"""Gang scheduling end to end: PodGroups of 8 vGPU pods on simulated nodes.

    python bench/gangs.py [--gangs 500] [--size 8] [--nodes 1000]

Starts the local control plane (etcd, kube-apiserver), NATS and the five services as
processes, simulates ``--nodes`` nodes of 8 x A100-80GB, then creates ``--gangs``
PodGroups (``minMember`` = ``--size``) and their pods (1 vGPU, 20 GiB, 25 % cores
each) as fast as the API server takes them. It prints gangs per second (first create to
last bind) and the p50/p99/max time from a gang's last member being created to all of
its members bound, measured on this process's clock from the API server's watch events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Binds, connect, namespace, options, pct, tessera, wait_nodes

from shared import kube
from tools.localcluster import LocalCluster

VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"


def member(gang: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{gang}-{i}", "annotations": {"scheduling.k8s.io/group-name": gang}},
        "spec": {
            "schedulerName": "tessera",
            "containers": [
                {
                    "name": "worker",
                    "image": "pytorch/pytorch",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": 1,
                            "nvidia.com/gpumem": 20480,
                            "nvidia.com/gpucores": 25,
                        }
                    },
                }
            ],
        },
    }


async def run(args: argparse.Namespace, cluster: LocalCluster) -> dict[str, Any]:
    api = await connect(cluster)
    async with api:
        await wait_nodes(api, args.nodes)
        await namespace(api, "bench")
        binds = Binds(api, "bench", args.gangs * args.size)
        binds.start()
        last_created: dict[str, float] = {}
        slots = asyncio.Semaphore(16)

        async def create_gang(g: int) -> None:
            gang = f"gang-{g:04d}"
            async with slots:
                await kube.request(
                    api,
                    "POST",
                    f"{VOLCANO}/namespaces/bench/podgroups",
                    {
                        "apiVersion": "scheduling.volcano.sh/v1beta1",
                        "kind": "PodGroup",
                        "metadata": {"name": gang},
                        "spec": {"minMember": args.size},
                    },
                )
                for i in range(args.size):
                    await kube.request(
                        api, "POST", "/api/v1/namespaces/bench/pods", member(gang, i)
                    )
                last_created[gang] = time.monotonic()

        start = time.monotonic()
        await asyncio.gather(*(create_gang(g) for g in range(args.gangs)))
        created = time.monotonic()
        await binds.wait(args.timeout)
        end = max(binds.at.values(), default=time.monotonic())
        latencies = []
        for gang, t in last_created.items():
            members = [binds.at.get(f"{gang}-{i}") for i in range(args.size)]
            if all(m is not None for m in members):
                latencies.append(max(m for m in members if m is not None) - t)
        latencies.sort()
        return {
            "gangs": args.gangs,
            "size": args.size,
            "nodes": args.nodes,
            "pods_bound": len(binds.at),
            "gangs_complete": len(latencies),
            "create_s": created - start,
            "total_s": end - start,
            "gangs_per_s": len(latencies) / (end - start) if latencies else 0.0,
            "p50_s": pct(latencies, 0.50),
            "p99_s": pct(latencies, 0.99),
            "max_s": latencies[-1] if latencies else 0,
            "mean_s": statistics.fmean(latencies) if latencies else 0.0,
        }


def main() -> None:
    args = options(__doc__, gangs=500, size=8, nodes=1000, timeout=600.0)
    workdir = Path(tempfile.mkdtemp(prefix="tessera-bench-gangs-"))
    with (
        LocalCluster(workdir=workdir / "cluster") as cluster,
        tessera(workdir, cluster, args.nodes),
    ):
        result = asyncio.run(run(args, cluster))
    print(
        f"gang scheduling, end to end: {args.gangs} PodGroups x {args.size} pods "
        f"(1 vGPU, 20 GiB, 25% cores) on {args.nodes} simulated nodes x 8 A100-80GB"
    )
    print(
        f"  pods bound: {result['pods_bound']}/{args.gangs * args.size}, gangs complete: "
        f"{result['gangs_complete']}/{args.gangs}"
    )
    print(
        f"  creating every object took {result['create_s']:.1f}s; "
        f"first create to last bind {result['total_s']:.1f}s"
    )
    print(
        f"  gangs/s: {result['gangs_per_s']:.1f} ({result['gangs_per_s'] * args.size:.0f} pods/s)"
    )
    print(
        f"  last member created -> all bound: p50 {result['p50_s'] * 1000:.0f} ms, "
        f"p99 {result['p99_s'] * 1000:.0f} ms, max {result['max_s'] * 1000:.0f} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
