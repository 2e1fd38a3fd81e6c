"""Allocator throughput with 1, 2 and 4 shards on one large simulated cluster.

    python bench/shards.py [--nodes 12500] [--pods 10000] [--shards 1,2,4]

The cluster (a real kube-apiserver and NATS on loopback; the node agent simulates the
nodes, 8 x A100-80GB each) is split into four groups of nodes by a ``quarter`` label and
two by a ``half`` label; 2 shards select by ``half``, 4 by ``quarter``, 1 is the
unsharded allocator. For each count, that many allocators start (``--shard``), rebuild
their ledgers, and then the gangs a coordinator would send (``gang.ready``, lone vGPU
pods of 20 GB and 30 % of the cores, each routed as the coordinator routes it: by a hash
of its name, over the shards) are published as fast as one process can; the run ends
when every pod has its decision (``allocation.decided``). No binder runs: the decisions
stay reservations, so a run must end inside the allocator's bind timeout (30 s: past
it, the reservations are checked against the API server, found unbound and released).

Printed per run: decisions per second (first publish to last decision), the ratio to
the 1-shard run, p50/p99 of publish-to-decision, and the CPU seconds each process used
during the run (allocators, nats-server, and this process, the publisher). On a machine
with fewer cores than allocators plus NATS, the shards share the cores: the ratio then
says how far the machine, not the design, lets them go (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
from core import vgpu_pod
from harness import connect as kube_connect
from harness import cpu_seconds, options, pct, registered, tessera

from shared import busauth
from shared import events as ev
from shared.bus import connect
from shared.config import NatsConfig
from shared.core.shards import Shard, Shards
from tools.cli import dev_config
from tools.localcluster import LocalCluster

A100 = {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 8}
GROUPS = 4


def inventory(nodes: int) -> list[dict[str, Any]]:
    """Four groups of simulated nodes, labelled by quarter and half."""
    per = nodes // GROUPS
    return [
        {
            "name": f"q{g}-{{i}}",
            "replicas": per,
            "labels": {"quarter": f"q{g}", "half": f"h{g // 2}"},
            "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110"},
            "devices": [{**A100, "numa": 2}],
        }
        for g in range(GROUPS)
    ]


def shard_list(count: int) -> list[dict[str, Any]]:
    """``scheduler.shards`` for ``count`` shards (1: none, the unsharded allocator)."""
    if count == 1:
        return []
    label = {2: "half", 4: "quarter"}[count]
    prefix = label[0]
    return [{"name": f"s{i}", "nodeSelector": {label: f"{prefix}{i}"}} for i in range(count)]


def gangs(pods: int, run: int, pools: Shards) -> list[ev.GangReady]:
    """Lone vGPU pods as the coordinator sends them, each to its first shard."""
    out = []
    for i in range(pods):
        ref, request = vgpu_pod(i, memory=20480, cores=30)
        ref = msgspec.structs.replace(ref, namespace=f"run-{run}", uid=f"r{run}-{ref.uid}")
        route = pools.route(f"{ref.namespace}/{ref.name}", [{}])
        pending = ev.PodPending(pod=ref, request=request, scheduler_name="tessera")
        out.append(
            ev.GangReady(
                gang=ev.GangRef(namespace=ref.namespace, name=ref.name, lone=True),
                min_member=1,
                members=(pending,),
                shard=route[0] if route else "",
                route=route[1:],
                offered=route,
            )
        )
    return out


def start_allocators(
    workdir: Path, cfg: Path, shards: list[dict[str, Any]]
) -> dict[str, subprocess.Popen[bytes]]:
    procs = {}
    for shard in [s["name"] for s in shards] or [""]:
        name = f"allocator-{shard or 'all'}"
        args = [sys.executable, "-m", "services.device_allocator", "--config", str(cfg)]
        args += ["--http-port", "0"] + (["--shard", shard] if shard else [])
        log = (workdir / f"{name}.log").open("wb")
        procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    return procs


def wait_rebuilt(workdir: Path, names: list[str], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = [(workdir / f"{n}.log").read_text(errors="replace") for n in names]
        if all("ledger rebuilt" in text for text in logs):
            return
        time.sleep(0.5)
    raise SystemExit(f"allocators not ready in {timeout_s:.0f}s: see {workdir}")


async def purge_reservations(cfg: NatsConfig) -> None:
    nc = await connect(cfg, busauth.ADMIN)
    try:
        js = nc.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.purge_stream(f"KV_{busauth.RESERVATION_BUCKET}")
    finally:
        await nc.close()


async def one_run(cfg: NatsConfig, batch: list[ev.GangReady]) -> dict[str, Any]:
    """Publish every gang, wait for every decision: the rate and latencies."""
    nc = await connect(cfg, busauth.ADMIN)
    sent: dict[str, float] = {}
    took: list[float] = []
    failed = 0
    done = asyncio.Event()
    expected = len(batch)

    async def on_decided(msg: Any) -> None:
        nonlocal failed
        event = ev.decode(msg.data)
        now = time.monotonic()
        if isinstance(event, ev.AllocationDecided):
            started = sent.get(event.pod.uid)
            if started is not None:
                took.append(now - started)
        elif isinstance(event, ev.AllocationFailed):
            failed += len(event.pods)
        if len(took) + failed >= expected:
            done.set()

    await nc.subscribe(f"{ev.SUBJECT_PREFIX}.allocation.>", cb=on_decided)
    js = nc.jetstream()
    first = time.monotonic()
    for start in range(0, expected, 500):
        chunk = batch[start : start + 500]
        now = time.monotonic()
        for g in chunk:
            sent[g.members[0].pod.uid] = now
        await asyncio.gather(*(js.publish(g.subject(), ev.encode(g)) for g in chunk))
    published = time.monotonic() - first
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout=120)
    last = time.monotonic()
    await nc.close()
    took.sort()
    return {
        "decided": len(took),
        "failed": failed,
        "publish_s": round(published, 2),
        "pods_per_s": round(len(took) / (last - first), 1) if took else 0.0,
        "p50_s": round(pct(took, 0.5), 3),
        "p99_s": round(pct(took, 0.99), 3),
    }


def main() -> None:
    args = options(__doc__, nodes=12500, pods=10000, shards="1,2,4")
    counts = [int(c) for c in args.shards.split(",")]
    print(f"cores: {os.cpu_count()}, nodes: {args.nodes} x 8 A100, pods per run: {args.pods}")
    workdir = Path(tempfile.mkdtemp(prefix="tessera-shards-"))
    results = []
    with (
        LocalCluster(workdir=workdir / "cluster") as cluster,
        tessera(
            workdir, cluster, args.nodes, inventory=inventory(args.nodes), first=("node-agent",)
        ),
    ):

        async def ready() -> None:
            api = await kube_connect(cluster)
            async with api:
                await registered(api, args.nodes, timeout_s=900)

        started = time.monotonic()
        asyncio.run(ready())
        print(f"{args.nodes} nodes registered in {time.monotonic() - started:.0f}s", flush=True)
        nats_cfg = cluster.nats_config()
        nats_pid = {p.name: p.popen.pid for p in cluster.procs if "nats" in p.name}
        for run, count in enumerate(counts):
            shards = shard_list(count)
            cfg = dev_config(
                workdir / f"tessera-{count}.yaml",
                cluster.nats_settings(),
                str(cluster.kubeconfig),
                # A long lease: on a small machine, allocators starting together
                # with NATS and the simulator can stall past a 2 s renewal.
                scheduler={"names": ["tessera"], "shards": shards, "leaderLeaseS": 15},
                kubernetes={"qps": 5000, "burst": 5000},
                telemetry={"logLevel": "INFO"},
            )
            asyncio.run(purge_reservations(nats_cfg))
            procs = start_allocators(workdir, cfg, shards)
            try:
                wait_rebuilt(workdir, list(procs))
                time.sleep(3)  # the consumers exist and are caught up
                pools = Shards(Shard(s["name"], s["nodeSelector"]) for s in shards)
                batch = gangs(args.pods, run, pools)
                pids = {n: p.pid for n, p in procs.items()} | nats_pid
                pids["publisher"] = os.getpid()
                before = cpu_seconds(pids)
                result = {"shards": count, **asyncio.run(one_run(nats_cfg, batch))}
                after = cpu_seconds(pids)
                result["cpu_s"] = {k: round(after[k] - before.get(k, 0.0), 1) for k in after}
            finally:
                for p in procs.values():
                    p.terminate()
                for p in procs.values():
                    p.wait(timeout=60)
            print(json.dumps(result), flush=True)
            results.append(result)
    base = next((r["pods_per_s"] for r in results if r["shards"] == 1), 0.0)
    print()
    print("| shards | decided | pods/s | vs 1 shard | p50 s | p99 s | CPU-s (per process) |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        ratio = f"{r['pods_per_s'] / base:.2f}x" if base else "-"
        cpu = ", ".join(f"{k} {v}" for k, v in sorted(r["cpu_s"].items()))
        print(
            f"| {r['shards']} | {r['decided']} | {r['pods_per_s']} | {ratio} | "
            f"{r['p50_s']} | {r['p99_s']} | {cpu} |"
        )


if __name__ == "__main__":
    main()
