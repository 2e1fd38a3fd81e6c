"""What the benchmarks share: their command lines; Tessera's services on simulated nodes, a
watch that notes when each pod is bound, and percentiles.

Times are on this process's monotonic clock: a pod's creation is when the API server
answered the create (``creationTimestamp`` has one-second resolution), its binding is
when the watch event showing ``spec.nodeName`` arrived here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared import kube
from shared.config import KubernetesConfig
from tools.cli import SERVICES, _ping, dev_config, spawn_services
from tools.localcluster import LocalCluster

A100 = {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 8}


def options(doc: str | None, **defaults: int | float | str) -> argparse.Namespace:
    """The command line of a benchmark: ``--name`` for each default (typed like it)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    for name, value in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    return parser.parse_args()


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each process has used so far (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


@dataclass
class Services:
    """Tessera's service processes of one benchmark, started in steps."""

    workdir: Path
    cluster: LocalCluster
    cfg: Path
    inventory: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    def start(self, names: Sequence[str] = tuple(SERVICES), cfg: Path | None = None) -> None:
        """Start those of ``names`` not running yet (with ``cfg``, else the benchmark's
        config); return once each answers a ping."""
        wanted = [n for n in names if n not in self.procs]
        started = spawn_services(self.workdir, cfg or self.cfg, self.inventory, only=wanted)
        self.procs.update(zip([n for n in SERVICES if n in wanted], started, strict=True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            hellos = asyncio.run(_ping(self.cluster.nats_config(), 0.5))
            if {h["service"] for h in hellos} >= set(self.procs):
                return

    def restart(self, name: str, scheduler: dict[str, Any]) -> None:
        """Stop service ``name`` and start it again with these ``scheduler:`` settings
        over the benchmark's config (a run that changes one setting)."""
        document = yaml.safe_load(self.cfg.read_text())
        document["scheduler"] = {**document.get("scheduler", {}), **scheduler}
        cfg = self.workdir / f"tessera-{name}.yaml"
        cfg.write_text(yaml.safe_dump(document))
        proc = self.procs.pop(name)
        proc.terminate()
        proc.wait(timeout=30)
        self.start([name], cfg)

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for name, p in self.procs.items():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:  # never left running into the next benchmark
                print(f"{name} did not stop within 30 s of SIGTERM: killed", file=sys.stderr)
                p.kill()
                p.wait()


@contextlib.contextmanager
def tessera(
    workdir: Path,
    cluster: LocalCluster,
    nodes: int,
    log_level: str = "WARNING",
    *,
    inventory: list[dict[str, Any]] | None = None,
    first: Sequence[str] = tuple(SERVICES),
) -> Iterator[Services]:
    """Run Tessera's services (the node agent simulating ``nodes`` nodes of 8 x
    A100-80GB) until the block ends: ``first`` at once, the others when the block calls
    ``start()``. ``inventory``, when given, is the simulated nodes' entries instead
    (services/node_agent/simulate.py: labels, taints, allocatable, devices per entry)."""
    cfg = dev_config(
        workdir / "tessera.yaml",
        cluster.nats_settings(),
        str(cluster.kubeconfig),
        scheduler={"names": ["tessera"]},
        kubernetes={"qps": 5000, "burst": 5000},
        telemetry={"logLevel": log_level},
    )
    if inventory is None:
        inventory = [{"name": "bench-{i}", "replicas": nodes, "devices": [{**A100, "numa": 2}]}]
    inventory_file = workdir / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump({"nodes": inventory}))
    services = Services(workdir, cluster, cfg, inventory_file)
    try:
        services.start(first)
        yield services
    finally:
        services.stop()


async def connect(cluster: LocalCluster) -> kube.Client:
    return await kube.connect(
        KubernetesConfig(kubeconfig=str(cluster.kubeconfig), qps=5000, burst=5000)
    )


async def wait_nodes(api: kube.Client, count: int, timeout_s: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        nodes, _ = await kube.list_all(api, "/api/v1/nodes")
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        await asyncio.sleep(0.5)


async def registered(api: kube.Client, count: int, timeout_s: float = 300) -> None:
    """Until ``count`` nodes are fully registered by the simulator (its status patch,
    with the Ready condition and the resources, is its last write to a Node)."""
    await wait_nodes(api, count, timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes, _ = await kube.list_all(api, "/api/v1/nodes")
        ready = [
            n
            for n in nodes
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in n.get("status", {}).get("conditions") or ()
            )
        ]
        if len(ready) >= count:
            return
        await asyncio.sleep(1.0)
    raise SystemExit(f"only {len(ready)}/{count} simulated nodes registered")


async def namespace(api: kube.Client, name: str) -> None:
    await kube.request(
        api,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )


@dataclass
class Binds:
    """Watches one namespace's pods and notes when each was first seen bound."""

    api: kube.Client
    namespace: str
    expected: int
    at: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def _on_pod(self, _kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if obj["spec"].get("nodeName") and name not in self.at:
            self.at[name] = time.monotonic()
            if len(self.at) >= self.expected:
                self.done.set()

    async def _relist(self, items: list[dict[str, Any]]) -> None:
        for obj in items:
            await self._on_pod("ADDED", obj)

    def start(self) -> None:
        self.task = asyncio.create_task(
            kube.list_watch(
                self.api,
                f"/api/v1/namespaces/{self.namespace}/pods",
                self._on_pod,
                on_relist=self._relist,
            )
        )

    async def wait(self, timeout_s: float, settle_s: float = 0.0) -> None:
        """Until every expected pod is bound, or ``timeout_s``; with ``settle_s``, also
        stop once no pod has been bound for that long (the rest cannot be)."""
        deadline = time.monotonic() + timeout_s
        while not self.done.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), timeout=1.0)
            last = max(self.at.values(), default=None)
            if settle_s and last is not None and time.monotonic() - last > settle_s:
                break
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def pct(values: Sequence[float], p: float) -> float:
    """The ``p`` quantile (nearest rank) of sorted ``values``; 0 when empty."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(p * len(values)))]
