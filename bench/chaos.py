"""Chaos: a burst of mixed pods while every service, NATS and the API server fail.

    python bench/chaos.py [--pods 2000] [--nodes 100] [--seed 1] [--nats-servers 3]

Starts etcd + kube-apiserver and ``--nats-servers`` NATS servers (a JetStream cluster,
stream and buckets kept on each, TLS and one user per service: tools/localcluster.py),
then TWO replicas of each central service (watcher, gang-coordinator, device-allocator,
binder, job-controller; one active per service, holding its lease in the
``tessera-leases`` KV bucket: shared/bus.py ``Lease``, shared/runtime.py ``serve``) and
one node agent simulating ``--nodes`` nodes of 8 x A100-80GB. Each process is kept
running like the kubelet would (tests/integration/pipeline.py does the same for tests):
one that exits is started again after 0.5 s.

The burst: ``--pods`` pods, about 60 % vGPU slices (``nvidia.com/gpumem`` and
``gpucores``), 20 % whole GPUs (``nvidia.com/gpu`` 1 or 2), 20 % in gangs of 4-8 (half
PodGroups with ``minMember`` = size, half Volcano Jobs with ``minAvailable`` = replicas,
whose pods the job-controller creates), a few invalid (memory over any card) or
impossible (12 GPUs) on purpose; each with small cpu/memory requests. Pods arrive over
the whole fault schedule (the pace adapts so the burst outlasts the faults), and some
bound lone pods are deleted meanwhile (``--churn``: jobs that finish).

Faults, one at a time in a seeded random order and at random moments (``--min-gap``
apart at least, the next only once the previous one recovered or ``--fault-cap`` passed):
SIGKILL of the ACTIVE replica (the lease holder, mapped to its process by the pid in its
identity) of each central service twice; one NATS server SIGKILLed and started again
after 1 s (same port, JetStream on disk); the API server SIGKILLed and started again;
and with 3 NATS servers one other server SIGKILLed for good (after the restart, so the
bus is never below quorum for longer than a restart).

Recovery per fault, on this process's clock, with binds seen through a watch of the
API server: ``lease`` until the standby holds the lease (service kills), ``any bind``
until the first bind after the fault, and ``recovery``: until the first bind of a pod
created after the fault (for a job-controller kill: of a pod of a Job created after it),
i.e. the whole path works again. A pod in flight when the watcher dies is still bound,
so the first bind alone would flatter a watcher kill. For a NATS fault also ``JetStream
leaders``: until JetStream answers again for its meta group, every stream and bucket and
every durable consumer (each has a leader; the services can do nothing before), and the
5 s target is held
against the recovery counted from then (both are printed).

Then, once nothing changed for ``--settle`` seconds, the audit, from the API server:
every pod bound or Pending with a reason (``PodScheduled=False`` or a
``FailedScheduling`` Event), none vanished; per device (the simulated inventory,
services/node_agent/simulate.py ``expand``) the granted memory, cores and slices within
the card and ``deviceSplitCount`` (shared/core/spec.py), an exclusive grant alone; every
grant on its pod's node and signed; no grant on an unbound pod and no reservation
(``tessera-reservations``) without its pod; no pod bound twice (its ``nodeName`` never
changed in the watch, no two ``Scheduled`` Events naming different nodes); PodGroups
and Jobs all-or-nothing, every Job with all its pods. Exits 1 when any of these fails,
and when a service process exited without the benchmark causing it (neither SIGKILLed
as a fault nor stopped at the end: each is listed with its cause). Each fault's recovery
is printed next to the target it is held against (``TARGET_RECOVERY_S``) and whether it
met it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import itertools
import json
import logging
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import yaml
from harness import A100, connect, namespace, wait_nodes
from kubernetes_asyncio.client import ApiException

from services.node_agent.simulate import expand, load_inventory
from shared import busauth, kube
from shared import config as config_module
from shared.bus import connect as bus_connect
from shared.core import annotations as ann
from shared.core.request import GROUP_NAME
from tools.cli import SERVICES, _ping, dev_config
from tools.localcluster import LocalCluster

REPO = Path(__file__).resolve().parent.parent
NS = "chaos"
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
BATCH = "/apis/batch.volcano.sh/v1alpha1"
JOB_LABEL = "volcano.sh/job-name"  # services/job_controller/podview.py JOB_NAME
CENTRAL = ("watcher", "gang-coordinator", "device-allocator", "binder", "job-controller")
LEASE_S = 2.0
"""``scheduler.leaderLeaseS``, the default: a holder the bus does not answer pauses and
resumes instead of exiting (shared/bus.py ``Lease``), so no longer lease is needed to
ride out a JetStream election."""
TARGET_RECOVERY_S = 5.0

# --- the workload ----------------------------------------------------------------------

VGPU_MEM = (2048, 4096, 8192, 12288, 16384)
VGPU_CORES = (5, 10, 15, 20, 25)
CPUS = ("100m", "250m", "500m")
MEMS = ("256Mi", "512Mi", "1Gi")
GANG_SHAPES = (
    {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192, "nvidia.com/gpucores": 10},
    {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480, "nvidia.com/gpucores": 25},
    {"nvidia.com/gpu": 1},
)


@dataclass
class Item:
    """One arrival: a lone pod, a PodGroup with its pods, or a Volcano Job."""

    kind: str  # vgpu | whole | invalid | impossible | gang | job
    name: str
    limits: dict[str, int]
    requests: dict[str, str]
    size: int = 1

    def pods(self) -> list[str]:
        if self.kind == "gang":
            return [f"{self.name}-{i}" for i in range(self.size)]
        if self.kind == "job":
            return [f"{self.name}-worker-{i}" for i in range(self.size)]
        return [self.name]


def workload(pods: int, rng: random.Random) -> list[Item]:
    """About 60 % vGPU, 20 % whole GPUs, 20 % gang members, 1 % invalid, 1 % impossible."""
    items: list[Item] = []

    def req() -> dict[str, str]:
        return {"cpu": rng.choice(CPUS), "memory": rng.choice(MEMS)}

    gang_pods = 0
    g = 0
    while gang_pods < pods * 0.2:
        size = rng.randint(4, 8)
        kind = "gang" if g % 2 == 0 else "job"
        name = f"{'g' if kind == 'gang' else 'j'}-{g:04d}"
        items.append(Item(kind, name, dict(rng.choice(GANG_SHAPES)), req(), size))
        gang_pods += size
        g += 1
    lone = pods - gang_pods
    special = max(2, pods // 100)
    whole = round((lone - 2 * special) * 0.25)
    for i in range(lone):
        name = f"p-{i:05d}"
        if i < special:
            items.append(
                Item("invalid", name, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100000}, req())
            )
        elif i < 2 * special:
            items.append(Item("impossible", name, {"nvidia.com/gpu": 12}, req()))
        elif i < 2 * special + whole:
            count = 1 if rng.random() < 0.85 else 2
            items.append(Item("whole", name, {"nvidia.com/gpu": count}, req()))
        else:
            limits = {
                "nvidia.com/gpu": 1,
                "nvidia.com/gpumem": rng.choice(VGPU_MEM),
                "nvidia.com/gpucores": rng.choice(VGPU_CORES),
            }
            items.append(Item("vgpu", name, limits, req()))
    rng.shuffle(items)
    return items


def gpu_share(limits: dict[str, int], split: int) -> float:
    """GPUs' worth one pod takes (a slice: its largest fraction of memory, cores, slots)."""
    mem = limits.get("nvidia.com/gpumem")
    if mem is None:
        return float(limits.get("nvidia.com/gpu", 0))
    return max(mem / A100["memory"], limits.get("nvidia.com/gpucores", 0) / 100, 1 / split)


def pod_body(
    name: str, limits: dict[str, int], requests: dict[str, str], group: str = ""
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {GROUP_NAME: group} if group else {}},
        "spec": {
            "schedulerName": "tessera",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": requests, "limits": limits},
                }
            ],
        },
    }


def job_body(item: Item) -> dict[str, Any]:
    """A Volcano Job as tests/integration/test_batch.py writes one (one task)."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": item.name},
        "spec": {
            "minAvailable": item.size,
            "schedulerName": "tessera",
            "queue": "default",
            "tasks": [
                {
                    "replicas": item.size,
                    "name": "worker",
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "worker",
                                    "image": "pytorch/pytorch",
                                    "resources": {"requests": item.requests, "limits": item.limits},
                                }
                            ],
                            "restartPolicy": "OnFailure",
                        }
                    },
                }
            ],
        },
    }


# --- the fault plan --------------------------------------------------------------------


@dataclass
class Fault:
    kind: str  # kill | nats-restart | nats-lose | apiserver-restart
    target: str  # a service name, or a NATS server index
    at: float = 0.0
    lease_s: float | None = None
    server_back_s: float | None = None
    leaders_s: float | None = None
    """NATS faults: until JetStream answers for every stream and bucket again (each has
    a leader): what the services' recovery is held against."""
    any_bind_s: float | None = None
    recovery_s: float | None = None
    recovery_note: str = ""
    detail: str = ""
    wall: str = ""
    stall_s: float = 0.0
    stall_at: float = 0.0

    def worst_s(self) -> float | None:
        """What the recovery target is held against: the first bind of a new pod, or a
        longer stall after it; for a NATS fault, counted from JetStream having its
        leaders again (the services cannot act before)."""
        if self.recovery_s is None:
            return None
        worst = max(self.recovery_s, self.stall_s)
        if self.kind.startswith("nats-") and self.leaders_s is not None:
            return max(0.0, worst - self.leaders_s)
        return worst

    def met(self) -> bool:
        """Whether its recovery met :data:`TARGET_RECOVERY_S` (one not measured did not)."""
        worst = self.worst_s()
        return worst is not None and worst <= TARGET_RECOVERY_S

    def label(self) -> str:
        if self.kind == "kill":
            return f"SIGKILL active {self.target}"
        if self.kind == "nats-restart":
            return f"restart nats-server-{self.target}"
        if self.kind == "nats-lose":
            return f"lose nats-server-{self.target} for good"
        return "restart kube-apiserver"


def fault_plan(rng: random.Random, nats_servers: int) -> list[Fault]:
    plan = [Fault("kill", s) for s in CENTRAL for _ in range(2)]
    servers = list(range(nats_servers))
    rng.shuffle(servers)
    plan.append(Fault("nats-restart", str(servers[0])))
    plan.append(Fault("apiserver-restart", ""))
    if nats_servers >= 3:
        plan.append(Fault("nats-lose", str(servers[1])))
    rng.shuffle(plan)
    kinds = [f.kind for f in plan]
    if "nats-lose" in kinds and kinds.index("nats-lose") < kinds.index("nats-restart"):
        i, j = kinds.index("nats-lose"), kinds.index("nats-restart")
        plan[i], plan[j] = plan[j], plan[i]
    return plan


# --- the clock -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.t0_wall = time.time()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def wall(self, t: float) -> str:
        """Clock time ``t`` as the services' logs write it (shared/telemetry.py)."""
        return dt.datetime.fromtimestamp(self.t0_wall + t).strftime("%H:%M:%S,%f")[:-3]


# --- the services, kept running --------------------------------------------------------


@dataclass
class Exit:
    replica: str
    pid: int
    code: int | None
    at: float
    killed: bool
    at_stop: bool = False


@dataclass
class Replica:
    service: str
    index: int
    log: Path
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    killed: set[int] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}" if self.service != "node-agent" else "node-agent"


class Supervisor:
    """Every service process; one that exits is started again after 0.5 s, as the
    kubelet would (tests/integration/pipeline.py ``Pipeline._keep``)."""

    def __init__(self, workdir: Path, config: Path, inventory: Path, clock: Clock) -> None:
        self.workdir = workdir
        self.config = config
        self.inventory = inventory
        self.clock = clock
        self.replicas: list[Replica] = []
        self.keepers: list[asyncio.Task[None]] = []
        self.exits: list[Exit] = []
        self.stopping = False

    async def start(self, service: str, index: int) -> None:
        rep = Replica(service, index, self.workdir / "logs" / f"{service}-{index}.log")
        if service == "node-agent":
            rep.log = self.workdir / "logs" / "node-agent.log"
        rep.log.parent.mkdir(parents=True, exist_ok=True)
        self.replicas.append(rep)
        await self._spawn(rep)
        self.keepers.append(asyncio.create_task(self._keep(rep), name=f"keep:{rep.name}"))

    async def _spawn(self, rep: Replica) -> None:
        args = [sys.executable, "-m", SERVICES[rep.service], "--config", str(self.config)]
        args.append("--http-port=0")  # many services on one host: no health port
        if rep.service == "node-agent":
            args += ["--simulate", str(self.inventory)]
        with rep.log.open("ab") as out:
            rep.proc = await asyncio.create_subprocess_exec(
                *args, stdout=out, stderr=asyncio.subprocess.STDOUT, cwd=REPO
            )
            out.write(
                f"=== chaos: {rep.name} started as pid {rep.proc.pid} "
                f"at t={self.clock.now():.2f}s\n".encode()
            )
        rep.started_at = self.clock.now()

    async def _keep(self, rep: Replica) -> None:
        while True:
            assert rep.proc is not None
            code = await rep.proc.wait()
            pid = rep.proc.pid
            self.exits.append(
                Exit(rep.name, pid, code, self.clock.now(), pid in rep.killed, self.stopping)
            )
            with rep.log.open("ab") as out:
                now = self.clock.now()
                out.write(f"=== chaos: pid {pid} exited with {code} at t={now:.2f}s\n".encode())
            if self.stopping:
                return
            await asyncio.sleep(0.5)
            if self.stopping:
                return
            await self._spawn(rep)

    def by_pid(self, pid: int) -> Replica | None:
        return next((r for r in self.replicas if r.proc is not None and r.proc.pid == pid), None)

    def kill(self, rep: Replica) -> None:
        assert rep.proc is not None
        rep.killed.add(rep.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            rep.proc.send_signal(signal.SIGKILL)

    def pids(self) -> list[int]:
        return [
            r.proc.pid for r in self.replicas if r.proc is not None and r.proc.returncode is None
        ]

    async def stop(self) -> None:
        self.stopping = True
        for rep in self.replicas:
            if rep.proc is not None and rep.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    rep.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for rep in self.replicas:
            if rep.proc is None:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rep.proc.wait(), max(0.1, deadline - time.monotonic()))
            if rep.proc.returncode is None:
                where = await dump_stack(
                    rep.proc.pid,
                    self.workdir / "logs" / "stacks.txt",
                    f"{rep.name} ignored SIGTERM",
                )
                print(
                    f"chaos: {rep.name} pid {rep.proc.pid} still running 15 s after SIGTERM: "
                    f"SIGKILL ({where})",
                    flush=True,
                )
                with contextlib.suppress(ProcessLookupError):
                    rep.proc.send_signal(signal.SIGKILL)
                await rep.proc.wait()
        for task in self.keepers:
            task.cancel()
        await asyncio.gather(*self.keepers, return_exceptions=True)


PYSPY = os.environ.get("CHAOS_PYSPY") or shutil.which("py-spy") or ""
"""py-spy, when installed, shows where a stuck service waits (``CHAOS_PYSPY``: its path)."""


async def dump_stack(pid: int, out: Path, why: str) -> str:
    """Append where process ``pid`` waits (``py-spy dump``) to ``out``; what was done."""
    if not PYSPY:
        return "install py-spy or set CHAOS_PYSPY to see where it waits"
    proc = await asyncio.create_subprocess_exec(
        PYSPY,
        "dump",
        "--pid",
        str(pid),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        data, _ = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return "py-spy timed out"
    with out.open("a") as f:
        f.write(f"=== {why}: pid {pid}\n{data.decode(errors='replace')}\n")
    return f"its stack in {out}"


# --- the bus as admin: leases, inventories, reservations --------------------------------


class BusView:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cfg = cluster.nats_config()
        self.nc: Any = None

    async def open(self) -> None:
        self.nc = await bus_connect(self.cfg, busauth.ADMIN)

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5)

    async def jetstream_assets(self) -> dict[str, list[str]]:
        """Every stream (the events, each KV bucket) and its durable consumers (each
        service's, each node's), read while the bus is whole: what ``leaders_back``
        asks for after a fault (listing them then is slow, the list waiting on a lost
        server's answer)."""
        js = self.nc.jetstream()
        out: dict[str, list[str]] = {}
        for info in await js.streams_info():
            name = info.config.name
            consumers = await js.consumers_info(name)
            out[name] = [c.name for c in consumers if c.config.durable_name]
        return out

    async def leaders_back(
        self, fault: Fault, clock: Clock, assets: dict[str, list[str]], cap_s: float = 30.0
    ) -> None:
        """Set ``fault.leaders_s`` once JetStream answers again for every stream and
        durable consumer of ``assets``: each has a leader, which answers for it. Polled
        every 0.1 s from the fault on."""
        js = self.nc.jetstream()
        missing = ""

        async def led(what: str, ask: Any) -> None:
            try:
                info = await asyncio.wait_for(ask, 1.5)
            except Exception as exc:
                raise RuntimeError(f"{what}: {exc!r}") from None
            if info.cluster is not None and not info.cluster.leader:
                raise RuntimeError(f"{what}: no leader")

        while clock.now() - fault.at < cap_s:
            try:
                await asyncio.gather(
                    *(led(stream, js.stream_info(stream)) for stream in assets),
                    *(
                        led(f"{stream}/{c}", js.consumer_info(stream, c))
                        for stream, consumers in assets.items()
                        for c in consumers
                    ),
                )
                fault.leaders_s = clock.now() - fault.at
                return
            except Exception as exc:
                missing = str(exc)
                await asyncio.sleep(0.1)
        fault.detail += f"; JetStream leaders not all back within {cap_s:.0f}s ({missing})"

    async def _entries(self, bucket: str, keys: list[str] | None = None) -> dict[str, bytes]:
        js = self.nc.jetstream()
        kv = await js.key_value(bucket)
        if keys is None:
            try:
                keys = list(await kv.keys())
            except Exception:  # nats.js.errors.NoKeysError: empty
                keys = []
        out = {}
        for key in keys:
            with contextlib.suppress(Exception):  # deleted or expired meanwhile
                entry = await kv.get(key)
                if entry.value:
                    out[key] = entry.value
        return out

    async def holder(self, service: str) -> str | None:
        """The identity holding ``service``'s lease (``hostname-pid``), None when none or
        the bus does not answer within 2 s."""
        try:
            found = await asyncio.wait_for(self._entries(busauth.LEASE_BUCKET, [service]), 2)
        except Exception:
            return None
        value = found.get(service)
        return value.decode() if value else None

    async def keys(self, bucket: str) -> int:
        try:
            return len(await asyncio.wait_for(self._entries(bucket), 20))
        except Exception:
            return 0

    async def reservations(self) -> dict[str, Any]:
        found = await asyncio.wait_for(self._entries(busauth.RESERVATION_BUCKET), 30)
        return {k: msgspec.json.decode(v) for k, v in found.items()}


def pid_of(identity: str) -> int | None:
    """The pid in a replica's identity, ``<hostname>-<pid>`` (shared/runtime.py Runtime)."""
    host, _, pid = identity.rpartition("-")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return int(pid)


# --- the pods, as the API server shows them ---------------------------------------------


@dataclass
class PodSeen:
    name: str
    kind: str
    created_at: float | None = None  # when its create (or its Job's) was sent
    uid: str = ""
    node: str = ""
    bound_at: float | None = None
    reason_at: float | None = None
    deleted: bool = False
    uids: set[str] = field(default_factory=set)


class Pods:
    """A watch of the namespace's pods: first bind of each, reasons, node changes."""

    def __init__(self, api: kube.Client, clock: Clock) -> None:
        self.api = api
        self.clock = clock
        self.pods: dict[str, PodSeen] = {}
        self.binds: list[tuple[float, str]] = []
        self.node_of: dict[str, str] = {}
        self.rebound: list[str] = []
        self.last_change = 0.0
        self.watch_errors: Counter[str] = Counter()
        self.job_created: dict[str, float] = {}
        self.bind_signal = asyncio.Event()

    def expect(self, name: str, kind: str, created_at: float) -> None:
        seen = self.pods.setdefault(name, PodSeen(name, kind))
        seen.kind, seen.created_at = kind, created_at

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name, uid = meta["name"], meta["uid"]
        seen = self.pods.get(name)
        if seen is None:
            job = (meta.get("labels") or {}).get(JOB_LABEL)
            seen = self.pods[name] = PodSeen(name, "job" if job else "other")
            if job:
                seen.created_at = self.job_created.get(job)
        seen.uids.add(uid)
        if kind == "DELETED":
            if seen.uid == uid:
                seen.deleted = True
            return
        if seen.uid != uid:  # a new pod of this name (a Job's pod made again)
            seen.uid, seen.deleted, seen.node = uid, False, ""
        now = self.clock.now()
        node = (obj.get("spec") or {}).get("nodeName") or ""
        if node:
            first = self.node_of.setdefault(uid, node)
            if first != node:
                self.rebound.append(f"{name} ({uid}): {first} then {node}")
            if not seen.node:
                seen.node = node
                if seen.bound_at is None:
                    seen.bound_at = now
                self.binds.append((now, name))
                self.last_change = now
                self.bind_signal.set()
        elif seen.reason_at is None and has_reason_condition(obj):
            seen.reason_at = now
            self.last_change = now

    async def watch(self) -> None:
        path = f"/api/v1/namespaces/{NS}/pods"
        version = ""
        while True:
            try:
                if not version:
                    items, version = await kube.list_all(self.api, path)
                    for obj in items:
                        self.on_event("ADDED", obj)
                params = {
                    "watch": "1",
                    "allowWatchBookmarks": "true",
                    "resourceVersion": version,
                    "timeoutSeconds": "120",
                }
                async with self.api.pool.stream(
                    "GET", self.api.pool.target(path, params), await self.api.headers(), 150
                ) as response:
                    if response.status == 410:
                        version = ""
                        continue
                    if response.status != 200:
                        raise ApiException(status=response.status, reason=response.reason)
                    buffer = bytearray()
                    async for chunk in response.chunks():
                        buffer += chunk
                        while (end := buffer.find(b"\n")) >= 0:
                            line = bytes(buffer[:end])
                            del buffer[: end + 1]
                            if not line.strip():
                                continue
                            event = msgspec.json.decode(line)
                            obj = event["object"]
                            if event["type"] == "ERROR":
                                if obj.get("code") == 410:
                                    version = ""
                                    raise kube.GoneError(path)
                                raise ApiException(
                                    status=obj.get("code"), reason=obj.get("message")
                                )
                            version = obj.get("metadata", {}).get("resourceVersion", version)
                            if event["type"] != "BOOKMARK":
                                self.on_event(event["type"], obj)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server restarting: watch again at once
                self.watch_errors[type(exc).__name__] += 1
                await asyncio.sleep(0.2)

    def first_bind(self, after: float, pred: Callable[[PodSeen], bool]) -> float | None:
        for t, name in self.binds:
            if t > after and pred(self.pods[name]):
                return t
        return None

    async def wait_bind(
        self, after: float, pred: Callable[[PodSeen], bool], cap_s: float
    ) -> float | None:
        deadline = self.clock.now() + cap_s
        while (t := self.first_bind(after, pred)) is None and self.clock.now() < deadline:
            self.bind_signal.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.bind_signal.wait(), 0.2)
        return t


def has_reason_condition(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason")
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


# --- creating the burst -----------------------------------------------------------------


RETRYABLE_GIVE_UP_S = 120.0


async def write(api: kube.Client, path: str, body: dict[str, Any], method: str = "POST") -> Any:
    """One write, retried while the API server restarts; a 409 on a create means an
    earlier try went through."""
    deadline = time.monotonic() + RETRYABLE_GIVE_UP_S
    while True:
        try:
            return await asyncio.wait_for(kube.request(api, method, path, body), 20)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status == 409 and method == "POST":
                return None
            if exc.status in (400, 422) or time.monotonic() > deadline:
                raise
        except (TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.25)


class Creator:
    """Sends the items at a pace that keeps arrivals going until the faults are done."""

    def __init__(self, api: kube.Client, pods: Pods, items: list[Item], clock: Clock) -> None:
        self.api = api
        self.pods = pods
        self.items = list(items)
        self.clock = clock
        self.created = 0
        self.failed: list[str] = []
        self.done = asyncio.Event()
        self.slots = asyncio.Semaphore(16)
        self.tasks: set[asyncio.Task[None]] = set()
        self.total = sum(i.size for i in items)
        self.urgent: asyncio.Queue[Item] = asyncio.Queue()
        self.lone_created: list[str] = []

    def pull_job(self) -> Item | None:
        """Send the next Volcano Job now (after a job-controller kill)."""
        for i, item in enumerate(self.items):
            if item.kind == "job":
                del self.items[i]
                self.urgent.put_nowait(item)
                return item
        return None

    async def create(self, item: Item) -> None:
        async with self.slots:
            t = self.clock.now()
            try:
                if item.kind == "job":
                    self.pods.job_created[item.name] = t
                    for name in item.pods():
                        self.pods.expect(name, "job", t)
                    await write(self.api, f"{BATCH}/namespaces/{NS}/jobs", job_body(item))
                elif item.kind == "gang":
                    for name in item.pods():
                        self.pods.expect(name, "gang", t)
                    await write(
                        self.api,
                        f"{VOLCANO}/namespaces/{NS}/podgroups",
                        {
                            "apiVersion": "scheduling.volcano.sh/v1beta1",
                            "kind": "PodGroup",
                            "metadata": {"name": item.name},
                            "spec": {"minMember": item.size, "queue": "default"},
                        },
                    )
                    await asyncio.gather(
                        *(
                            write(
                                self.api,
                                f"/api/v1/namespaces/{NS}/pods",
                                pod_body(name, item.limits, item.requests, item.name),
                            )
                            for name in item.pods()
                        )
                    )
                else:
                    self.pods.expect(item.name, item.kind, t)
                    await write(
                        self.api,
                        f"/api/v1/namespaces/{NS}/pods",
                        pod_body(item.name, item.limits, item.requests),
                    )
                    if item.kind in ("vgpu", "whole"):
                        self.lone_created.append(item.name)
            except Exception as exc:
                self.failed.append(f"{item.name}: {type(exc).__name__} {exc}")
            self.created += item.size

    def _spawn(self, item: Item) -> None:
        task = asyncio.create_task(self.create(item))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self, faults_left: Callable[[], float]) -> None:
        """``faults_left``: seconds the remaining faults are expected to take."""
        sent = 0
        while self.items or not self.urgent.empty():
            while not self.urgent.empty():
                item = self.urgent.get_nowait()
                sent += item.size
                self._spawn(item)
            if not self.items:
                break
            left = self.total - sent
            rate = min(40.0, max(4.0, left / max(faults_left() + 10.0, 5.0)))
            item = self.items.pop(0)
            sent += item.size
            self._spawn(item)
            await asyncio.sleep(item.size / rate)
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        self.done.set()


async def churn(
    api: kube.Client, pods: Pods, creator: Creator, fraction: float, rng: random.Random
) -> list[str]:
    """Delete bound lone pods (jobs that finished) as the burst goes: ``fraction`` of them."""
    deleted: list[str] = []
    while not creator.done.is_set():
        await asyncio.sleep(1.0)
        wanted = int(fraction * len(creator.lone_created))
        while len(deleted) < wanted:
            bound = [
                p
                for p in pods.pods.values()
                if p.kind in ("vgpu", "whole")
                and p.node
                and not p.deleted
                and p.name not in deleted
            ]
            if not bound:
                break
            victim = rng.choice(bound)
            deleted.append(victim.name)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    kube.delete_pod(api, NS, victim.name, uid=victim.uid, grace_s=0), 20
                )
    return deleted


# --- the faults -------------------------------------------------------------------------


class Injector:
    def __init__(
        self,
        args: argparse.Namespace,
        cluster: LocalCluster,
        sup: Supervisor,
        bus: BusView,
        pods: Pods,
        creator: Creator,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self.args = args
        self.cluster = cluster
        self.sup = sup
        self.bus = bus
        self.pods = pods
        self.creator = creator
        self.clock = clock
        self.rng = rng
        self.plan: list[Fault] = []
        self.done: list[Fault] = []
        self.start = clock.now()
        self.notes: list[str] = []

    def expected_left(self) -> float:
        return (len(self.plan) - len(self.done)) * (self.args.min_gap + 3.0)

    async def standby_ready(self, service: str, cap_s: float = 30.0) -> str:
        """Wait until both replicas of ``service`` answer pings (the standby is up)."""
        deadline = self.clock.now() + cap_s
        reps = [r for r in self.sup.replicas if r.service == service]
        while self.clock.now() < deadline:
            want = {f"{socket.gethostname()}-{r.proc.pid}" for r in reps if r.proc is not None}
            try:
                hellos = await asyncio.wait_for(_ping(self.bus.cfg, 0.5), 5)
            except Exception:
                hellos = []
            got = {str(h["instance"]) for h in hellos if h["service"] == service}
            if want <= got:
                return ""
            await asyncio.sleep(0.5)
        stacks = self.sup.workdir / "logs" / "stacks.txt"
        silent = [
            r
            for r in reps
            if r.proc is not None and f"{socket.gethostname()}-{r.proc.pid}" not in got
        ]
        where = [
            await dump_stack(r.proc.pid, stacks, f"{r.name} not answering pings")
            for r in silent
            if r.proc is not None
        ]
        names = ", ".join(f"{r.name} pid {r.proc.pid}" for r in silent if r.proc is not None)
        return f"{names} not answering pings after {cap_s:.0f}s ({'; '.join(where)})"

    async def run(self, plan: list[Fault]) -> None:
        self.plan = plan
        self.start = self.clock.now()
        next_at = self.clock.now() + self.args.lead
        for fault in plan:
            await asyncio.sleep(max(0.0, next_at - self.clock.now()))
            await self.one(fault)
            fault.wall = self.clock.wall(fault.at)
            self.done.append(fault)
            print(
                f"  t={fault.at - self.start:6.1f}s ({fault.wall}) {fault.label():<32} "
                f"{describe(fault)}",
                flush=True,
            )
            gap = self.args.min_gap + self.rng.uniform(0.0, 4.0)
            recovered = fault.at + max(
                fault.recovery_s or self.args.fault_cap,
                fault.lease_s or 0.0,
                fault.server_back_s or 0.0,
            )
            next_at = max(fault.at + gap, recovered + 2.0)

    async def one(self, fault: Fault) -> None:
        if fault.kind == "kill":
            await self.kill(fault)
        elif fault.kind == "nats-restart":
            i = int(fault.target)
            fault.detail = await self.nats_role(i)
            assets = await self.bus.jetstream_assets()
            fault.at = self.clock.now()
            await asyncio.to_thread(self.cluster.stop_nats, i, kill=True)
            leaders = asyncio.create_task(self.bus.leaders_back(fault, self.clock, assets))
            await asyncio.sleep(1.0)
            await asyncio.to_thread(self.cluster.start_nats, i)
            fault.server_back_s = self.clock.now() - fault.at
            await leaders
        elif fault.kind == "nats-lose":
            i = int(fault.target)
            fault.detail = await self.nats_role(i)
            assets = await self.bus.jetstream_assets()
            fault.at = self.clock.now()
            await asyncio.to_thread(self.cluster.stop_nats, i, kill=True)
            await self.bus.leaders_back(fault, self.clock, assets)
        else:
            fault.at = self.clock.now()
            await asyncio.to_thread(self.cluster.restart_apiserver)
            fault.server_back_s = self.clock.now() - fault.at
        await self.measure(fault)

    async def nats_role(self, i: int) -> str:
        """Whether server ``i`` leads the JetStream meta group (its monitor's /jsz)."""
        port = self.cluster._monitor_ports[i]
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{port}/jsz", timeout=aiohttp.ClientTimeout(total=2)) as r,
            ):
                jsz = await r.json()
            leader = (jsz.get("meta_cluster") or {}).get("leader", "")
            return f"meta leader {leader or '?'}" + (" (this one)" if leader == f"n{i}" else "")
        except Exception:
            return ""

    async def kill(self, fault: Fault) -> None:
        service = fault.target
        fault.detail = await self.standby_ready(service)
        deadline = self.clock.now() + 15
        holder = None
        while self.clock.now() < deadline and holder is None:
            holder = await self.bus.holder(service)
            if holder is None:
                await asyncio.sleep(0.2)
        pid = pid_of(holder) if holder else None
        rep = self.sup.by_pid(pid) if pid else None
        if rep is None:
            fault.at = self.clock.now()
            fault.detail = f"no active {service} found (lease holder {holder!r}); nothing killed"
            return
        fault.at = self.clock.now()
        self.sup.kill(rep)
        fault.detail = (
            fault.detail + "; " if fault.detail else ""
        ) + f"killed {rep.name} pid {pid}"
        if service == "job-controller":
            self.creator.pull_job()
        # The standby takes the lease once it has seen the dead holder's last renewal
        # unchanged for LEASE_S.
        lease_deadline = self.clock.now() + self.args.fault_cap
        while self.clock.now() < lease_deadline:
            now = await self.bus.holder(service)
            if now is not None and now != holder:
                fault.lease_s = self.clock.now() - fault.at
                new = self.sup.by_pid(pid_of(now) or -1)
                fault.detail += f"; lease to {new.name if new else now}"
                break
            await asyncio.sleep(0.05)

    async def measure(self, fault: Fault) -> None:
        t0 = fault.at
        if fault.kind == "kill" and fault.target == "job-controller":

            def pred(p: PodSeen) -> bool:
                return p.kind == "job" and p.created_at is not None and p.created_at >= t0
        else:

            def pred(p: PodSeen) -> bool:
                return p.created_at is not None and p.created_at >= t0

        left = max(0.5, self.args.fault_cap - (self.clock.now() - t0))
        t = await self.pods.wait_bind(t0, pred, left)
        fault.recovery_s = None if t is None else t - t0
        any_t = self.pods.first_bind(t0, lambda p: True)
        fault.any_bind_s = None if any_t is None else any_t - t0


def describe(f: Fault) -> str:
    parts = []
    if f.lease_s is not None:
        parts.append(f"lease {f.lease_s:.2f}s")
    if f.server_back_s is not None:
        parts.append(f"server back {f.server_back_s:.2f}s")
    if f.leaders_s is not None:
        parts.append(f"JetStream leaders {f.leaders_s:.2f}s")
    parts.append(f"recovery {fmt(f.recovery_s)}")
    return ", ".join(parts) + (f" [{f.detail}]" if f.detail else "")


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def stall(pods: Pods, start: float, end: float) -> tuple[float, float]:
    """The longest time from ``start`` to ``end`` with no bind while some pod waited
    (created before the quiet began, bound after it), and when it began (after
    ``start``); a fault may stop binding some seconds after it strikes."""
    times = [start] + [t for t, _ in pods.binds if start < t < end]
    after = [t for t, _ in pods.binds if t >= end]
    if after:
        times.append(after[0])
    worst = (0.0, 0.0)
    for a, b in itertools.pairwise(times):
        # A quiet that runs past the next fault counts here only until that fault.
        length = min(b, end) - a
        if length <= max(1.0, worst[0]):
            continue
        if any(
            p.created_at is not None
            and p.created_at <= a
            and p.bound_at is not None
            and p.bound_at >= b
            for p in pods.pods.values()
        ):
            worst = (length, a - start)
    return worst


def finish_recovery(faults: list[Fault], pods: Pods) -> None:
    """Recovery from the whole bind log (a bind may come after the injector moved on);
    when none came, say why. The stall is looked for until the next fault (30 s at most)."""
    for n, f in enumerate(faults):
        t0 = f.at
        end = min(t0 + 30.0, faults[n + 1].at if n + 1 < len(faults) else math.inf)
        f.stall_s, f.stall_at = stall(pods, t0, end)
        job = f.kind == "kill" and f.target == "job-controller"

        def pred(p: PodSeen, t0: float = t0, job: bool = job) -> bool:
            return p.created_at is not None and p.created_at >= t0 and (p.kind == "job" or not job)

        t = pods.first_bind(t0, pred)
        f.recovery_s = None if t is None else t - t0
        any_t = pods.first_bind(t0, lambda p: True)
        f.any_bind_s = None if any_t is None else any_t - t0
        if t is None:
            later = [p for p in pods.pods.values() if pred(p)]
            if not later:
                f.recovery_note = "nothing left to bind (no pod created after it)"
            elif all(p.reason_at is not None or p.deleted for p in later):
                f.recovery_note = (
                    f"nothing left that fits ({len(later)} later pods all pending with a reason)"
                )
            else:
                f.recovery_note = "NOT RECOVERED: later pods neither bound nor told why"


# --- the audit --------------------------------------------------------------------------


@dataclass
class Audit:
    pods: int = 0
    bound: int = 0
    pending_reason: int = 0
    lost: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    over: list[str] = field(default_factory=list)
    devices_used: int = 0
    wrong_node: list[str] = field(default_factory=list)
    unsigned: list[str] = field(default_factory=list)
    no_grant: list[str] = field(default_factory=list)
    grant_unbound: list[str] = field(default_factory=list)
    orphan_reservations: list[str] = field(default_factory=list)
    reservations: Counter[str] = field(default_factory=Counter)
    rebound: list[str] = field(default_factory=list)
    gangs_partial: list[str] = field(default_factory=list)
    jobs_missing: list[str] = field(default_factory=list)
    jobs_extra: list[str] = field(default_factory=list)
    fits_now: list[str] = field(default_factory=list)
    by_kind: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def violations(self) -> int:
        return (
            len(self.lost)
            + len(self.vanished)
            + len(self.over)
            + len(self.wrong_node)
            + len(self.unsigned)
            + len(self.no_grant)
            + len(self.grant_unbound)
            + len(self.orphan_reservations)
            + len(self.rebound)
            + len(self.gangs_partial)
            + len(self.jobs_missing)
        )


def kind_of(pod: dict[str, Any], lone: dict[str, str]) -> str:
    """What a pod of this run is: a gang's or a Job's member, else its item's kind
    (the API server rewrites quantities, 100000 as 100k: the item knows)."""
    meta = pod["metadata"]
    if (meta.get("labels") or {}).get(JOB_LABEL):
        return "job"
    if (meta.get("annotations") or {}).get(GROUP_NAME):
        return "gang"
    return lone.get(meta["name"], "other")


async def audit(
    api: kube.Client,
    bus: BusView,
    pods_seen: Pods,
    items: list[Item],
    deleted: list[str],
    failed_creates: list[str],
    inventory: Path,
    cfg: config_module.Config,
) -> Audit:
    a = Audit()
    pods, _ = await kube.list_all(api, f"/api/v1/namespaces/{NS}/pods")
    events, _ = await kube.list_all(
        api, f"/api/v1/namespaces/{NS}/events", {"fieldSelector": "reason=FailedScheduling"}
    )
    scheduled, _ = await kube.list_all(
        api, f"/api/v1/namespaces/{NS}/events", {"fieldSelector": "reason=Scheduled"}
    )
    groups, _ = await kube.list_all(api, f"{VOLCANO}/namespaces/{NS}/podgroups")
    jobs, _ = await kube.list_all(api, f"{BATCH}/namespaces/{NS}/jobs")
    told = {e["involvedObject"].get("uid") for e in events}
    spec = cfg.devices.nvidia
    split = spec.device_split_count
    key = config_module.grant_key(cfg)
    devices = {
        d.uuid: (node, d)
        for node, (_, devs) in expand(load_inventory(inventory)).items()
        for d in devs
    }

    by_name = {p["metadata"]["name"]: p for p in pods}
    lone = {i.name: i for i in items if i.kind not in ("gang", "job")}
    lone_kind = {name: i.kind for name, i in lone.items()}
    a.pods = len(pods)
    use: dict[str, list[tuple[str, int, int, bool]]] = defaultdict(list)
    for pod in pods:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        node = pod["spec"].get("nodeName")
        kind = kind_of(pod, lone_kind)
        annotations = meta.get("annotations") or {}
        grants = ann.read_grants(annotations)
        if node:
            a.bound += 1
            a.by_kind[kind]["bound"] += 1
            if not grants:
                a.no_grant.append(f"{name} on {node}")
                continue
            if not ann.signed(key, uid, node, grants, annotations.get(ann.SIGNATURE, "")):
                a.unsigned.append(name)
            for c in grants:
                for d in c.devices:
                    where = devices.get(d.uuid)
                    if where is None or where[0] != node:
                        on = where[0] if where else "no node"
                        a.wrong_node.append(f"{name}: {d.uuid} is on {on}, pod on {node}")
                    use[d.uuid].append(
                        (f"{name}/{c.container}", d.memory_mib, d.cores, d.exclusive)
                    )
        else:
            if grants:
                a.grant_unbound.append(name)
            if has_reason_condition(pod) or uid in told:
                a.pending_reason += 1
                a.by_kind[kind]["pending with a reason"] += 1
            else:
                a.lost.append(f"{name} ({kind}, phase {pod.get('status', {}).get('phase')})")
                a.by_kind[kind]["lost"] += 1

    for uuid, holders in use.items():
        info = devices[uuid][1] if uuid in devices else None
        mem_cap = (info.memory_mib if info else A100["memory"]) * spec.device_memory_scaling
        core_cap = 100 * spec.device_core_scaling
        mem = sum(h[1] for h in holders)
        cores = sum(h[2] for h in holders)
        exclusive = [h[0] for h in holders if h[3]]
        wrong = []
        if mem > mem_cap:
            wrong.append(f"memory {mem} > {mem_cap:.0f} MiB")
        if cores > core_cap:
            wrong.append(f"cores {cores} > {core_cap:.0f}%")
        if len(holders) > split:
            wrong.append(f"{len(holders)} slices > split {split}")
        if exclusive and len(holders) > 1:
            wrong.append(f"exclusive grant of {exclusive[0]} shared with {len(holders) - 1} more")
        if wrong:
            a.over.append(
                f"{uuid} ({devices[uuid][0] if uuid in devices else '?'}): "
                + ", ".join(wrong)
                + f"; holders {[h[0] for h in holders]}"
            )
    a.devices_used = len(use)

    # Every pod this run created and did not delete is still there.
    gone = set(deleted)
    for item in items:
        if item.kind == "job":
            continue  # the job-controller owns their names: checked per Job below
        for name in item.pods():
            if (
                name not in by_name
                and name not in gone
                and not any(f.startswith(f"{item.name}:") for f in failed_creates)
            ):
                a.vanished.append(name)

    # No pod bound twice.
    a.rebound = list(pods_seen.rebound)
    nodes_told: dict[str, set[str]] = defaultdict(set)
    for e in scheduled:
        m = re.search(r" to (\S+)$", e.get("message", ""))
        if m:
            nodes_told[e["involvedObject"].get("uid", "")].add(m[1])
    for uid, nodes in nodes_told.items():
        if len(nodes) > 1:
            a.rebound.append(f"uid {uid}: Scheduled Events name {sorted(nodes)}")

    # Gangs and Jobs: all or nothing; every Job with all its pods.
    members: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        group = (pod["metadata"].get("annotations") or {}).get(GROUP_NAME)
        if group:
            members[group].append(pod)
    for g in groups:
        name = g["metadata"]["name"]
        need = int(g["spec"].get("minMember", 1))
        bound = sum(bool(p["spec"].get("nodeName")) for p in members.get(name, []))
        if 0 < bound < need:
            a.gangs_partial.append(f"{name}: {bound}/{need} bound")
    job_items = {i.name: i for i in items if i.kind == "job"}
    for j in jobs:
        name = j["metadata"]["name"]
        item = job_items.get(name)
        want = {f"{name}-worker-{i}" for i in range(item.size)} if item else set()
        have = {
            p["metadata"]["name"]
            for p in pods
            if (p["metadata"].get("labels") or {}).get(JOB_LABEL) == name
        }
        if want - have:
            a.jobs_missing.append(f"{name}: no pod {sorted(want - have)}")
        if have - want:
            a.jobs_extra.append(f"{name}: unexpected {sorted(have - want)}")
    for name in job_items:
        if name not in {j["metadata"]["name"] for j in jobs} and not any(
            f.startswith(f"{name}:") for f in failed_creates
        ):
            a.jobs_missing.append(f"{name}: the Job itself is gone")

    # Reservations (decided, not yet bound): each should be for a pod that exists and
    # waits; one for a pod that is gone holds devices for nobody.
    uids = {p["metadata"]["uid"]: p for p in pods}
    try:
        reservations = await bus.reservations()
    except Exception as exc:
        reservations = {}
        a.reservations[f"unreadable ({type(exc).__name__})"] += 1
    for key_, r in reservations.items():
        ref = (r.get("grant") or {}).get("pod") or {}
        uid = ref.get("uid", key_)
        pod = uids.get(uid)
        if pod is None:
            a.orphan_reservations.append(f"{ref.get('namespace')}/{ref.get('name')} ({uid})")
            a.reservations["pod gone"] += 1
        elif pod["spec"].get("nodeName"):
            a.reservations["pod bound (stale)"] += 1
        else:
            a.reservations["pod pending"] += 1
            for c in (r.get("grant") or {}).get("containers") or ():
                for d in c.get("devices") or ():
                    use[d["uuid"]].append(
                        (
                            "reserved",
                            int(d.get("memory_mib", 0)),
                            int(d.get("cores", 0)),
                            bool(d.get("exclusive")),
                        )
                    )

    # Pending lone pods of one device that would fit on what the grants leave free: with
    # the burst over and retries after every release, none should be left.
    free = {}
    for uuid, (node, info) in devices.items():
        holders = use.get(uuid, [])
        free[uuid] = (
            node,
            info.memory_mib * spec.device_memory_scaling - sum(h[1] for h in holders),
            100 * spec.device_core_scaling - sum(h[2] for h in holders),
            split - len(holders),
            not holders,
        )
    for pod in pods:
        item = lone.get(pod["metadata"]["name"])
        if pod["spec"].get("nodeName") or item is None or item.kind not in ("vgpu", "whole"):
            continue
        if item.limits.get("nvidia.com/gpu", 1) != 1:
            continue
        mem = item.limits.get("nvidia.com/gpumem")
        cores = item.limits.get("nvidia.com/gpucores", 0)
        fits = [
            u
            for u, (_, fm, fc, fs, empty) in free.items()
            if (empty if mem is None else (fm >= mem and fc >= cores and fs >= 1))
        ]
        if fits:
            a.fits_now.append(f"{item.name} ({item.limits}) fits {len(fits)} devices")
    return a


# --- evidence ---------------------------------------------------------------------------


def log_findings(logs: Path, limit: int = 6) -> list[str]:
    """ERROR/CRITICAL lines and tracebacks of every service log, counted by message."""
    out = []
    for path in sorted(logs.glob("*.log")):
        counts: Counter[str] = Counter()
        first: dict[str, str] = {}
        for line in path.read_text(errors="replace").splitlines():
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                msg = re.sub(r"^\S+ \S+ ", "", line)  # drop the timestamp
                msg = re.sub(r"\b[0-9a-f]{8}-[0-9a-f-]{27}\b", "<uid>", msg)
                msg = re.sub(r"\d+", "N", msg)[:220]
                counts[msg] += 1
                first.setdefault(msg, line[:300])
        if counts:
            out.append(f"{path.name}: {sum(counts.values())} error lines")
            for msg, n in counts.most_common(limit):
                out.append(f"    {n} x {first[msg]}")
    return out


def crash_of(log: Path, pid: int) -> str:
    """Where process ``pid`` failed: the innermost frame of ours and the exception."""
    where = error = ""
    for line in section(log, pid):
        m = re.match(r'\s+File "(?:\S*/)?((?:shared|services)/\S+)", line (\d+), in (\S+)', line)
        if m:
            where = f"{m[1]}:{m[2]} {m[3]}"
        elif re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Lost\w*)\b", line):
            error = line.strip()[:200]
    return f"{error} at {where}" if where else error


def section(log: Path, pid: int) -> list[str]:
    text = log.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(text) if f"started as pid {pid} " in line), None)
    if start is None:
        return []
    end = next(
        (i for i in range(start + 1, len(text)) if text[i].startswith("=== chaos:")), len(text)
    )
    return text[start + 1 : end]


# --- the run ----------------------------------------------------------------------------


class Watchdog:
    """Ends everything this run started once ``timeout_s`` has passed, however stuck."""

    def __init__(self, timeout_s: float) -> None:
        self.pids: Callable[[], list[int]] = list
        self.timer = threading.Timer(timeout_s, self.fire)
        self.timer.daemon = True
        self.timeout_s = timeout_s

    def fire(self) -> None:
        print(
            f"chaos: global timeout ({self.timeout_s:.0f}s): killing every process of this run",
            flush=True,
        )
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(3)


async def settle(pods: Pods, clock: Clock, quiet_s: float, cap_s: float) -> float:
    """Until no bind and no new reason for ``quiet_s`` (longer, up to one watcher resync
    beyond, while some pod has neither), or ``cap_s``; the seconds it took."""
    start = clock.now()
    pods.last_change = max(pods.last_change, start)
    while clock.now() - start < cap_s:
        await asyncio.sleep(1.0)
        quiet = clock.now() - pods.last_change
        waiting = [
            p
            for p in pods.pods.values()
            if not p.deleted and not p.node and p.reason_at is None and p.uid
        ]
        if quiet >= quiet_s and (not waiting or quiet >= quiet_s + 35):
            break
    return clock.now() - start


async def run(args: argparse.Namespace, workdir: Path, watchdog: Watchdog) -> int:
    rng = random.Random(args.seed)
    items = workload(args.pods, rng)
    plan = fault_plan(rng, args.nats_servers)
    total_pods = sum(i.size for i in items)
    cfg_tmp = config_module.Config()
    split = cfg_tmp.devices.nvidia.device_split_count
    demand = sum(
        gpu_share(i.limits, split) * i.size
        for i in items
        if i.kind not in ("invalid", "impossible")
    )
    gpus = args.nodes * A100["count"]
    print(
        f"chaos: {total_pods} pods ({Counter(i.kind for i in items for _ in range(i.size))}) on "
        f"{args.nodes} nodes x 8 A100-80GB; demand {demand:.0f} GPUs' worth of {gpus} "
        f"({100 * demand / gpus:.0f}%) before churn {args.churn:.0%}; seed {args.seed}",
        flush=True,
    )
    print("chaos: faults in order: " + ", ".join(f.label() for f in plan), flush=True)
    if args.plan:
        return 0

    clock = Clock()
    cluster = LocalCluster(workdir=workdir / "cluster", nats_servers=args.nats_servers, keep=True)
    sup: Supervisor | None = None
    watchdog.pids = lambda: (sup.pids() if sup else []) + [p.popen.pid for p in cluster.procs]
    try:
        await asyncio.to_thread(cluster.start)
        print(f"chaos: control plane up at t={clock.now():.0f}s (workdir {workdir})", flush=True)
        config = dev_config(
            workdir / "tessera.yaml",
            cluster.nats_settings(),
            str(cluster.kubeconfig),
            scheduler={"names": ["tessera"], "leaderLeaseS": LEASE_S, "evictionGraceS": 0},
            kubernetes={"qps": 5000, "burst": 5000},
            telemetry={"logLevel": args.log_level},
        )
        cfg = config_module.load(str(config))
        inventory = workdir / "inventory.yaml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "nodes": [
                        {
                            "name": "chaos-{i}",
                            "replicas": args.nodes,
                            "devices": [{**A100, "numa": 2}],
                        }
                    ]
                }
            )
        )
        sup = Supervisor(workdir, config, inventory, clock)
        for service in CENTRAL:
            for r in range(2):
                await sup.start(service, r)
        await sup.start("node-agent", 0)
        bus = BusView(cluster)
        await bus.open()
        api = await connect(cluster)
        try:
            deadline = clock.now() + 120
            while clock.now() < deadline:
                hellos = await _ping(bus.cfg, 0.5)
                per = Counter(str(h["service"]) for h in hellos)
                holders = [await bus.holder(s) for s in CENTRAL]
                if all(per[s] >= 2 for s in CENTRAL) and per["node-agent"] >= 1 and all(holders):
                    break
                await asyncio.sleep(1.0)
            else:
                raise SystemExit(f"chaos: services not all up after 120s: {dict(per)}")
            await wait_nodes(api, args.nodes)
            for _ in range(60):  # every node's inventory stored
                if await bus.keys(cfg.nats.inventory_bucket) >= args.nodes:
                    break
                await asyncio.sleep(1.0)
            await namespace(api, NS)
            await asyncio.sleep(3.0)  # every allocator replica has applied the inventories
            print(
                f"chaos: 11 service processes and {args.nodes} nodes up at t={clock.now():.0f}s",
                flush=True,
            )

            pods = Pods(api, clock)
            watch = asyncio.create_task(pods.watch())
            creator = Creator(api, pods, items, clock)
            injector = Injector(args, cluster, sup, bus, pods, creator, clock, rng)
            burst_start = clock.now()
            create_task = asyncio.create_task(creator.run(injector.expected_left))
            churn_task = asyncio.create_task(
                churn(api, pods, creator, args.churn, random.Random(args.seed + 1))
            )
            print("chaos: burst and faults:", flush=True)
            await injector.run(plan)
            faults_end = clock.now()
            await create_task
            deleted = await churn_task
            burst_end = clock.now()
            print(
                f"chaos: faults done at t={faults_end - burst_start:.0f}s of the burst, every item "
                f"sent at t={burst_end - burst_start:.0f}s; settling",
                flush=True,
            )
            settle_s = await settle(pods, clock, args.settle, args.settle_cap)
            finish_recovery(injector.done, pods)
            result = await audit(api, bus, pods, items, deleted, creator.failed, inventory, cfg)
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        finally:
            await api.close()
            await bus.close()
        return report(
            args,
            workdir,
            clock,
            items,
            injector,
            creator,
            deleted,
            pods,
            result,
            sup,
            settle_s,
            burst_start,
            burst_end,
        )
    finally:
        if sup is not None:
            await sup.stop()
        await asyncio.to_thread(cluster.stop)


def report(
    args: argparse.Namespace,
    workdir: Path,
    clock: Clock,
    items: list[Item],
    injector: Injector,
    creator: Creator,
    deleted: list[str],
    pods: Pods,
    a: Audit,
    sup: Supervisor,
    settle_s: float,
    burst_start: float,
    burst_end: float,
) -> int:
    faults = injector.done
    print()
    print(
        f"chaos: {sum(i.size for i in items)} pods sent over {burst_end - burst_start:.0f}s "
        f"({creator.created} counted, {len(creator.failed)} creates gave up), {len(deleted)} "
        f"deleted as finished, "
        + (f"settled in {settle_s:.0f}s" if settle_s < args.settle_cap else "NOT settled")
        + f" (cap {args.settle_cap:.0f}s); {args.nodes} nodes, "
        f"{args.nats_servers} NATS servers, seed {args.seed}"
    )
    print()
    print(
        "| # | fault | at (s) | lease taken (s) | server back (s) | JetStream leaders (s) "
        "| first bind (s) | recovery (s) | after the leaders (s) | longest stall (s) | detail |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n, f in enumerate(faults, 1):
        rec = fmt(f.recovery_s).rstrip("s") if f.recovery_s is not None else f.recovery_note
        worst = f.worst_s()
        if worst is not None and worst > TARGET_RECOVERY_S:
            rec = f"**{rec}**"
        after = "-"
        if f.recovery_s is not None and f.leaders_s is not None:
            after = f"{f.recovery_s - f.leaders_s:.2f}"
        cells = [
            fmt(v).rstrip("s") for v in (f.lease_s, f.server_back_s, f.leaders_s, f.any_bind_s)
        ]
        stalled = f"{f.stall_s:.2f} from +{f.stall_at:.1f}" if f.stall_s else "-"
        if f.stall_s > TARGET_RECOVERY_S:
            stalled = f"**{stalled}**"
        print(
            f"| {n} | {f.label()} | {f.at - burst_start:.1f} ({f.wall}) | "
            + " | ".join(cells)
            + f" | {rec} | {after} | {stalled} | {f.detail} |"
        )
    measured = [w for f in faults if (w := f.worst_s()) is not None]
    missed = [f for f in faults if not f.met()]
    print()
    if measured:
        print(
            f"recovery (the first bind of a new pod, or a longer stall after it; for a NATS "
            f"fault from JetStream's leaders back): "
            f"max {max(measured):.2f}s, mean {sum(measured) / len(measured):.2f}s over "
            f"{len(measured)} faults; {len(missed)} of {len(faults)} over the "
            f"{TARGET_RECOVERY_S:.0f}s target (or not measured)"
        )
    for line in recoveries(faults):
        print(line)
    print()
    print(
        f"audit: pods {a.pods}, bound {a.bound}, pending with a reason {a.pending_reason}, "
        f"lost {len(a.lost) + len(a.vanished)}, over-committed devices {len(a.over)} "
        f"(of {a.devices_used} in use)"
    )
    for kind, c in sorted(a.by_kind.items()):
        print(f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    checks = [
        ("pending without a reason (lost)", a.lost),
        ("created, not deleted, gone (lost)", a.vanished),
        ("over-committed devices", a.over),
        ("grants on a device of another node", a.wrong_node),
        ("grants without a valid signature", a.unsigned),
        ("device pods bound without a grant", a.no_grant),
        ("grant annotations on unbound pods", a.grant_unbound),
        ("reservations without their pod", a.orphan_reservations),
        ("pods bound twice", a.rebound),
        ("gangs partly bound", a.gangs_partial),
        ("Jobs missing pods", a.jobs_missing),
    ]
    for what, found in checks:
        print(f"  {what}: {len(found)}" + (f"  e.g. {found[:5]}" if found else ""))
    print(f"  reservations left: {dict(a.reservations) or 'none'}")
    if a.jobs_extra:
        print(f"  Jobs with unexpected pods: {a.jobs_extra[:5]}")
    print(
        f"  pending one-device pods that would fit on the devices left free: {len(a.fits_now)}"
        + (f"  e.g. {a.fits_now[:3]}" if a.fits_now else "")
    )
    if creator.failed:
        print(f"  creates that gave up: {creator.failed[:5]}")
    if pods.watch_errors:
        print(f"  this run's pod watch broke {dict(pods.watch_errors)} (re-watched at once)")
    unexpected = uncaused(sup.exits)
    print()
    print(f"service exits we did not cause: {len(unexpected)}")
    causes: Counter[str] = Counter()
    for e in unexpected:
        rep = next(r for r in sup.replicas if r.name == e.replica)
        cause = crash_of(rep.log, e.pid)
        causes[re.sub(r"\b\w+-\d{3,}\b|\b\d{3,}\b", "N", cause)] += 1
        print(
            f"  t={e.at - burst_start:6.1f}s ({clock.wall(e.at)}) {e.replica} pid {e.pid} "
            f"exited {e.code}: {cause}"
        )
    if causes:
        print("  by cause:")
    for cause, n in causes.most_common():
        print(f"  {n:3d} x {cause}")
    findings = log_findings(workdir / "logs")
    if findings:
        print("error lines in the service logs:")
        for line in findings:
            print(f"  {line}")
    print(f"(logs: {workdir}/logs, control plane: {workdir}/cluster)")
    summary = {
        "pods": a.pods,
        "bound": a.bound,
        "pending_with_reason": a.pending_reason,
        "lost": len(a.lost) + len(a.vanished),
        "over_committed": len(a.over),
        "violations": a.violations(),
        "faults": [
            {
                "fault": f.label(),
                "at_s": round(f.at - burst_start, 1),
                "lease_s": f.lease_s and round(f.lease_s, 2),
                "server_back_s": f.server_back_s and round(f.server_back_s, 2),
                "leaders_s": f.leaders_s and round(f.leaders_s, 2),
                "first_bind_s": f.any_bind_s and round(f.any_bind_s, 2),
                "recovery_s": f.recovery_s and round(f.recovery_s, 2),
                "stall_s": round(f.stall_s, 2),
                "note": f.recovery_note,
                "held_against_target_s": (w := f.worst_s()) and round(w, 2),
                "target_s": TARGET_RECOVERY_S,
                "met": f.met(),
            }
            for f in faults
        ],
        "unexpected_exits": len(unexpected),
    }
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    timeline = {
        p.name: {"kind": p.kind, "created": p.created_at, "bound": p.bound_at, "node": p.node}
        for p in pods.pods.values()
    }
    (workdir / "pods.json").write_text(json.dumps({"burst_start": burst_start, "pods": timeline}))
    print(json.dumps({k: v for k, v in summary.items() if k != "faults"}))
    code, line = verdict(a, unexpected, faults)
    print(line)
    return code


def uncaused(exits: list[Exit]) -> list[Exit]:
    """The service exits the benchmark did not cause: neither a SIGKILL of one of its
    faults nor its stop at the end."""
    return [e for e in exits if not e.killed and not e.at_stop]


def recoveries(faults: list[Fault]) -> list[str]:
    """Each fault's recovery next to the target it is held against (``Fault.worst_s``
    against :data:`TARGET_RECOVERY_S`) and whether it met it: a heading, then one line a
    fault, in the order they struck."""
    lines = [
        f"recovery of each fault against its {TARGET_RECOVERY_S:.0f}s target (for a NATS "
        f"fault counted from JetStream's leaders back):"
    ]
    for n, f in enumerate(faults, 1):
        worst = f.worst_s()
        figure = (
            f"{worst:.2f}s"
            if worst is not None
            else f"not measured ({f.recovery_note or 'no bind of a new pod'})"
        )
        lines.append(
            f"  {n:2d}. {f.label()}: {figure} against {TARGET_RECOVERY_S:.0f}s: "
            + ("met" if f.met() else "MISSED")
        )
    return lines


def verdict(a: Audit, unexpected: list[Exit], faults: list[Fault]) -> tuple[int, str]:
    """The run's exit status and its closing line. The run fails (1) on any violation of
    the audit and on any service exit the benchmark did not cause (a process it neither
    SIGKILLed as a fault nor stopped at the end: each is listed above with its cause);
    the line says which. Recoveries over their target are counted, each printed by
    :func:`recoveries`."""
    lost = len(a.lost) + len(a.vanished)
    why = []
    if a.violations():
        why.append(f"{a.violations()} audit violations")
    if unexpected:
        why.append(f"{len(unexpected)} service exits we did not cause")
    missed = sum(1 for f in faults if not f.met())
    outcome = f"FAIL ({', '.join(why)})" if why else "PASS"
    line = (
        f"chaos: {outcome}: lost {lost}, over-committed {len(a.over)}, other violations "
        f"{a.violations() - lost - len(a.over)}, service exits we did not cause "
        f"{len(unexpected)}; recovery target {TARGET_RECOVERY_S:.0f}s missed by {missed} of "
        f"{len(faults)} faults"
    )
    return (1 if why else 0), line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nats-servers", type=int, default=3, choices=(1, 3))
    parser.add_argument("--churn", type=float, default=0.1, help="of bound lone pods deleted")
    parser.add_argument(
        "--min-gap", type=float, default=8.0, help="seconds between faults, at least"
    )
    parser.add_argument(
        "--lead", type=float, default=10.0, help="burst seconds before the first fault"
    )
    parser.add_argument("--fault-cap", type=float, default=30.0, help="longest wait for a recovery")
    parser.add_argument("--settle", type=float, default=20.0, help="quiet seconds that end the run")
    parser.add_argument("--settle-cap", type=float, default=150.0)
    parser.add_argument("--timeout", type=float, default=840.0, help="the whole run, hard limit")
    parser.add_argument("--log-level", default="INFO", help="of the services")
    parser.add_argument("--workdir", default="", help="default: a new folder under /tmp")
    parser.add_argument("--clean", action="store_true", help="remove the workdir after a pass")
    parser.add_argument("--plan", action="store_true", help="print the workload and faults only")
    args = parser.parse_args()
    # An aborted TLS connection to a NATS server that died: asyncio's warning, not ours.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    logging.getLogger("shared.bus").setLevel(logging.ERROR)  # this run's own reconnects
    if args.plan:
        workdir = Path(tempfile.gettempdir())
    elif args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="tessera-chaos-"))
    watchdog = Watchdog(args.timeout)
    watchdog.timer.start()
    started = time.monotonic()
    print(
        f"chaos: {dt.date.today()} on {platform.node()} ({os.cpu_count()} cores, "
        f"Python {platform.python_version()}), load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    try:
        code = asyncio.run(run(args, workdir, watchdog))
    finally:
        watchdog.timer.cancel()
    print(
        f"chaos: {time.monotonic() - started:.0f}s in all; load average now "
        f"{os.getloadavg()[0]:.1f} (other work on this machine slows recovery too)",
        flush=True,
    )
    if code == 0 and args.clean and not args.plan:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
