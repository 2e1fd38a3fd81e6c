"""Network-topology-aware gang placement against topology-blind, on one stream of gangs.

    python bench/topology.py [--nodes 4096] [--gangs 1200] [--seed 1] [--quick]

A simulated fabric: ``--nodes`` nodes of 8 whole GPUs each, in racks of 16 nodes
(tier-1 HyperNodes) and spines of 16 racks (tier 2), derived from the nodes' ``rack``
and ``spine`` labels as ``scheduler.networkTopologyLabels`` would
(shared/core/network.py ``from_labels``). A stream of ``--gangs`` gangs arrives, drawn
with the seed: 8 to 256 pods each (log-uniform), every pod of a gang asking the same 1,
2, 4 or 8 whole GPUs, at most a spine's GPUs per gang; arrivals are a Poisson stream
whose rate keeps about 80 % of the GPUs asked for over the run, and each gang holds its
GPUs for an exponential time, then leaves, so the fabric fragments. The stream is
replayed twice through the core, as the allocator drives it
(services/device_allocator/gangs.py): topology-blind (``Placer.place_gang``) and
topology-aware (``network.place_gang`` with ``networkTopology: {mode: soft}``: the
smallest domain that fits, else across domains, so both place the same gangs whenever
the cluster has room). A gang that does not fit at all is dropped (counted).

Figures, side by side: of the gangs whose pods fit in one rack's free GPUs when they
arrived, the share placed inside one rack; the same for spines; gangs placed and
dropped; the mean and p99 time of one gang's decision (the ``place_gang`` call,
counting free room per domain included). The first tenth of the stream warms the fabric
up and is not counted. ``--quick`` runs 512 nodes and 300 gangs (seconds).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.core import network
from shared.core.ledger import Ledger
from shared.core.model import DeviceInfo, DeviceUUID, NodeName, PodRef, PodUID
from shared.core.placement import GangMember, Placer
from shared.core.request import RequestParser
from shared.core.spec import DeviceSpecs

HASH_SEED = "0"
GPUS = 8
RACK = 16
SPINE = 16
LOAD = 0.8
MEAN_HOLD_S = 3600.0
WARM_UP = 0.1
SPECS = DeviceSpecs()
PARSER = RequestParser(SPECS)


@dataclass(frozen=True, slots=True)
class Gang:
    """One gang of the stream."""

    index: int
    pods: int
    gpus: int
    """Whole GPUs per pod."""
    arrives: float
    holds: float


@dataclass
class Outcome:
    """What one replay found."""

    decisions: list[float] = field(default_factory=list)
    rack_fit: int = 0
    rack_kept: int = 0
    spine_fit: int = 0
    spine_kept: int = 0
    placed: int = 0
    dropped: int = 0


def fabric_nodes(count: int) -> dict[NodeName, dict[str, str]]:
    """Each node's labels: its rack and spine."""
    return {
        NodeName(f"n{i:05d}"): {
            "rack": f"rack-{i // RACK}",
            "spine": f"spine-{i // (RACK * SPINE)}",
        }
        for i in range(count)
    }


def stream(count: int, nodes: int, seed: int) -> list[Gang]:
    """The gangs, drawn with ``seed``: sizes log-uniform in [8, 256], 1-8 GPUs per pod,
    no gang above one spine's GPUs, arrivals keeping ``LOAD`` of the GPUs asked for."""
    rnd = random.Random(seed)
    spine_gpus = min(nodes, RACK * SPINE) * GPUS
    gangs = []
    drawn = []
    for _ in range(count):
        pods = round(math.exp(rnd.uniform(math.log(8), math.log(256))))
        gpus = rnd.choice((1, 2, 4, 8))
        while pods * gpus > spine_gpus:
            gpus = max(gpus // 2, 1)
            if pods * gpus > spine_gpus:
                pods //= 2
        drawn.append((pods, gpus, rnd.expovariate(1 / MEAN_HOLD_S)))
    mean_work = sum(p * g * h for p, g, h in drawn) / count
    rate = LOAD * nodes * GPUS / mean_work  # gangs per second at the load asked
    now = 0.0
    for i, (pods, gpus, holds) in enumerate(drawn):
        now += rnd.expovariate(rate)
        gangs.append(Gang(i, pods, gpus, now, holds))
    return gangs


def ledger(labels: dict[NodeName, dict[str, str]]) -> Ledger:
    made = Ledger(SPECS)
    for name in labels:
        made.set_node(
            name,
            [
                DeviceInfo(
                    uuid=DeviceUUID(f"{name}-{i}"),
                    index=i,
                    vendor="nvidia",
                    model="NVIDIA-H100-80GB-HBM3",
                    memory_mib=81920,
                )
                for i in range(GPUS)
            ],
        )
    return made


def free_gpus(led: Ledger) -> dict[NodeName, int]:
    """Each node's whole GPUs free now."""
    return {
        name: sum(1 for d in node.devices if d.used_slots == 0 and d.usable)
        for name, node in led.nodes.items()
    }


def fits_in(free: dict[NodeName, int], domains: list[network.Domain], gang: Gang) -> bool:
    """Whether some domain's free GPUs hold every pod of ``gang``."""
    return any(sum(free[n] // gang.gpus for n in d.nodes) >= gang.pods for d in domains)


def replay(gangs: list[Gang], labels: dict[NodeName, dict[str, str]], aware: bool) -> Outcome:
    led = ledger(labels)
    placer = Placer(led)
    fabric = network.build(network.from_labels(["spine", "rack"], labels), labels)
    racks, spines = fabric.tiers[1], fabric.tiers.get(2, [])
    rack_of = {n: d.name for d in racks for n in d.nodes}
    spine_of = {n: d.name for d in spines for n in d.nodes}
    soft = network.NetworkTopology(mode="soft")
    requests = {
        g: PARSER.parse(
            {
                "metadata": {"name": "p"},
                "spec": {
                    "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": g}}}]
                },
            }
        )
        for g in (1, 2, 4, 8)
    }
    leaving: list[tuple[float, list[PodRef]]] = []
    out = Outcome()
    counted_from = int(len(gangs) * WARM_UP)
    for gang in gangs:
        while leaving and leaving[0][0] <= gang.arrives:
            _, pods = leaving.pop(0)
            for pod in pods:
                placer.release(pod)
        counted = gang.index >= counted_from
        if counted:
            free = free_gpus(led)
            in_rack = fits_in(free, racks, gang)
            in_spine = fits_in(free, spines, gang)
        request = requests[gang.gpus]
        assert not isinstance(request, network.Status)
        members = [
            GangMember(
                PodRef(namespace="b", name=f"g{gang.index}-{i}", uid=PodUID(f"g{gang.index}-{i}")),
                request,
            )
            for i in range(gang.pods)
        ]
        started = time.perf_counter()
        if aware:
            result = network.place_gang(placer, fabric, soft, members, gang.pods)
        else:
            result = placer.place_gang(members, gang.pods)
        took = time.perf_counter() - started
        if not result.ok:
            out.dropped += counted
            continue
        ends = gang.arrives + gang.holds
        at = next((i for i, (t, _) in enumerate(leaving) if t > ends), len(leaving))
        leaving.insert(at, (ends, [p.pod for p in result.placed]))
        if not counted:
            continue
        out.placed += 1
        out.decisions.append(took)
        if in_rack:
            out.rack_fit += 1
            out.rack_kept += len({rack_of[p.node] for p in result.placed}) == 1
        if in_spine:
            out.spine_fit += 1
            out.spine_kept += len({spine_of[p.node] for p in result.placed}) == 1
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def report(outcomes: dict[str, Outcome], nodes: int, gangs: int) -> list[str]:
    """The table, one line per figure, a column per mode."""
    names = list(outcomes)
    lines = [
        f"{nodes} nodes x {GPUS} GPUs, racks of {RACK} nodes, spines of {SPINE} racks; "
        f"{gangs} gangs of 8-256 pods (the first {int(gangs * WARM_UP)} warm up)",
        f"{'':44}" + "".join(f"{n:>20}" for n in names),
    ]

    def share(kept: int, fit: int) -> str:
        return f"{kept / fit:.1%} ({kept}/{fit})" if fit else "-"

    rows = [
        ("placed in one rack, of those one rack fit", lambda o: share(o.rack_kept, o.rack_fit)),
        ("placed in one spine, of those one spine fit", lambda o: share(o.spine_kept, o.spine_fit)),
        ("gangs placed / dropped (no room)", lambda o: f"{o.placed} / {o.dropped}"),
        (
            "decision per gang, mean (ms)",
            lambda o: f"{1000 * sum(o.decisions) / max(len(o.decisions), 1):.2f}",
        ),
        ("decision per gang, p99 (ms)", lambda o: f"{1000 * p99(o.decisions):.2f}"),
    ]
    for label, cell in rows:
        lines.append(f"{label:44}" + "".join(f"{cell(outcomes[n]):>20}" for n in names))
    return lines


def run(nodes: int, gangs: int, seed: int) -> dict[str, Outcome]:
    labels = fabric_nodes(nodes)
    drawn = stream(gangs, nodes, seed)
    return {
        "topology-blind": replay(drawn, labels, aware=False),
        "topology-aware": replay(drawn, labels, aware=True),
    }


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=None, help="nodes of 8 GPUs (4096)")
    parser.add_argument("--gangs", type=int, default=None, help="gangs in the stream (1200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="512 nodes, 300 gangs")
    args = parser.parse_args()
    nodes = args.nodes or (512 if args.quick else 4096)
    gangs = args.gangs or (300 if args.quick else 1200)
    started = time.monotonic()
    for line in report(run(nodes, gangs, args.seed), nodes, gangs):
        print(line)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
