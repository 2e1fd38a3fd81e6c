"""Consolidation on the openb trace: GPU allocation at 100 % offered demand with and
without moving shared-GPU pods, and the moves it took, side by side.

    python bench/consolidation.py [--variants default,gpushare40,gpuspec10,multigpu20]
                                  [--seed 1] [--max-moves 4] [--offer 0]

The stream is bench/packing.py's (the FGD artifact's draw, ``--draw paper``), offered
one task at a time up to 100 % of the cluster's GPUs, placed by Tessera's default
policy (binpack nodes, spread devices, the fragmentation guard). Both replays see the
same stream; in the second, a GPU task that fits nowhere is handed to the consolidation
planner (shared/core/consolidation.py ``plan``) with the shared-GPU tasks already placed
as the movable pods (every task of the trace stands for a pod a controller owns), at
most ``--max-moves`` moves; a plan found is applied at once (the moved tasks leave, the
task is placed, the moved tasks take the places reserved for them), as the services do
once the moved pods are recreated. ``--offer N`` offers only the N newest shared tasks
(the coordinator offers at most ``consolidation.MAX_MOVABLE``); 0: every one.

Printed per variant: allocation at 100 % without and with, the GPU tasks refused, the
moves and the GPU tasks placed (moves per placed GPU pod), the plans tried and found,
and seconds; then one summary table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.packing import (
    HASH_SEED,
    SPECS,
    TRACE,
    VARIANTS,
    Node,
    Task,
    load_nodes,
    load_tasks,
    offered_paper,
    parse,
    workload,
)
from shared.core import consolidation
from shared.core.hosts import PodSpec
from shared.core.ledger import Ledger, PodGrant, Statement
from shared.core.model import Movable, PodRef, PodRequest, PodUID
from shared.core.placement import GangMember, Placement, PlacementConfig, Placer
from shared.core.policy import Workload
from shared.core.request import RequestParser


def replay(
    nodes: list[Node],
    stream: list[Task],
    parsed: dict[str, tuple[PodRequest, PodSpec]],
    shapes: Workload,
    max_moves: int,
    offer: int,
) -> dict[str, Any]:
    """One replay to 100 %; ``max_moves`` 0: without consolidation."""
    ledger = Ledger(SPECS)
    for node in nodes:
        ledger.set_node(node.name, node.devices)
        ledger.set_spec(node.spec)
    placer = Placer(ledger, PlacementConfig(), workload=shapes)
    capacity = ledger.device_count()
    allocated = 0.0
    placed_gpu = refused = moves = tried = found = 0
    shared: dict[PodUID, Movable] = {}  # placed shared-GPU tasks, oldest first
    demand: dict[PodUID, float] = {}
    started = time.perf_counter()
    for i, task in enumerate(stream):
        ref = PodRef(namespace="openb", name=f"{task.name}-{i}", uid=PodUID(f"{i}"))
        request, spec = parsed[task.name]
        ok = isinstance(placer.place(ref, request, spec=spec, trial=True), Placement)
        if not ok and task.gpus > 0 and max_moves > 0 and shared:
            tried += 1
            offered = list(shared.values())[::-1]  # as the coordinator offers them:
            offered.sort(key=lambda m: demand[m.pod.uid])  # smallest, then newest first
            offered = offered[:offer] if offer else offered
            member = GangMember(pod=ref, request=request, spec=spec)
            plan = consolidation.plan(placer, [member], 1, offered, max_moves=max_moves, allowed={})
            if isinstance(plan, consolidation.Consolidation):
                found += 1
                moves += len(plan.moves)
                apply(ledger, plan)
                ok = True
        if ok:
            allocated += task.demand
            if task.gpus > 0:
                placed_gpu += 1
                if consolidation.fractional(request):
                    shared[ref.uid] = Movable(pod=ref, request=request, owner="openb")
                    demand[ref.uid] = task.demand
        elif task.gpus > 0:
            refused += 1
    return {
        "alloc_pct": round(allocated / capacity * 100, 2),
        "refused": refused,
        "placed_gpu": placed_gpu,
        "moves": moves,
        "tried": tried,
        "found": found,
        "seconds": round(time.perf_counter() - started, 1),
    }


def apply(ledger: Ledger, plan: consolidation.Consolidation) -> None:
    """What the services come to once the moved pods are recreated: they leave, the
    task takes its place, and each moved pod runs where its place was reserved (under
    its own name, so it may move again)."""
    with Statement(ledger) as st:
        for move in plan.moves:
            assert st.release(move.pod.pod.uid) is not None
        for p in plan.placements:
            assert st.grant(PodGrant(pod=p.pod, node=p.node, containers=p.grants))
        for move in plan.moves:
            spot = move.spot
            grant = PodGrant(
                pod=move.pod.pod, node=spot.node, containers=spot.containers, spec=spot.spec
            )
            assert st.grant(grant)
        st.commit()


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:  # as bench/packing.py: runs repeat
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=TRACE / "openb_node_list_gpu_node.csv")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-moves", type=int, default=4)
    parser.add_argument(
        "--offer",
        type=int,
        default=consolidation.MAX_MOVABLE,
        help="shared tasks offered, smallest then newest first (0: all)",
    )
    args = parser.parse_args()
    nodes = load_nodes(args.nodes)
    capacity = sum(len(n.devices) for n in nodes)
    request_parser = RequestParser(SPECS)
    rows = []
    run_started = time.perf_counter()
    for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
        tasks = load_tasks(TRACE / f"openb_pod_list_{variant}.csv")
        stream = offered_paper(tasks, capacity, args.seed, 1.0)
        parsed = {t.name: parse(t, request_parser) for t in tasks}
        shapes = workload(tasks, parsed)
        plain = replay(nodes, stream, parsed, shapes, 0, args.offer)
        moved = replay(nodes, stream, parsed, shapes, args.max_moves, args.offer)
        per = moved["moves"] / moved["placed_gpu"] if moved["placed_gpu"] else 0.0
        rows.append(
            f"| {variant} | {plain['alloc_pct']:.2f}% | {moved['alloc_pct']:.2f}% | "
            f"{moved['alloc_pct'] - plain['alloc_pct']:+.2f} | {plain['refused']} | "
            f"{moved['refused']} | {moved['found']}/{moved['tried']} | {moved['moves']} | "
            f"{moved['placed_gpu']} | {per:.4f} | {plain['seconds']} / {moved['seconds']} |"
        )
        print(variant, plain, moved, flush=True)
    offer = f"the {args.offer} smallest" if args.offer else "every placed shared task"
    print(
        f"\nGPU allocation at 100% offered demand, Tessera default policy, seed {args.seed}, "
        f"paper draw; consolidation with maxMoves {args.max_moves}, offering {offer}:\n"
    )
    print(
        "| variant | without | with | gain (points) | GPU tasks refused, without | with | "
        "plans found/tried | moves | GPU pods placed | moves per placed GPU pod | "
        "seconds without / with |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    print(f"\nTotal wall time {time.perf_counter() - run_started:.0f} s.")


if __name__ == "__main__":
    main()
