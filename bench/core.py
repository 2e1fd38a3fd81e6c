"""Placement-core benchmark: throughput at 1,000 vs 10,000 nodes, gangs, ledger memory.

    python bench/core.py [--pods 20000] [--gangs 200] [--seed 1]

Prints, in one run on one core:
- single-slice vGPU placements/s on 1,000 and 10,000 nodes x 8 A100-80GB, and their
  ratio (the index must keep the cost per pod flat as the cluster grows);
- the same pods placed by a naive scan of every node (the baseline the index replaces);
- 64-pod gangs placed per second;
- the ledger's memory at 10,000 nodes x 8 GPUs holding 80,000 grants.
"""

from __future__ import annotations

import gc
import random
import time
import tracemalloc

from harness import options

from shared.core.ledger import Ledger, NodeState, PodGrant
from shared.core.model import (
    ContainerGrant,
    ContainerRequest,
    DeviceInfo,
    DeviceRequest,
    DeviceUUID,
    GangKey,
    NodeName,
    PodRef,
    PodRequest,
    PodUID,
)
from shared.core.placement import GangMember, Placement, Placer
from shared.core.spec import DeviceSpecs
from shared.core.status import Status

SPECS = DeviceSpecs()
GPU_MIB = 81920


def cluster(nodes: int, gpus: int = 8) -> Ledger:
    ledger = Ledger(SPECS)
    for n in range(nodes):
        name = NodeName(f"node-{n:05d}")
        ledger.set_node(
            name,
            [
                DeviceInfo(
                    uuid=DeviceUUID(f"GPU-{n:05d}-{i}"),
                    index=i,
                    vendor="nvidia",
                    model="NVIDIA-A100-SXM4-80GB",
                    memory_mib=GPU_MIB,
                    numa=i // 4,
                )
                for i in range(gpus)
            ],
        )
    return ledger


def vgpu_pod(i: int, memory: int, cores: int, count: int = 1) -> tuple[PodRef, PodRequest]:
    request = PodRequest(
        containers=(
            ContainerRequest(
                name="main",
                devices=(
                    DeviceRequest(
                        vendor="nvidia",
                        resource="nvidia.com/gpu",
                        count=count,
                        memory_mib=memory,
                        cores=cores,
                        memory_resource="nvidia.com/gpumem",
                        core_resource="nvidia.com/gpucores",
                    ),
                ),
            ),
        )
    )
    return PodRef(namespace="bench", name=f"p{i}", uid=PodUID(f"uid-{i}")), request


def workload(pods: int, seed: int) -> list[tuple[PodRef, PodRequest]]:
    rng = random.Random(seed)
    return [
        vgpu_pod(i, rng.choice((2048, 4096, 8192, 10240, 16384)), rng.choice((0, 10, 20, 25)))
        for i in range(pods)
    ]


def rate(nodes: int, pods: list[tuple[PodRef, PodRequest]], naive: bool = False) -> float:
    ledger = cluster(nodes)
    placer = Placer(ledger)
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    placed = 0
    if naive:
        # What a scheduler extender does (HAMi): filter every node, score every fit with
        # the node policy (binpack: fullest after placement), take the best, reserve it.
        ctx = placer._context(pods[0][1], None)
        for ref, req in pods:
            best: tuple[float, NodeState, tuple[ContainerGrant, ...]] | None = None
            for node in ledger.nodes.values():
                grants = placer.fit_node(node, req, ctx)
                if isinstance(grants, Status):
                    continue
                used = sum(d.used_mem for d in node.devices) + sum(
                    g.memory_mib for c in grants for g in c.devices
                )
                if best is None or used > best[0]:
                    best = (used, node, grants)
            if best is not None:
                ledger.grant(PodGrant(pod=ref, node=best[1].name, containers=best[2]))
                placed += 1
    else:
        for ref, req in pods:
            placed += isinstance(placer.place(ref, req), Placement)
    elapsed = time.perf_counter() - start
    gc.enable()
    assert placed == len(pods), f"only {placed}/{len(pods)} placed"
    return len(pods) / elapsed


def gangs(nodes: int, count: int, size: int = 64) -> tuple[float, float]:
    ledger = cluster(nodes)
    placer = Placer(ledger)
    ok = 0
    start = time.perf_counter()
    for g in range(count):
        members = []
        for m in range(size):
            ref, req = vgpu_pod(g * size + m, 20480, 25)
            members.append(
                GangMember(pod=ref, request=req, group=GangKey(namespace="bench", name=f"gang-{g}"))
            )
        ok += placer.place_gang(members, min_member=size).ok
    elapsed = time.perf_counter() - start
    return count / elapsed, ok / count


def ledger_memory(nodes: int, grants: int) -> tuple[float, int]:
    gc.collect()
    tracemalloc.start()
    ledger = cluster(nodes)
    placer = Placer(ledger)
    for i in range(grants):
        ref, req = vgpu_pod(i, 8192, 10)
        placer.place(ref, req)
    current, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return current / 2**20, len(ledger.pods)


def main() -> None:
    args = options(__doc__, pods=20000, naive_pods=300, gangs=200, seed=1)
    pods = workload(args.pods, args.seed)
    print(f"placement core, single-slice vGPU pods ({args.pods} pods, 8 x A100-80GB per node)")
    r1k = rate(1000, pods)
    r10k = rate(10000, pods)
    naive = workload(args.naive_pods, args.seed)
    n1k = rate(1000, naive, naive=True)
    n10k = rate(10000, naive, naive=True)
    print(f"{'nodes':>8} {'indexed pods/s':>15} {'full-scan pods/s':>17} {'index/scan':>11}")
    print(f"{1000:>8} {r1k:>15,.0f} {n1k:>17,.0f} {r1k / n1k:>10.1f}x")
    print(f"{10000:>8} {r10k:>15,.0f} {n10k:>17,.0f} {r10k / n10k:>10.1f}x")
    print(f"10,000-node rate / 1,000-node rate: {r10k / r1k:.2f} (target >= 0.70)")
    print(f"target >= 5,000 pods/s at 10,000 nodes: {'met' if r10k >= 5000 else 'NOT met'}")
    g_rate, g_ok = gangs(1000, args.gangs)
    print(
        f"gangs of 64 (20 GiB, 25% cores each) on 1,000 nodes: {g_rate:,.1f} gangs/s "
        f"({g_rate * 64:,.0f} pods/s), {g_ok:.0%} placed"
    )
    mib, held = ledger_memory(10000, 80000)
    print(f"ledger memory, 10,000 nodes x 8 GPUs with {held:,} grants: {mib:,.1f} MiB")


if __name__ == "__main__":
    main()
