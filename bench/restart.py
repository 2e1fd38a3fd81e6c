"""Restart at size: every central service killed at once over a large cluster, a backlog
of pending pods, and every service started again at once.

    python bench/restart.py [--nodes 5000] [--pods 140000] [--pending 2000] [--rounds 1]

(quick, for development: ``--nodes 200 --pods 5000 --pending 200``)

Volcano's issue #5819 reports a first bind 8 min 17 s after a scheduler restart at 5,000
nodes and 140,000 pods. Here: etcd, kube-apiserver and nats-server on loopback, the node
agent simulating ``--nodes`` nodes of 8 x A100-80GB (allocatable 128 cpu, 1Ti, 250
pods), and ``--pods`` pods already bound, as Tessera binds them: each created as a
ReplicaSet would make it (one container with cpu and memory requests, a vGPU of 16,384
MiB and 25 % of the cores as HAMi's limits, a few environment variables, the service
account token's projected volume, an owner), bound by a Binding carrying the grant
annotations the binder writes (``tessera.io/grant``, ``tessera.io/node``, signed with
the cluster's grant key), then given the status a kubelet writes for a running
container: about 6 KB of JSON a pod, 856 MB at the default size. Pod ``i`` is on node
``i % nodes``, card ``(i // nodes) % 8``: 28 pods a node at the default size, four on
cards 0-3 (64 GiB and 100 % of the cores taken) and three on cards 4-7. They are made
(three writes each, ``--writers`` at once) before Tessera's central services start:
nothing would place them twice.

Then the central services (watcher, gang-coordinator, device-allocator, binder,
job-controller) start and settle: a probe pod binds and every durable consumer has
handled its backlog. The benchmark times the API server's own LIST of every pod (read,
not decoded: in pages of 500, in pages of ``kube.LIST_PAGE`` as the services read it,
and in one request; the fastest sets the target: first bind within 5 s of it, or within
10 s where it takes 5 s or less), SIGKILLs the five central services at once (the node
agent, one per node in a cluster, stays), and creates ``--pending`` pods while they are
down: the backlog a restarted scheduler finds. Each asks a vGPU of 32,768 MiB and 25 %
of the cores, which fits only a card holding three of the bound pods: a ledger that
missed a bound pod would put one on a full card. They are
in namespace ``restart-pending-<round>``, which the API server lists after the bound
pods' ``restart-bound`` (a list read in order reaches them last). Then every central
service starts again at once, and from that moment the benchmark notes the first and the
last bind of the backlog (its own watch of that namespace), and reads from the services'
logs where the time went: their ``startup phase <name>: <seconds> s`` lines (the list of
pods, its decoding, the ledger's rebuild, the consumers' catch-up), each with the time
after the restart at which it ended; and the CPU seconds each process (the API server,
etcd, NATS, every service, this one) used until the first and until the last bind,
beside what the machine's other processes used meanwhile. With ``--rounds`` above 1
(at most 10 at the default sizes: each backlog takes 2,000 of the 20,000 cards with
room) the kill, backlog and restart are repeated on the same cluster.

At the end every pod's grant is read back from the API server and summed per card:
``over-commits`` counts cards given more memory or cores than they have (it must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from harness import (
    A100,
    Binds,
    Services,
    connect,
    cpu_seconds,
    namespace,
    options,
    registered,
    tessera,
)

from services.node_agent.simulate import _uuid
from shared import kube
from shared.config import grant_key, load
from shared.core import annotations as ann
from shared.core.model import ContainerGrant, DeviceGrant, NodeName
from tools.localcluster import LocalCluster
from tools.ops import bus

CENTRAL = ("watcher", "gang-coordinator", "device-allocator", "binder", "job-controller")
"""The services killed and restarted (the node agent stays: one runs on every node)."""
CONSUMERS = ("gang-coordinator", "device-allocator", "binder", "job-controller")
BOUND_NS = "restart-bound"
PROBE_NS = "restart-probe"
PENDING_NS = "restart-pending"
CARDS = A100["count"]
CARD_MIB = A100["memory"]
CARD_CORES = 100
BOUND_MIB, BOUND_CORES = 16384, 25
PENDING_MIB, PENDING_CORES = 32768, 25
ALLOCATABLE = {"cpu": "128", "memory": "1Ti", "pods": "250"}
CPUS = ("250m", "500m", "1", "2")
MEMORIES = ("512Mi", "1Gi", "2Gi", "4Gi")
PHASE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\S+) \w+ \S+: startup phase ([\w-]+): "
    r"([\d.]+) s(?: \((.*)\))?$"
)


def pod(name: str, rng: random.Random, mib: int, cores: int) -> dict[str, Any]:
    """One realistic pod of Tessera's, as a ReplicaSet would make it: one container with
    cpu and memory requests, a vGPU, a few environment variables and the service account
    token's projected volume (the API server's ServiceAccount admission is off here)."""
    app = f"app-{rng.randrange(1000):04d}"
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(mib),
        "nvidia.com/gpucores": str(cores),
    }
    requests = {"cpu": rng.choice(CPUS), "memory": rng.choice(MEMORIES)}
    token = "kube-api-access-" + name[-5:]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": app, "pod-template-hash": "7d9c8b6f5", "tier": "inference"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-7d9c8b6f5",
                    "uid": "5f0c9a4e-3b1d-4c2e-9f8a-7b6c5d4e3f2a",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "schedulerName": "tessera",
            "serviceAccountName": "default",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/ml/inference-server:v2.14.3",
                    "args": ["--model", f"/models/{app}", "--port", "8080"],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [
                        {"name": "MODEL_NAME", "value": app},
                        {"name": "LOG_LEVEL", "value": "info"},
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        },
                    ],
                    "resources": {"requests": requests, "limits": limits},
                    "volumeMounts": [
                        {
                            "name": token,
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                }
            ],
            "volumes": [
                {
                    "name": token,
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                }
            ],
        },
    }


def running(node: str, i: int) -> dict[str, Any]:
    """The status a kubelet writes once the pod's container runs."""
    now = kube.now_rfc3339()
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    host = f"192.168.{(i >> 8) & 255}.{i & 255}"
    return {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "hostIP": host,
            "hostIPs": [{"ip": host}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {"running": {"startedAt": now}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example.com/ml/inference-server:v2.14.3",
                    "imageID": "registry.example.com/ml/inference-server@sha256:"
                    "9b2f6c1e0d4a7b8c3e5f1a2d6c9b0e4f7a3d8c2b5e1f6a9d0c4b7e2a5f8c1d3e",
                    "containerID": f"containerd://{i:064x}",
                    "started": True,
                }
            ],
        }
    }


def bound_grant(i: int, nodes: int) -> tuple[NodeName, tuple[ContainerGrant, ...]]:
    """Bound pod ``i``'s node and grant (see the module docstring)."""
    node = NodeName(f"bench-{i % nodes}")
    card = (i // nodes) % CARDS
    device = DeviceGrant(
        uuid=_uuid(node, "nvidia", card),
        index=card,
        vendor="nvidia",
        model=str(A100["model"]),
        memory_mib=BOUND_MIB,
        cores=BOUND_CORES,
    )
    return node, (ContainerGrant(container="main", devices=(device,)),)


async def create_bound(api: kube.Client, args: argparse.Namespace, key: bytes | None) -> float:
    """Create, bind and mark running ``--pods`` pods (three writes each, ``--writers`` at
    once); seconds."""
    todo = iter(range(args.pods))
    rng = random.Random(args.seed)
    shapes = [pod(f"b-{i:06d}", rng, BOUND_MIB, BOUND_CORES) for i in range(args.pods)]
    done = 0
    start = time.monotonic()

    async def writer() -> None:
        nonlocal done
        for i in todo:
            made = await kube.request(api, "POST", f"/api/v1/namespaces/{BOUND_NS}/pods", shapes[i])
            ref = kube.pod_ref(made)
            node, grants = bound_grant(i, args.nodes)
            notes = ann.grant_annotations(node, grants, time.time(), key=key, uid=ref.uid)
            await kube.bind(api, ref, node, notes)
            await kube.request(
                api,
                "PATCH",
                f"/api/v1/namespaces/{BOUND_NS}/pods/{ref.name}/status",
                running(node, i),
                content_type="application/merge-patch+json",
            )
            shapes[i] = {}
            done += 1
            if done % 10000 == 0:
                rate = done / (time.monotonic() - start)
                print(f"  {done} pods created and bound ({rate:.0f}/s)", flush=True)

    await asyncio.gather(*(writer() for _ in range(args.writers)))
    return time.monotonic() - start


async def create_pending(api: kube.Client, ns: str, count: int, writers: int, seed: int) -> float:
    rng = random.Random(seed)
    shapes = [pod(f"p-{i:05d}", rng, PENDING_MIB, PENDING_CORES) for i in range(count)]
    todo = iter(shapes)
    start = time.monotonic()

    async def writer() -> None:
        for body in todo:
            await kube.request(api, "POST", f"/api/v1/namespaces/{ns}/pods", body)

    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.monotonic() - start


# --- the API server's own LIST --------------------------------------------------------


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815 (the API's own names)
    # "continue" is a Python keyword: renamed
    cont: str = msgspec.field(default="", name="continue")


class _Page(msgspec.Struct):
    """A page of a LIST read for its metadata alone (its items are skipped unread)."""

    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_page = msgspec.json.Decoder(_Page)


async def time_list(api: kube.Client, page: int | None) -> tuple[float, int, int]:
    """One LIST of every pod, paged by ``page`` (None: one request), read and not
    decoded: (seconds, bytes, pages)."""
    query: dict[str, str] = {"limit": str(page)} if page else {}
    size = pages = 0
    start = time.monotonic()
    while True:
        raw = await kube._raw(api, "GET", "/api/v1/pods", query)
        size += len(raw)
        pages += 1
        cont = _page.decode(raw).metadata.cont
        if not cont:
            return time.monotonic() - start, size, pages
        query["continue"] = cont


# --- settling, and the over-commit check --------------------------------------------------


async def consumers_idle(cluster: LocalCluster, stream: str) -> bool:
    """Whether every central consumer has handled everything published for it."""
    async with bus(cluster.nats_config()) as nc:
        js = nc.jetstream()
        for durable in CONSUMERS:
            info = await js.consumer_info(stream, durable)
            if info.num_pending or info.num_ack_pending:
                return False
    return True


async def settle(api: kube.Client, cluster: LocalCluster, stream: str, timeout_s: float) -> float:
    """Until a probe pod binds and every consumer is idle twice in a row; seconds."""
    start = time.monotonic()
    probe = f"probe-{int(start)}"
    binds = Binds(api, PROBE_NS, 1)
    binds.start()
    await kube.request(
        api,
        "POST",
        f"/api/v1/namespaces/{PROBE_NS}/pods",
        pod(probe, random.Random(0), 1024, 5),
    )
    await binds.wait(timeout_s)
    if not binds.at:
        raise SystemExit(f"the probe pod did not bind within {timeout_s:.0f} s")
    idle = 0
    while idle < 2 and time.monotonic() - start < timeout_s:
        await asyncio.sleep(2.0)
        idle = idle + 1 if await consumers_idle(cluster, stream) else 0
    return time.monotonic() - start


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class _Spec(msgspec.Struct):
    nodeName: str = ""  # noqa: N815


class _Status(msgspec.Struct):
    phase: str = ""


class _Pod(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


class _PodList(msgspec.Struct):
    items: list[_Pod]
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_pods = msgspec.json.Decoder(_PodList)


async def check(api: kube.Client) -> dict[str, int]:
    """Every pod's grant summed per card: cards over their memory or cores, grants on a
    card of another node, and pods bound."""
    mem: Counter[str] = Counter()
    cores: Counter[str] = Counter()
    wrong_node = bound = 0
    query = {"limit": "500"}
    while True:
        page = _pods.decode(await kube._raw(api, "GET", "/api/v1/pods", query))
        for p in page.items:
            if not p.spec.nodeName or p.status.phase in ("Succeeded", "Failed"):
                continue
            bound += 1
            for c in ann.read_grants(p.metadata.annotations) or ():
                for d in c.devices:
                    if d.uuid != _uuid(p.spec.nodeName, "nvidia", d.index):
                        wrong_node += 1
                    mem[d.uuid] += CARD_MIB if d.exclusive else d.memory_mib
                    cores[d.uuid] += CARD_CORES if d.exclusive else d.cores
        if not page.metadata.cont:
            break
        query["continue"] = page.metadata.cont
    over = sum(1 for u in mem if mem[u] > CARD_MIB or cores[u] > CARD_CORES)
    return {"over_commits": over, "wrong_node": wrong_node, "bound": bound, "cards": len(mem)}


# --- the services' own account of their start ------------------------------------------


@dataclass
class Phase:
    service: str
    name: str
    seconds: float
    ended_s: float
    """After the restart."""
    detail: str


def phases(workdir: Path, offsets: dict[str, int], restart_wall: float) -> list[Phase]:
    """Every ``startup phase`` line the restarted services logged, in order."""
    found = []
    for service in CENTRAL:
        log = workdir / f"{service}.log"
        with log.open("rb") as f:
            f.seek(offsets.get(service, 0))
            text = f.read().decode(errors="replace")
        for line in text.splitlines():
            m = PHASE.match(line)
            if m is None:
                continue
            at = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append(Phase(m[2], m[3], float(m[4]), at - restart_wall, m[5] or ""))
    return sorted(found, key=lambda p: p.ended_s)


def log_offsets(workdir: Path) -> dict[str, int]:
    return {
        s: (workdir / f"{s}.log").stat().st_size for s in CENTRAL if (workdir / f"{s}.log").exists()
    }


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy so far, every core (``/proc/stat``)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    at: float
    cpu: dict[str, float]
    machine: float


def sample(pids: dict[str, int]) -> Sample:
    return Sample(time.monotonic(), cpu_seconds(pids), machine_busy_s())


async def sampling(pids: Callable[[], dict[str, int]], out: list[Sample]) -> None:
    """Every process's CPU seconds and the machine's, twice a second."""
    while True:
        out.append(sample(pids()))
        await asyncio.sleep(0.5)


def used(samples: list[Sample], until: float) -> tuple[dict[str, float], float, float]:
    """CPU seconds each process used from the first sample to the first one at or after
    ``until`` (a process started meanwhile from 0), the machine's, and that window."""
    first = samples[0]
    last = next((s for s in samples if s.at >= until), samples[-1])
    per = {k: v - first.cpu.get(k, 0.0) for k, v in last.cpu.items()}
    return per, last.machine - first.machine, last.at - first.at


@dataclass
class Round:
    pending: int
    create_s: float
    first_s: float
    last_s: float
    bound: int
    phases: list[Phase] = field(default_factory=list)
    cpu: dict[str, tuple[dict[str, float], float, float]] = field(default_factory=dict)
    """CPU to the first and to the last bind (``used``)."""


async def one_round(
    api: kube.Client,
    cluster: LocalCluster,
    services: Services,
    args: argparse.Namespace,
    r: int,
) -> Round:
    ns = f"{PENDING_NS}-{r}"
    await namespace(api, ns)
    for name in CENTRAL:  # SIGKILL, all at once
        services.procs[name].kill()
    for name in CENTRAL:
        services.procs.pop(name).wait()
    print(f"round {r}: central services killed", flush=True)
    await asyncio.sleep(1.0)
    create_s = await create_pending(api, ns, args.pending, args.writers, args.seed + r)
    binds = Binds(api, ns, args.pending)
    binds.start()
    await asyncio.sleep(1.0)  # its list done: only binds come now
    offsets = log_offsets(services.workdir)

    def pids() -> dict[str, int]:
        return {p.name: p.popen.pid for p in cluster.procs} | services.pids | {"bench": os.getpid()}

    samples = [sample(pids())]
    restart_wall, restart = time.time(), time.monotonic()
    starting = asyncio.create_task(asyncio.to_thread(services.start, CENTRAL))
    sampler = asyncio.create_task(sampling(pids, samples))
    await binds.wait(args.timeout, settle_s=args.settle)
    await starting
    sampler.cancel()
    times = sorted(binds.at.values())
    # The watcher lists every pod once the backlog is placed: its phases end later.
    for _ in range(int(args.timeout)):
        found = phases(services.workdir, offsets, restart_wall)
        if any(p.service == "watcher" and p.name == "announce" for p in found):
            break
        await asyncio.sleep(1.0)
    return Round(
        pending=args.pending,
        create_s=create_s,
        first_s=times[0] - restart if times else -1.0,
        last_s=times[-1] - restart if times else -1.0,
        bound=len(times),
        phases=phases(services.workdir, offsets, restart_wall),
        cpu={"first": used(samples, times[0]), "last": used(samples, times[-1])} if times else {},
    )


def report(
    args: argparse.Namespace,
    lists: dict[str, tuple[float, int, int]],
    rounds: list[Round],
    checked: dict[str, int],
    setup: dict[str, float],
) -> None:
    listing = min(v[0] for v in lists.values())
    target = 10.0 if listing <= 5.0 else listing + 5.0
    size = max(v[1] for v in lists.values())
    print()
    print(
        f"restart at size: {args.nodes} nodes x 8 A100-80GB, {args.pods} bound pods, "
        f"{args.pending} pending, {os.cpu_count()} cores shared by all"
    )
    print(
        f"setup: pods created and bound in {setup['create_s']:.0f} s; first start of the "
        f"central services settled in {setup['settle_s']:.1f} s"
    )
    print(
        f"the API server's own LIST of every pod ({size / 1e6:.0f} MB), read and not decoded: "
        + ", ".join(f"{k} {v[0]:.2f} s ({v[2]} pages)" for k, v in lists.items())
        + f"; target for the first bind: {target:.1f} s "
        + ("(10 s)" if listing <= 5.0 else f"(the fastest LIST, {listing:.2f} s, + 5 s)")
    )
    print()
    print("| round | pending created (s) | first bind (s) | last bind (s) | bound | target met |")
    print("|---:|---:|---:|---:|---:|---|")
    for i, r in enumerate(rounds):
        met = "yes" if 0 <= r.first_s <= target else "no"
        print(
            f"| {i} | {r.create_s:.1f} | {r.first_s:.2f} | {r.last_s:.2f} "
            f"| {r.bound}/{r.pending} | {met} |"
        )
    for i, r in enumerate(rounds):
        print()
        for until, (per, machine, window) in r.cpu.items():
            ours = sum(per.values())
            busy = sorted(per.items(), key=lambda kv: -kv[1])
            print(
                f"CPU seconds, round {i}, from the restart to the {until} bind ({window:.1f} s, "
                f"{os.cpu_count()} cores: {machine:.1f} busy, {machine - ours:.1f} of them by "
                "processes outside this benchmark): "
                + ", ".join(f"{k} {v:.1f}" for k, v in busy if v >= 0.05)
            )
        print(f"where the time went, round {i} (ended: seconds after the restart):")
        print("| service | phase | took (s) | ended (s) | detail |")
        print("|---|---|---:|---:|---|")
        for p in r.phases:
            print(f"| {p.service} | {p.name} | {p.seconds:.2f} | {p.ended_s:.2f} | {p.detail} |")
    print()
    print(
        f"over-commits: {checked['over_commits']} (cards given more memory or cores than "
        f"they have, of {checked['cards']} cards granted; {checked['wrong_node']} grants "
        f"naming another node's card; {checked['bound']} pods bound)"
    )


async def run(args: argparse.Namespace, cluster: LocalCluster, services: Services) -> None:
    cfg = load(str(services.cfg))
    key = grant_key(cfg)
    api = await connect(cluster)
    async with api:
        await registered(api, args.nodes)
        for ns in (BOUND_NS, PROBE_NS):
            await namespace(api, ns)
        print(f"{args.nodes} nodes registered; creating {args.pods} bound pods", flush=True)
        setup = {"create_s": await create_bound(api, args, key)}
        await asyncio.to_thread(services.start, CENTRAL)
        setup["settle_s"] = await settle(api, cluster, cfg.nats.stream, args.timeout)
        print(f"central services settled in {setup['settle_s']:.1f} s", flush=True)
        lists = {
            "by 500": await time_list(api, 500),
            f"by {kube.LIST_PAGE}": await time_list(api, kube.LIST_PAGE),
            "in one request": await time_list(api, None),
        }
        print(
            "LIST of every pod: " + ", ".join(f"{k} {v[0]:.2f} s" for k, v in lists.items()),
            flush=True,
        )
        rounds = []
        for r in range(args.rounds):
            if r:
                await settle(api, cluster, cfg.nats.stream, args.timeout)
            rounds.append(await one_round(api, cluster, services, args, r))
            print(
                f"round {r}: first bind {rounds[-1].first_s:.2f} s, last {rounds[-1].last_s:.2f} s",
                flush=True,
            )
        checked = await check(api)
    report(args, lists, rounds, checked, setup)
    if checked["over_commits"] or checked["wrong_node"]:
        sys.exit(1)


def main() -> None:
    args = options(
        __doc__,
        nodes=5000,
        pods=140000,
        pending=2000,
        rounds=1,
        writers=64,
        seed=1,
        timeout=600.0,
        settle=30.0,
        log_level="INFO",
    )
    workdir = Path(tempfile.mkdtemp(prefix="tessera-bench-restart-"))
    inventory = [
        {
            "name": "bench-{i}",
            "replicas": args.nodes,
            "allocatable": dict(ALLOCATABLE),
            "devices": [{**A100, "numa": 2}],
        }
    ]
    with (
        LocalCluster(workdir=workdir / "cluster") as cluster,
        tessera(
            workdir, cluster, args.nodes, args.log_level, inventory=inventory, first=["node-agent"]
        ) as services,
        contextlib.suppress(KeyboardInterrupt),
    ):
        asyncio.run(run(args, cluster, services))
    print(f"(service logs: {workdir})")


if __name__ == "__main__":
    main()
