"""Placement-core benchmark: throughput at 1,000 vs 10,000 nodes, gangs, ledger memory.

    python bench/core.py [--pods 20000] [--gangs 200] [--seed 1]

Prints, in one run on one core:
- placements/s on 1,000 and 10,000 nodes x 8 A100-80GB, and their ratio (the indexes
  must keep the cost per pod flat as the cluster grows), for two workloads:
  single-slice vGPU pods alone, and realistic pods: the same slices plus cpu and memory
  requests, a nodeSelector on half of them, a toleration on a quarter and a zone spread
  constraint (DoNotSchedule) on a tenth, on nodes with zone and pool labels, a tainted
  quarter and allocatable cpu, memory and pods (every kube-scheduler filter runs);
- the device-only pods placed by a naive scan of every node (the baseline the index
  replaces);
- 64-pod gangs placed per second;
- the ledger's memory at 10,000 nodes x 8 GPUs holding 80,000 grants;
- realistic pods/s on 1,000 nodes with the fragmentation guard's window at its default,
  at 2 and off (0, what the allocator uses while behind a burst): its cost; and the
  same for bench/e2e.py's vGPU pods (every one 16 GiB and 25 % of the cores of a card,
  with the realistic cpu, memory and constraints; 5,000 of them).
"""

from __future__ import annotations

import gc
import random
import time
import tracemalloc
from typing import Any

from harness import options

from shared.core.hosts import PodSpec, node_spec, pod_spec
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
from shared.core.placement import GangMember, Placement, PlacementConfig, Placer
from shared.core.request import ResourceTable
from shared.core.spec import DeviceSpecs
from shared.core.status import Status

SPECS = DeviceSpecs()
MANAGED = frozenset(ResourceTable.build(SPECS).by_name)
GPU_MIB = 81920


ZONES = ("zone-a", "zone-b", "zone-c")


def node_object(n: int) -> dict[str, Any]:
    """Node ``n`` as the API server has it: zone and pool labels, a tainted quarter."""
    taints = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}] if n % 4 == 3 else []
    return {
        "metadata": {
            "name": f"node-{n:05d}",
            "labels": {
                "kubernetes.io/hostname": f"node-{n:05d}",
                "topology.kubernetes.io/zone": ZONES[n % len(ZONES)],
                "pool": "a" if n % 2 else "b",
            },
        },
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110"}},
    }


def cluster(nodes: int, gpus: int = 8, *, specs: bool = False) -> Ledger:
    ledger = Ledger(SPECS)
    for n in range(nodes):
        name = NodeName(f"node-{n:05d}")
        if specs:
            ledger.set_spec(node_spec(node_object(n)))
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


Pod = tuple[PodRef, PodRequest, PodSpec | None]


def workload(pods: int, seed: int, *, realistic: bool = False, uniform: bool = False) -> list[Pod]:
    """Slices of random sizes, or (``uniform``) bench/e2e.py's: 20 % of an 80 GiB card
    and 25 % of its cores each."""
    rng = random.Random(seed)
    out: list[Pod] = []
    for i in range(pods):
        if uniform:
            ref, req = vgpu_pod(i, GPU_MIB // 5, 25)
        else:
            ref, req = vgpu_pod(
                i, rng.choice((2048, 4096, 8192, 10240, 16384)), rng.choice((0, 10, 20, 25))
            )
        out.append((ref, req, host_spec(i, rng) if realistic else None))
    return out


def host_spec(i: int, rng: random.Random) -> PodSpec:
    """The kube-scheduler side of a realistic pod (see the module docstring)."""
    app = f"app-{i // 100}"
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "resources": {
                    "requests": {
                        "cpu": rng.choice(("500m", "1", "2", "4")),
                        "memory": rng.choice(("1Gi", "4Gi", "8Gi", "16Gi")),
                    }
                },
            }
        ]
    }
    if i % 2:
        spec["nodeSelector"] = {"pool": "a"}
    if i % 4 == 1:
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    if i % 10 == 0:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": app}},
            }
        ]
    return pod_spec(
        {"metadata": {"namespace": "bench", "labels": {"app": app}}, "spec": spec},
        managed=MANAGED,
    )


def rate(nodes: int, pods: list[Pod], naive: bool = False, guard: int | None = None) -> float:
    ledger = cluster(nodes, specs=pods[0][2] is not None)
    config = PlacementConfig() if guard is None else PlacementConfig(fragmentation_guard=guard)
    placer = Placer(ledger, config)
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    placed = 0
    if naive:
        # What a scheduler extender does (HAMi): filter every node, score every fit with
        # the node policy (binpack: fullest after placement), take the best, reserve it.
        ctx = placer._context(pods[0][1], None)
        for ref, req, _spec in pods:
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
        for ref, req, spec in pods:
            placed += isinstance(placer.place(ref, req, spec=spec), Placement)
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
    real = workload(args.pods, args.seed, realistic=True)
    print(f"placement core ({args.pods} pods, 8 x A100-80GB per node)")
    r1k, r10k = rate(1000, pods), rate(10000, pods)
    q1k, q10k = rate(1000, real), rate(10000, real)
    naive = workload(args.naive_pods, args.seed)
    n1k = rate(1000, naive, naive=True)
    n10k = rate(10000, naive, naive=True)
    print(
        f"{'nodes':>8} {'vGPU pods/s':>12} {'full scan':>10} {'index/scan':>11}"
        f" {'realistic pods/s':>17} {'realistic/vGPU':>15}"
    )
    for n, r, nv, q in ((1000, r1k, n1k, q1k), (10000, r10k, n10k, q10k)):
        print(f"{n:>8} {r:>12,.0f} {nv:>10,.0f} {r / nv:>10.1f}x {q:>17,.0f} {q / r:>14.2f}x")
    print(
        f"10,000-node rate / 1,000-node rate: vGPU {r10k / r1k:.2f}, realistic {q10k / q1k:.2f}"
        " (target >= 0.70)"
    )
    print(
        f"target >= 10,000 realistic pods/s at 10,000 nodes: "
        f"{'met' if q10k >= 10000 else 'NOT met'} ({q10k:,.0f})"
    )
    default = PlacementConfig().fragmentation_guard
    narrow = {g: rate(1000, real, guard=g) for g in (0, 2)}
    print(
        f"realistic pods/s on 1,000 nodes by fragmentationGuard: {default} (default) "
        f"{q1k:,.0f}, 2 {narrow[2]:,.0f}, 0 (first fit, as behind a burst) {narrow[0]:,.0f}"
    )
    e2e = workload(min(args.pods, 5000), args.seed, realistic=True, uniform=True)
    by_guard = {g: rate(1000, e2e, guard=g) for g in (default, 2, 0)}
    print(
        "bench/e2e.py's vGPU pods (realistic) on 1,000 nodes by fragmentationGuard: "
        + ", ".join(f"{g} {r:,.0f} pods/s ({1e6 / r:,.0f} µs)" for g, r in by_guard.items())
    )
    g_rate, g_ok = gangs(1000, args.gangs)
    print(
        f"gangs of 64 (20 GiB, 25% cores each) on 1,000 nodes: {g_rate:,.1f} gangs/s "
        f"({g_rate * 64:,.0f} pods/s), {g_ok:.0%} placed"
    )
    mib, held = ledger_memory(10000, 80000)
    print(f"ledger memory, 10,000 nodes x 8 GPUs with {held:,} grants: {mib:,.1f} MiB")


if __name__ == "__main__":
    main()
