"""Packing quality on a production GPU trace: each placement policy, side by side.

    python bench/packing.py [--nodes FILE] [--pods FILE] [--seed 1]

Replays the openb trace (Weng et al., ATC'23; ../shared/traces/openb/README.md) through
the placement core with the paper's method: tasks are drawn from the trace with a fixed
seed, offered in order and never leave, until the GPU demand offered reaches 100 % of the
cluster's GPUs. For each policy, in this one run, it prints the share of GPU capacity
allocated at 50/70/90/100 % offered demand, the tasks rejected, the GPUs left
unallocated and the share of GPUs left partly used at 100 %.

A sharing task (one GPU, ``gpu_milli`` < 1000) asks that share of one card's memory and
cores (``nvidia.com/gpumem-percentage``/``gpucores``); others ask whole cards. A
``gpu_spec`` becomes ``nvidia.com/use-gputype``. CPU-only tasks are skipped, and node
CPU and memory are not modelled (the ledger holds devices only). Any node and pod file of
the same columns may be given, e.g. the trace's gpushare40/multigpu20/gpuspec10 variants.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.core.families import Reason
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import DeviceInfo, DeviceUUID, NodeName, PodRef, PodRequest, PodUID
from shared.core.placement import Placement, PlacementConfig, Placer
from shared.core.policy import Shape, Workload, shape_fraction
from shared.core.request import RequestParser
from shared.core.spec import DeviceSpecs

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
CHECKPOINTS = (0.5, 0.7, 0.9, 1.0)
MODEL_MIB = {"P100": 16384, "T4": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
"""Card memory by the trace's model names (G2/G3 are internal: 32 GiB assumed). Requests
are shares of a card, so the figure only matters for reporting."""
SPECS = DeviceSpecs()
POLICIES: dict[str, PlacementConfig | None] = {
    "random": None,
    "best-fit (binpack/binpack)": PlacementConfig(node_policy="binpack", device_policy="binpack"),
    "spread (spread/spread)": PlacementConfig(node_policy="spread", device_policy="spread"),
    "FGD (fgd/fgd)": PlacementConfig(node_policy="fgd", device_policy="fgd"),
    "Tessera default (binpack/spread)": PlacementConfig(),
}


@dataclass(frozen=True)
class Task:
    name: str
    gpus: int
    milli: int
    spec: str

    @property
    def demand(self) -> float:
        """GPUs this task takes: a share of one, or whole cards."""
        return self.milli / 1000 if self.gpus == 1 and self.milli < 1000 else float(self.gpus)

    def limits(self) -> dict[str, Any]:
        if self.gpus == 1 and self.milli < 1000:
            share = math.ceil(self.milli / 10)
            return {
                "nvidia.com/gpu": 1,
                "nvidia.com/gpumem-percentage": share,
                "nvidia.com/gpucores": share,
            }
        return {
            "nvidia.com/gpu": self.gpus,
            "nvidia.com/gpumem-percentage": 100,
            "nvidia.com/gpucores": 100,
        }


def load_nodes(path: Path) -> dict[NodeName, list[DeviceInfo]]:
    nodes: dict[NodeName, list[DeviceInfo]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            count = int(row["gpu"])
            if count <= 0:
                continue
            model = row["model"]
            nodes[NodeName(row["sn"])] = [
                DeviceInfo(
                    uuid=DeviceUUID(f"{row['sn']}-{i}"),
                    index=i,
                    vendor="nvidia",
                    model=model,
                    memory_mib=MODEL_MIB.get(model, 32768),
                )
                for i in range(count)
            ]
    return nodes


def load_tasks(path: Path) -> list[Task]:
    with path.open() as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["creation_time"] or 0))
    return [
        Task(r["name"], int(r["num_gpu"]), int(r["gpu_milli"] or 0), r["gpu_spec"] or "")
        for r in rows
        if int(r["num_gpu"]) > 0
    ]


def offered(tasks: list[Task], capacity: int, seed: int) -> list[Task]:
    """Tasks drawn with a fixed seed, kept in trace order within each pass, until their
    demand reaches the cluster's capacity."""
    rng = random.Random(seed)
    out: list[Task] = []
    total = 0.0
    while total < capacity:
        task = rng.choice(tasks)
        out.append(task)
        total += task.demand
    return out


def parse(task: Task, parser: RequestParser) -> PodRequest:
    annotations = {"nvidia.com/use-gputype": task.spec.replace("|", ",")} if task.spec else {}
    pod = {
        "metadata": {"name": task.name, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": task.limits()}}]},
    }
    parsed = parser.parse(pod)
    assert isinstance(parsed, PodRequest), (task, parsed)
    return parsed


def workload(tasks: list[Task]) -> Workload:
    """The task-shape distribution FGD weighs: the trace's own (as in the paper)."""
    w = Workload()
    for t in tasks:
        fraction = t.milli / 1000 if t.gpus == 1 and t.milli < 1000 else 1.0
        w.observe(Shape(t.gpus, shape_fraction(fraction, fraction, fraction >= 1.0)))
    return w


def place_random(
    placer: Placer, ref: PodRef, request: PodRequest, rng: random.Random
) -> Placement | None:
    """The random policy: nodes in random order, the first that fits."""
    nodes = list(placer.ledger.nodes.values())
    rng.shuffle(nodes)
    ctx = placer._context(request, None)
    for node in nodes:
        grants = placer.fit_node(node, request, ctx)
        if not isinstance(grants, Reason):
            placer.ledger.grant(PodGrant(pod=ref, node=node.name, containers=grants))
            return Placement(pod=ref, node=node.name, grants=grants)
    return None


def replay(
    name: str,
    config: PlacementConfig | None,
    nodes: dict[NodeName, list[DeviceInfo]],
    stream: list[Task],
    requests: dict[str, PodRequest],
    shapes: Workload,
    seed: int,
) -> dict[str, Any]:
    ledger = Ledger(SPECS)
    for node, devices in nodes.items():
        ledger.set_node(node, devices)
    placer = Placer(ledger, config or PlacementConfig(), workload=shapes)
    capacity = ledger.device_count()
    rng = random.Random(seed)
    allocated = offered_so_far = 0.0
    rejected = 0
    marks = iter(CHECKPOINTS)
    mark = next(marks)
    at: dict[str, float] = {}
    started = time.perf_counter()
    for i, task in enumerate(stream):
        ref = PodRef(namespace="openb", name=f"{task.name}-{i}", uid=PodUID(f"{i}"))
        request = requests[task.name]
        if config is None:
            placed = place_random(placer, ref, request, rng) is not None
        else:
            placed = isinstance(placer.place(ref, request, trial=True), Placement)
        offered_so_far += task.demand
        if placed:
            allocated += task.demand
        else:
            rejected += 1
        while offered_so_far >= mark * capacity - 1e-9:
            at[f"{round(mark * 100)}%"] = round(allocated / capacity * 100, 1)
            at[f"rejected@{round(mark * 100)}%"] = rejected
            mark = next(marks, math.inf)
    devices = [d for n in ledger.nodes.values() for d in n.devices]
    partial = sum(1 for d in devices if 1e-9 < d.free_fraction() < 1 - 1e-9)
    return {
        "policy": name,
        **at,
        "unallocated_gpus": round(capacity - allocated, 1),
        "partly_used_pct": round(partial / len(devices) * 100, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=TRACE / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=TRACE / "openb_pod_list_default.csv")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    nodes = load_nodes(args.nodes)
    tasks = load_tasks(args.pods)
    capacity = sum(len(d) for d in nodes.values())
    stream = offered(tasks, capacity, args.seed)
    request_parser = RequestParser(SPECS)
    requests = {t.name: parse(t, request_parser) for t in tasks}
    shapes = workload(tasks)
    print(
        f"packing {args.pods.name} on {args.nodes.name}: {len(nodes)} nodes, {capacity} GPUs; "
        f"{len(stream)} tasks offered (seed {args.seed}) up to 100% of the GPUs"
    )
    results = []
    for name, config in POLICIES.items():
        result = replay(name, config, nodes, stream, requests, shapes, args.seed)
        print(json.dumps(result), flush=True)
        results.append(result)
    best_fit = next(r for r in results if r["policy"].startswith("best-fit"))
    print(
        "| policy | alloc @50% | @70% | @90% | @100% | rejected @100% | GPUs unallocated "
        "| vs best-fit | GPUs partly used |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = r["unallocated_gpus"] / best_fit["unallocated_gpus"]
        print(
            f"| {r['policy']} | {r['50%']}% | {r['70%']}% | {r['90%']}% | {r['100%']}% "
            f"| {r['rejected@100%']} | {r['unallocated_gpus']} | {ratio:.2f}x "
            f"| {r['partly_used_pct']}% |"
        )


if __name__ == "__main__":
    main()
