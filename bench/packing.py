"""Packing quality on a production GPU trace: each placement policy, side by side.

    python bench/packing.py [--variants default,gpushare40,gpuspec10,multigpu20,gpuspec33]
                            [--max-demand 1.3] [--seed 1 | --seeds 1,2,3]
                            [--draw iid|paper] [--policies ...] [--quick]
                            [--fgd-candidates N] [--skip-cpu-only] [--nodes FILE]

Replays the openb trace (Weng et al., ATC'23; ../shared/traces/openb/README.md) through
the placement core with the paper's method. The offered stream is by default the FGD
artifact's (``--draw paper``: its simulator run with ``-tune 1.3 --shuffle-pod``): every
task of the trace once, more drawn with a fixed seed, uniformly with replacement, until
the GPU demand would pass 130 % of the cluster's GPUs, all of it shuffled. Tasks are
offered one by one in that order and never leave, until the GPU demand offered reaches
``--max-demand`` (130 % by default). Every policy replays the same offered stream, in
this one run. ``--draw iid`` draws every task with replacement instead (the trace sorted
by ``creation_time``, or in file order where the file has no such column): the same
tasks in expectation, with more variation between seeds; the paper's figures come from
its artifact's stream, so that is the one they are compared with (bench/RESULTS.md has
both). ``--seeds`` replays each seed in turn and ends with every seed's allocation at
100 % and the mean.

The whole node is modelled as the paper's simulator does: a node's ``cpu_milli`` and
``memory_mib`` are its allocatable cpu and memory (and 1,000 pods), a task's are its
cpu and memory requests, and kube-scheduler's filters (NodeResourcesFit) apply to every
task through the core's ``NodeSpec``/``PodSpec``. CPU-only tasks (``num_gpu`` 0) are
offered too: they take cpu and memory and can keep GPU tasks off a node. As in the
paper, the offered-demand thresholds and every GPU figure count GPUs only.

A sharing task (one GPU, ``gpu_milli`` < 1000) asks that share of one card's memory and
cores (``nvidia.com/gpumem-percentage``/``gpucores``); others ask whole cards. A
``gpu_spec`` becomes ``nvidia.com/use-gputype``.

FGD weighs the task types of the whole pod list as the paper does (``workload``): each
GPU task's shape, cpu, memory and GPU types. Best-fit and spread are HAMi's policies as
they are (``fragmentationGuard: 0``: the first node that fits; pods with no GPU by
kube-scheduler's scores); Tessera's default is binpack nodes and spread devices with
the guard of shared/core/placement.py (``PlacementConfig.fragmentation_guard``: of the
first 16 nodes that fit in binpack's order, at most 4 of one node kind where there are
several, the one, and the devices, that add least fragmentation).
``--fgd-candidates 0`` makes FGD weigh every node, the paper's form.

``gpuspec<N>`` with N above 10 (``gpuspec33``: 33 % of the GPU tasks name a GPU model)
is derived on the fly from the public gpuspec10 list (:func:`gpuspec_tasks`), as that list
differs from the default one: the same tasks, more of them typed, the constraint of each
drawn from the trace's own.

For each variant it prints, per policy, the share of GPU capacity allocated at
50/70/90/100/110/120/130 % offered demand and, at 100 % and at the maximum: the GPUs left
unallocated (and that against best-fit), GPU tasks and CPU-only tasks rejected, and the
seconds the replay took; then where the unallocated GPUs are at 100 %; and at the end a
variant x policy summary of the allocation at 100 %, beside the paper's reported rates.

The whole run (4 variants x 5 policies to 130 %) takes about 7 minutes on 2 cores, FGD
and random most of it. ``--quick`` leaves out those two and stops at 100 % (under a
minute); ``--policies`` and ``--max-demand`` given with it still apply. The
script re-executes itself with PYTHONHASHSEED=0: which of several equal nodes the core
picked followed the iteration order of a set of node names (shared/core/ledger.py
``refile``, which now goes in name order), and the figures moved (slightly) from one
process to the next; the fixed seed stays as a guard against any other such order.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shared.core.hosts import NodeSpec, PodSpec, node_spec, pod_spec
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import DeviceInfo, DeviceUUID, NodeName, PodRef, PodRequest, PodUID
from shared.core.placement import Placement, PlacementConfig, Placer
from shared.core.policy import Shape, Workload, shape_fraction
from shared.core.request import RequestParser, ResourceTable
from shared.core.spec import DeviceSpecs
from shared.core.status import Status

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
VARIANTS = ("default", "gpushare40", "gpuspec10", "multigpu20")
DERIVED = re.compile(r"gpuspec(\d+)")
"""A variant made here from gpuspec10 (:func:`gpuspec_tasks`): this percentage typed."""
SPEC_SEED = 10
"""The seed of that derivation: one fixed pod list per name, whatever the replay's seed."""
BASE_CHECKPOINTS = (0.5, 0.7, 0.9, 1.0)
MODEL_MIB = {"P100": 16384, "T4": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
"""Card memory by the trace's model names (G2/G3 are internal: 32 GiB assumed). Requests
are shares of a card, so the figure only matters for reporting."""
TUNE = 1.3
"""The FGD artifact inflates the trace to this share of the GPUs (``--draw paper``)."""
HASH_SEED = "0"
"""PYTHONHASHSEED the run re-executes itself under (see main)."""
NODE_PODS = 1000
"""Pods a node may hold: large, as in the paper's simulator (cpu and memory bind first)."""
SPECS = DeviceSpecs()
MANAGED = frozenset(ResourceTable.build(SPECS).by_name)
POLICIES: dict[str, PlacementConfig | None] = {
    "random": None,
    "best-fit": PlacementConfig(
        node_policy="binpack", device_policy="binpack", fragmentation_guard=0
    ),
    "spread": PlacementConfig(node_policy="spread", device_policy="spread", fragmentation_guard=0),
    "FGD": PlacementConfig(node_policy="fgd", device_policy="fgd"),
    "Tessera default": PlacementConfig(),
}
QUICK = "best-fit,spread,Tessera default"
LABELS = {
    "random": "random",
    "best-fit": "best-fit (binpack/binpack)",
    "spread": "spread (spread/spread)",
    "FGD": "FGD (fgd/fgd)",
    "Tessera default": "Tessera default (binpack/spread, guard 16)",
}
PAPER = {
    "default": (92.86, 95.23),
    "gpushare40": (91.44, 93.96),
    "gpuspec10": (93.10, 94.66),
    "multigpu20": (93.73, 95.53),
}
"""GPU allocation rate (%) at 100 % offered demand the FGD paper reports for best-fit and
FGD (its simulator's own numbers, the mean of 10 seeds)."""


@dataclass(frozen=True)
class Task:
    name: str
    gpus: int
    milli: int
    spec: str
    cpu_milli: int
    memory_mib: int

    @property
    def demand(self) -> float:
        """GPUs this task takes: none, a share of one, or whole cards."""
        if self.gpus <= 0:
            return 0.0
        return self.milli / 1000 if self.gpus == 1 and self.milli < 1000 else float(self.gpus)

    def limits(self) -> dict[str, Any]:
        if self.gpus <= 0:
            return {}
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

    def pod(self) -> dict[str, Any]:
        """The task as a v1.Pod-shaped object."""
        annotations = {"nvidia.com/use-gputype": self.spec.replace("|", ",")} if self.spec else {}
        resources: dict[str, Any] = {
            "requests": {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"}
        }
        if self.gpus > 0:
            resources["limits"] = self.limits()
        return {
            "metadata": {"name": self.name, "namespace": "openb", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": resources}]},
        }


@dataclass(frozen=True)
class Node:
    name: NodeName
    devices: list[DeviceInfo]
    spec: NodeSpec


def load_nodes(path: Path) -> list[Node]:
    nodes: list[Node] = []
    with path.open() as f:
        for row in csv.DictReader(f):
            count = int(row["gpu"])
            if count <= 0:
                continue  # the GPU node list has none; the paper's clusters are GPU nodes
            model = row["model"]
            obj = {
                "metadata": {"name": row["sn"], "labels": {"kubernetes.io/hostname": row["sn"]}},
                "status": {
                    "allocatable": {
                        "cpu": f"{int(row['cpu_milli'])}m",
                        "memory": f"{int(row['memory_mib'])}Mi",
                        "pods": str(NODE_PODS),
                    }
                },
            }
            devices = [
                DeviceInfo(
                    uuid=DeviceUUID(f"{row['sn']}-{i}"),
                    index=i,
                    vendor="nvidia",
                    model=model,
                    memory_mib=MODEL_MIB.get(model, 32768),
                )
                for i in range(count)
            ]
            nodes.append(Node(NodeName(row["sn"]), devices, node_spec(obj)))
    return nodes


def load_tasks(path: Path) -> list[Task]:
    """Every task, CPU-only ones included, by ``creation_time`` (a stable sort), or in
    file order when the file has no such column (the multigpu20 variant)."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if rows and "creation_time" in rows[0]:
        rows.sort(key=lambda r: int(r["creation_time"] or 0))
    return [
        Task(
            r["name"],
            int(r["num_gpu"]),
            int(r.get("gpu_milli") or 0),
            r.get("gpu_spec") or "",
            int(r.get("cpu_milli") or 0),
            int(r.get("memory_mib") or 0),
        )
        for r in rows
    ]


def gpuspec_tasks(percent: int, seed: int = SPEC_SEED) -> list[Task]:
    """The openb pod list with ``percent`` % of its GPU tasks naming GPU models, made
    as the public gpuspec10 list is made from the default one. That list is the default
    list with 732 of its 7,064 GPU tasks (10.4 %) given a ``gpu_spec`` and nothing else
    changed; the specs are model names of the node list (``T4``, ``V100M16|V100M32``,
    ...), and which ones a task gets follows its shape (a share of a card: T4 or P100
    only; 8 cards: G2 only). So this keeps gpuspec10's typed tasks and types more of
    its untyped GPU tasks, drawn uniformly with ``seed``, until ``percent`` % are, each
    given the ``gpu_spec`` of a typed task of gpuspec10 of the same shape (card count,
    share or whole), drawn uniformly: the trace's own mix of constraints per shape."""
    tasks = load_tasks(TRACE / "openb_pod_list_gpuspec10.csv")

    def shape(t: Task) -> tuple[int, bool]:
        return (t.gpus, t.gpus == 1 and t.milli < 1000)

    specs: dict[tuple[int, bool], list[str]] = defaultdict(list)
    for t in tasks:
        if t.gpus > 0 and t.spec:
            specs[shape(t)].append(t.spec)
    gpu = [i for i, t in enumerate(tasks) if t.gpus > 0]
    untyped = [i for i in gpu if not tasks[i].spec]
    more = round(percent / 100 * len(gpu)) - (len(gpu) - len(untyped))
    if more < 0:
        raise SystemExit(f"gpuspec{percent}: gpuspec10 already types more of its GPU tasks")
    rng = random.Random(seed)
    for i in rng.sample(untyped, more):
        tasks[i] = replace(tasks[i], spec=rng.choice(specs[shape(tasks[i])]))
    return tasks


def pod_list(variant: str) -> tuple[str, list[Task]]:
    """A variant's name for the tables and its tasks: a public list, a path to a CSV, or
    ``gpuspec<N>`` derived here when the trace has no such file."""
    if variant.endswith(".csv"):
        return Path(variant).name, load_tasks(Path(variant))
    path = TRACE / f"openb_pod_list_{variant}.csv"
    derived = DERIVED.fullmatch(variant)
    if derived and not path.exists():
        percent = int(derived.group(1))
        return f"gpuspec10 with {percent} % of GPU tasks typed (seed {SPEC_SEED})", gpuspec_tasks(
            percent
        )
    return path.name, load_tasks(path)


def offered(tasks: list[Task], capacity: int, seed: int, share: float) -> list[Task]:
    """Tasks drawn with a fixed seed until their GPU demand reaches ``share`` of the
    cluster's GPUs (a lower ``share`` gives a prefix of the same stream)."""
    rng = random.Random(seed)
    out: list[Task] = []
    total = 0.0
    target = share * capacity - 1e-9
    while total < target:
        task = rng.choice(tasks)
        out.append(task)
        total += task.demand
    return out


def offered_paper(tasks: list[Task], capacity: int, seed: int, share: float) -> list[Task]:
    """The FGD artifact's draw (its simulator's ``TunePodsByNodeTotalResource`` with
    ``-tune 1.3`` and ``--shuffle-pod``): every task of the trace once, more drawn
    uniformly with replacement while the GPU demand stays within 130 % of the cluster's
    GPUs, the whole shuffled; then cut where the offered demand reaches ``share`` (a
    lower ``share`` gives a prefix of the same stream). Go's generator is not Python's,
    so the seeds are not the artifact's streams, only its method."""
    rng = random.Random(seed)
    pool = list(tasks)
    total = sum(t.demand for t in pool)
    while True:
        task = rng.choice(tasks)
        if total + task.demand > TUNE * capacity:
            break
        pool.append(task)
        total += task.demand
    pool.sort(key=lambda t: t.name)
    rng.shuffle(pool)
    out: list[Task] = []
    total = 0.0
    target = share * capacity - 1e-9
    for task in pool:
        if total >= target:
            break
        out.append(task)
        total += task.demand
    return out


def parse(task: Task, parser: RequestParser) -> tuple[PodRequest, PodSpec]:
    pod = task.pod()
    parsed = parser.parse(pod)
    assert isinstance(parsed, PodRequest), (task, parsed)
    return parsed, pod_spec(pod, managed=MANAGED)


def workload(tasks: list[Task], parsed: dict[str, tuple[PodRequest, PodSpec]]) -> Workload:
    """The task types FGD weighs: every task of the trace, as the paper takes them (its
    GPU shape, cpu, memory and GPU types; tasks with no GPU weigh nothing, see
    shared/core/policy.py)."""
    w = Workload()
    for t in tasks:
        if t.gpus <= 0:
            continue
        fraction = t.milli / 1000 if t.gpus == 1 and t.milli < 1000 else 1.0
        request, spec = parsed[t.name]
        c = request.constraints
        w.observe(
            Shape(
                t.gpus,
                shape_fraction(fraction, fraction, fraction >= 1.0),
                spec.requests.get("cpu", 0),
                spec.requests.get("memory", 0),
                c.use_types,
                c.nouse_types,
            )
        )
    return w


def place_random(
    placer: Placer, ref: PodRef, request: PodRequest, spec: PodSpec, rng: random.Random
) -> bool:
    """The random policy: nodes in random order, the first that fits (cpu, memory and
    devices, through the same filters as every other policy)."""
    ledger = placer.ledger
    ledger.observe(spec)
    prep = ledger.hosts.prepare(spec)
    if isinstance(prep, Status):
        return False
    nodes = list(ledger.nodes.values())
    rng.shuffle(nodes)
    ctx = placer._context(request, None)
    for node in nodes:
        if node.host.full:
            continue  # below the floors (Hosts.floors): this pod cannot fit either
        grants = placer.fit_node(node, request, ctx, prep)
        if isinstance(grants, tuple):
            ledger.grant(PodGrant(pod=ref, node=node.name, containers=grants, spec=spec))
            return True
    return False


@dataclass
class Mark:
    """The state of one replay as the offered demand crosses a checkpoint."""

    alloc_pct: float
    unallocated: float
    gpu_rejected: int
    cpu_rejected: int
    where: dict[str, float] = field(default_factory=dict)


def where_free(ledger: Ledger, stream: list[Task]) -> dict[str, float]:
    """Where the free GPU capacity is, in GPUs (each card's free share, as FGD counts
    it): whole idle cards and shares of partly used ones, each split by whether the
    node's free cpu and memory could still take the smallest GPU task offered
    ("host-starved" where they could not: no GPU task fits there, whatever the GPUs)."""
    gpu_tasks = [t for t in stream if t.gpus > 0]
    min_cpu = min(t.cpu_milli for t in gpu_tasks) if gpu_tasks else 0
    min_mem = min(t.memory_mib for t in gpu_tasks) * 2**20 if gpu_tasks else 0
    out = {"idle": 0.0, "idle_starved": 0.0, "partial": 0.0, "partial_starved": 0.0}
    for node in ledger.nodes.values():
        host = node.host
        spec = host.spec
        starved = False
        if spec is not None:
            alloc, used = spec.allocatable, host.requested
            starved = (
                alloc.get("cpu", 0) - used.get("cpu", 0) < min_cpu
                or alloc.get("memory", 0) - used.get("memory", 0) < min_mem
            )
        for d in node.devices:
            free = d.free_fraction()
            if free <= 1e-9:
                continue
            key = "idle" if free >= 1 - 1e-9 else "partial"
            out[key + ("_starved" if starved else "")] += free
    return {k: round(v, 1) for k, v in out.items()}


def replay(
    name: str,
    config: PlacementConfig | None,
    nodes: list[Node],
    stream: list[Task],
    parsed: dict[str, tuple[PodRequest, PodSpec]],
    shapes: Workload,
    seed: int,
    checkpoints: tuple[float, ...],
) -> dict[str, Any]:
    ledger = Ledger(SPECS)
    for node in nodes:
        ledger.set_node(node.name, node.devices)
        ledger.set_spec(node.spec)
    placer = Placer(ledger, config or PlacementConfig(), workload=shapes)
    capacity = ledger.device_count()
    rng = random.Random(seed)
    allocated = offered_so_far = 0.0
    gpu_rejected = cpu_rejected = 0
    marks = iter(checkpoints)
    mark = next(marks)
    at: dict[int, Mark] = {}

    def note(mark: float, offered: int) -> Mark:
        """The figures once ``offered`` tasks of the stream were offered."""
        return Mark(
            alloc_pct=round(allocated / capacity * 100, 2),
            unallocated=round(capacity - allocated, 1),
            gpu_rejected=gpu_rejected,
            cpu_rejected=cpu_rejected,
            where=where_free(ledger, stream[:offered]) if round(mark * 100) == 100 else {},
        )

    started = time.perf_counter()
    for i, task in enumerate(stream):
        ref = PodRef(namespace="openb", name=f"{task.name}-{i}", uid=PodUID(f"{i}"))
        request, spec = parsed[task.name]
        if config is None:
            placed = place_random(placer, ref, request, spec, rng)
        else:
            placed = isinstance(placer.place(ref, request, spec=spec, trial=True), Placement)
        offered_so_far += task.demand
        if placed:
            allocated += task.demand
        elif task.gpus > 0:
            gpu_rejected += 1
        else:
            cpu_rejected += 1
        while offered_so_far >= mark * capacity - 1e-9:
            at[round(mark * 100)] = note(mark, i + 1)
            mark = next(marks, math.inf)
    while mark < math.inf:  # the paper's stream ends just short of its last mark
        at[round(mark * 100)] = note(mark, len(stream))
        mark = next(marks, math.inf)
    return {
        "policy": name,
        "marks": at,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _pct(x: float) -> str:
    return f"{x:.2f}%"


def variant_table(results: list[dict[str, Any]], checkpoints: tuple[float, ...]) -> list[str]:
    pcts = [round(c * 100) for c in checkpoints]
    top = pcts[-1]
    ends = [100, top] if top != 100 else [100]
    best = next((r for r in results if r["policy"] == "best-fit"), None)
    head = ["policy", *(f"alloc @{p}%" for p in pcts)]
    for p in ends:
        head += [f"unalloc. GPUs @{p}%", "vs best-fit", f"GPU tasks rej. @{p}%", "CPU-only rej."]
    head.append("time")
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in results:
        m = r["marks"]
        row = [LABELS[r["policy"]], *(_pct(m[p].alloc_pct) for p in pcts)]
        for p in ends:
            ratio = "n/a"
            if best is not None and best["marks"][p].unallocated > 0:
                ratio = f"{m[p].unallocated / best['marks'][p].unallocated:.2f}x"
            row += [
                f"{m[p].unallocated:.1f}",
                ratio,
                str(m[p].gpu_rejected),
                str(m[p].cpu_rejected),
            ]
        row.append(f"{r['seconds']:.0f} s")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def where_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| policy | unalloc. GPUs @100% | idle cards | of which host-starved "
        "| free shares of partly used cards | of which host-starved |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        m = r["marks"][100]
        w = m.where
        lines.append(
            f"| {LABELS[r['policy']]} | {m.unallocated:.1f} "
            f"| {w['idle'] + w['idle_starved']:.1f} | {w['idle_starved']:.1f} "
            f"| {w['partial'] + w['partial_starved']:.1f} | {w['partial_starved']:.1f} |"
        )
    return lines


def summary_table(by_variant: dict[str, list[dict[str, Any]]], policies: list[str]) -> list[str]:
    head = ["variant", *(LABELS[p] for p in policies), "paper best-fit", "paper FGD"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for variant, results in by_variant.items():
        by = {r["policy"]: r for r in results}
        paper = PAPER.get(variant)
        row = [variant, *(_pct(by[p]["marks"][100].alloc_pct) for p in policies)]
        row += [_pct(paper[0]), _pct(paper[1])] if paper else ["", ""]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def mean_table(runs: dict[int, dict[str, list[dict[str, Any]]]], policies: list[str]) -> list[str]:
    """Allocation at 100 % per variant and policy: each seed's, then their mean."""
    seeds = list(runs)
    head = ["variant", "policy", *(f"seed {s}" for s in seeds), "mean", "paper"]
    lines = ["| " + " | ".join(head) + " |", "|---|---" + "|---:" * (len(head) - 2) + "|"]
    for variant in runs[seeds[0]]:
        paper = PAPER.get(variant)
        for p in policies:
            values = [
                next(r for r in runs[s][variant] if r["policy"] == p)["marks"][100].alloc_pct
                for s in seeds
            ]
            ref = ""
            if paper and p in ("best-fit", "FGD"):
                ref = _pct(paper[0] if p == "best-fit" else paper[1])
            row = [variant, LABELS[p], *(_pct(v) for v in values)]
            row += [_pct(sum(values) / len(values)), ref]
            lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        # The core's choice among equal nodes follows set order (Ledger.refile walks a set
        # of node names), which string hashing randomises per process: pin it, so a run
        # repeats exactly.
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=TRACE / "openb_node_list_gpu_node.csv")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated pod lists: openb_pod_list_<variant>.csv, or a path to a CSV",
    )
    parser.add_argument(
        "--max-demand", type=float, default=None, help="offered GPU demand to stop at (1.3)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds (instead of --seed): each replayed in turn, then a "
        "table of every seed's allocation at 100%% and their mean",
    )
    parser.add_argument(
        "--draw",
        choices=("iid", "paper"),
        default="paper",
        help="paper: the FGD artifact's stream, the whole trace plus draws to 130%% of the "
        "GPUs, shuffled (default); iid: every task drawn uniformly with replacement",
    )
    parser.add_argument(
        "--policies",
        default=None,
        help="comma-separated, of (all by default): " + ", ".join(POLICIES),
    )
    parser.add_argument(
        "--fgd-candidates",
        type=int,
        default=None,
        help="feasible nodes FGD compares (PlacementConfig.fgd_candidates; 0: every node)",
    )
    parser.add_argument(
        "--skip-cpu-only",
        action="store_true",
        help="drop the CPU-only tasks from the offered stream (the same GPU tasks, in the "
        "same order): to see what they cost; not the paper's method",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="best-fit, spread and Tessera default only, to 100%% (FGD and random take most "
        "of the full run)",
    )
    args = parser.parse_args()
    max_demand = args.max_demand or (1.0 if args.quick else 1.3)
    if args.policies is None:
        args.policies = QUICK if args.quick else ",".join(POLICIES)
    if max_demand < 1.0:
        raise SystemExit("--max-demand must be at least 1.0 (the 100% figures are the point)")
    if args.draw == "paper" and max_demand > TUNE:
        raise SystemExit(f"--draw paper offers at most {TUNE:.0%} of the GPUs")
    steps = [round(1.0 + k / 10, 2) for k in range(1, round((max_demand - 1.0) * 10) + 1)]
    checkpoints = tuple(
        sorted({*BASE_CHECKPOINTS, *(c for c in steps if c <= max_demand), max_demand})
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {list(POLICIES)}")
    configs = dict(POLICIES)
    if args.fgd_candidates is not None and configs["FGD"] is not None:
        configs["FGD"] = PlacementConfig(
            node_policy="fgd", device_policy="fgd", fgd_candidates=args.fgd_candidates
        )
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    nodes = load_nodes(args.nodes)
    capacity = sum(len(n.devices) for n in nodes)
    request_parser = RequestParser(SPECS)
    draw = offered_paper if args.draw == "paper" else offered
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    run_started = time.perf_counter()
    for seed in seeds:
        by_variant: dict[str, list[dict[str, Any]]] = {}
        for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
            source, tasks = pod_list(variant)
            stream = draw(tasks, capacity, seed, max_demand)
            gpu_offered = sum(1 for t in stream if t.gpus > 0)
            print(
                f"\n### {variant}: {source} on {args.nodes.name}\n\n"
                f"{len(nodes)} nodes, {capacity} GPUs. {len(stream)} tasks offered (seed "
                f"{seed}, {args.draw} draw) up to {max_demand * 100:.0f}% of the GPUs: "
                f"{gpu_offered} GPU tasks, {len(stream) - gpu_offered} CPU-only"
                f"{' (dropped: --skip-cpu-only)' if args.skip_cpu_only else ''}.\n",
                flush=True,
            )
            if args.skip_cpu_only:
                stream = [t for t in stream if t.gpus > 0]
            parsed = {t.name: parse(t, request_parser) for t in tasks}
            shapes = workload(tasks, parsed)
            results = []
            for name in policies:
                result = replay(
                    name, configs[name], nodes, stream, parsed, shapes, seed, checkpoints
                )
                summary = {
                    "variant": variant,
                    "seed": seed,
                    "policy": name,
                    **{f"{p}%": m.alloc_pct for p, m in result["marks"].items()},
                    "seconds": result["seconds"],
                }
                print(json.dumps(summary), flush=True)
                results.append(result)
            print()
            for line in variant_table(results, checkpoints):
                print(line)
            print(
                "\nWhere the unallocated GPUs are at 100% (GPUs; host-starved: the node's free "
                "cpu or memory is below the smallest GPU task offered):\n"
            )
            for line in where_table(results):
                print(line)
            by_variant[variant] = results
        print(
            "\n### Summary: GPU allocation at 100% offered demand "
            f"(seed {seed}; the paper's figures are its own simulator's, mean of 10 seeds)\n"
        )
        for line in summary_table(by_variant, policies):
            print(line)
        runs[seed] = by_variant
    if len(seeds) > 1:
        print(
            f"\n### Every seed: GPU allocation at 100% offered demand ({args.draw} draw; "
            "paper: its simulator's mean of 10 seeds)\n"
        )
        for line in mean_table(runs, policies):
            print(line)
    if args.quick:
        print(f"\nQuick mode: policies {', '.join(policies)}; offered demand to {max_demand:.0%}.")
    print(f"\nTotal wall time {time.perf_counter() - run_started:.0f} s.")


if __name__ == "__main__":
    main()
