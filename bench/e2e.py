"""Tessera against kube-scheduler on one real API server, side by side in one run.

    python bench/e2e.py [--nodes 1000] [--pods 5000] [--seed 1] [--claims]

Starts etcd, kube-apiserver, kube-scheduler (same release, client QPS/burst 5000 as in
Kubernetes' scheduler_perf), nats-server and Tessera's node agent, with ``--nodes``
simulated nodes of 8 x A100-80GB; Tessera's other services start after kube-scheduler's
run, so they take no CPU from it. The Node objects are the ones both schedulers read
(one API server): each has a zone label (3 zones) and a pool label, allocatable 128 cpu,
1Ti memory and 110 pods, and every fourth node is a dedicated pool tainted
``dedicated=ml:NoSchedule``. They advertise ``nvidia.com/gpu: 8`` as NVIDIA's device
plugin would, so kube-scheduler places whole-GPU pods by that extended resource; Tessera
places by its device ledger.

Every pod is realistic and the same for both schedulers (drawn once with ``--seed``):
cpu and memory requests (250m-2 cpu, 512Mi-4Gi), an ``app`` label (100 pods per app),
a ``nodeSelector`` on the pool label on half of them (a quarter on the general pool
``a``, a quarter on the dedicated pool ``ml`` with a toleration of its taint), and a
zone topology spread constraint (DoNotSchedule, maxSkew 1, on the app label) on a
tenth. Then, on the same nodes, one after the other (each run's pods deleted before the
next):

0. the ceiling: the same pods created with a scheduler name nobody serves. Nothing
   binds; the API server's create rate with no scheduler beside it is the most pods a
   second any scheduler could bind here;
1. kube-scheduler: ``--pods`` pods asking ``nvidia.com/gpu: 1``;
2. Tessera: the same whole-GPU pods (``schedulerName: tessera``);
3. Tessera: the same pods as fractional vGPUs (1 device, 20 % memory, 25 % cores);
4. Tessera: the whole-GPU pods again, with ``scheduler.scheduledEvents: false`` (the
   binder restarted with it): what the ``Scheduled`` Event per pod, one API write of a
   bind's two, costs. Runs 0 to 3 compare like with like: both schedulers write it.

The shapes are sized so every pod fits in any order of placement (the benchmark measures
speed, not rejection) while the pods are at most 2/3 of the GPUs (the default: 5,000 on
8,000; the script warns above that): the ``ml`` pods have the ``ml`` quarter of the
GPUs to themselves, and the pods that may land in pool ``a`` (no selector, or pool
``a``: 3/4 of them) are then at most half the GPUs, pool ``a``'s size. Cpu, memory and
pod slots never run out (a node holds at most 32 vGPU pods). A spread pod needs room in
the zone with fewest of its app; with the zones interleaved over the nodes it has it.
After each run the script checks no pod sits on a node its selector or taints rule out,
and shows FailedScheduling messages for any pod left pending.

Pods are created as fast as the API server takes them (``--writers`` at once). Per run it
prints the API server's create rate (pods created per second while creating), pods
bound per second (first create to last bound) and that as a ratio of the ceiling's
create rate (run 0), the p50/p99/max time from a pod's creation to its binding
(bench/harness.py says how both are clocked), then the ratios against kube-scheduler,
and how long after the last bind the namespace held a ``Scheduled`` Event for every pod
bound (a scheduler that writes its Events behind its Bindings, as Tessera's binder
does, finishes them then).
The machine's cores are printed with the table, then each process's CPU seconds from
the first create to the last bind (this script's own as ``bench``) and the share of
the machine they add up to: near 100 %, the run was bound by the machine's cores.

With ``--claims``, the runs are DRA's instead (and only they run): the same pods, each
with one ResourceClaim of its own name, created just before it (no
kube-controller-manager runs here to make a template's), asking the shipped class
``gpu.tessera.io``:

0. the ceiling, as above, each pod with its claim (``created/s`` counts pods, each one
   two creates);
1. kube-scheduler (its DynamicResources plugin, consumable capacity on as 1.36 has it),
   claims asking a whole card: ``exactly: {deviceClassName: gpu.tessera.io, count: 1}``;
2. kube-scheduler, claims asking a share: ``capacity.requests`` 25 ``cores`` and 20 %
   of the card's ``memory``, as the vGPU run's pods ask;
3. and 4. Tessera, the same two.

Each compares with kube-scheduler's run of the same claim. The nodes then also carry
one ResourceSlice each, built by the node agent's own ``resource_slice``
(services/node_agent/dra/slices.py: driver ``gpu.tessera.io``, one pool per node, 8
cards with ``allowMultipleAllocations`` and consumable ``cores`` and ``memory``) from
the devices the simulator publishes, and the DeviceClasses of
deploy/kustomize/components/dra/deviceclasses.yaml. The simulator publishes no slice
(only an agent on a real node does, once its kubelet registered the driver) and its
inventory says device plugin, so Tessera's ledger keeps the cards for extended
resources too: the claim pods ask none. After each run the script checks every claim
of a bound pod: allocated from its node's pool, its node selector that node, reserved
for the pod; and that no device is given beyond a capacity (``consumedCapacity``
summed over its claims) nor a whole card shared. Between runs the claims go with their
pods: kube-scheduler protects each claim it allocates with the finalizer
``resource.kubernetes.io/delete-protection``, which only kube-controller-manager's
resourceclaim controller lifts, so the script lifts it, and checks no claim is left
(an allocated one would hold its devices in the next run). With ``--claims`` the
defaults are 2,000 pods, a 600 s timeout and a 120 s settle, printed first
(``CLAIM_DEFAULTS`` says why).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from harness import (
    A100,
    Binds,
    Services,
    connect,
    cpu_seconds,
    namespace,
    pct,
    registered,
    tessera,
)
from kubernetes_asyncio.client import ApiException

from services.node_agent.dra.slices import resource_slice
from services.node_agent.simulate import expand, load_inventory
from shared import config as config_module
from shared import kube
from shared.core.quantity import parse_quantity
from tools.cli import SERVICES
from tools.localcluster import LocalCluster

WHOLE = {"nvidia.com/gpu": 1}
SLICE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 20, "nvidia.com/gpucores": 25}
CEILING = "API server alone (pods nobody schedules)"
BENCH = "bench"
"""This script's own process in the CPU table: it creates the pods and watches them bind."""


class Run(NamedTuple):
    label: str
    scheduler: str
    limits: dict[str, Any]
    """The pods' limits (extended resources)."""
    settings: dict[str, Any]
    """Tessera's ``scheduler:`` settings for the run."""
    claim: dict[str, Any] | None = None
    """With ``--claims``: the ``exactly`` request of each pod's one ResourceClaim."""


RUNS = [
    Run(CEILING, "nobody", WHOLE, {}),
    Run("kube-scheduler, whole GPU", "default-scheduler", WHOLE, {}),
    Run("Tessera, whole GPU", "tessera", WHOLE, {}),
    Run("Tessera, vGPU 20% mem 25% cores", "tessera", SLICE, {}),
    Run("Tessera, whole GPU, no Scheduled Events", "tessera", WHOLE, {"scheduledEvents": False}),
]
RESOURCE = "/apis/resource.k8s.io/v1"
DEVICE_CLASSES = Path(__file__).parent.parent / "deploy/kustomize/components/dra/deviceclasses.yaml"
GPU_CLASS = "gpu.tessera.io"
"""The shipped DeviceClass of whole cards or shares of one (DEVICE_CLASSES)."""
CLAIM_WHOLE = {"deviceClassName": GPU_CLASS, "count": 1}
CLAIM_SHARE = {
    **CLAIM_WHOLE,
    "capacity": {"requests": {"cores": "25", "memory": f"{A100['memory'] // 5}Mi"}},
}
"""25 % of the cores and 20 % of the memory, as the vGPU run's pods ask."""
CLAIM_RUNS = [
    Run(CEILING, "nobody", {}, {}, CLAIM_WHOLE),
    Run("kube-scheduler, claim: whole card", "default-scheduler", {}, {}, CLAIM_WHOLE),
    Run("kube-scheduler, claim: 20% mem 25% cores", "default-scheduler", {}, {}, CLAIM_SHARE),
    Run("Tessera, claim: whole card", "tessera", {}, {}, CLAIM_WHOLE),
    Run("Tessera, claim: 20% mem 25% cores", "tessera", {}, {}, CLAIM_SHARE),
]

GPUS_PER_NODE = A100["count"]
ZONE = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
POOLS = ("a", "b", "a", "ml")  # by node index mod 4; "ml" is the tainted, dedicated pool
TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
ALLOCATABLE = {"cpu": "128", "memory": "1Ti", "pods": "110"}
CPUS = ("250m", "500m", "1", "2")
MEMORIES = ("512Mi", "1Gi", "2Gi", "4Gi")
PODS_PER_APP = 100


def node_entry(n: int) -> dict[str, Any]:
    """Simulated node ``n`` (services/node_agent/simulate.py's inventory entry): zone
    by ``n % 3``, pool by ``n % 4`` (a, b, a, ml), the ml quarter tainted."""
    pool = POOLS[n % len(POOLS)]
    return {
        "name": f"bench-{n:05d}",
        "labels": {ZONE: ZONES[n % len(ZONES)], "pool": pool},
        "taints": [dict(TAINT)] if pool == "ml" else [],
        "allocatable": dict(ALLOCATABLE),
        "devices": [{**A100, "numa": 2}],
    }


def pod_shapes(pods: int, seed: int) -> list[dict[str, Any]]:
    """The scheduler-facing part of every pod, the same for each run: labels, requests,
    node selector, tolerations and spread (see the module docstring)."""
    rng = random.Random(seed)
    shapes = []
    for i in range(pods):
        app = f"app-{i // PODS_PER_APP:04d}"
        spec: dict[str, Any] = {}
        if i % 4 == 1:  # a quarter: the dedicated pool, tolerating its taint
            spec["nodeSelector"] = {"pool": "ml"}
            spec["tolerations"] = [{**TAINT, "operator": "Equal"}]
        elif i % 4 == 3:  # a quarter: the general pool
            spec["nodeSelector"] = {"pool": "a"}
        if i % 10 == 0:  # a tenth (none of them selects a pool): spread over the zones
            spec["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": ZONE,
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": app}},
                }
            ]
        requests = {"cpu": rng.choice(CPUS), "memory": rng.choice(MEMORIES)}
        shapes.append({"labels": {"app": app}, "spec": spec, "requests": requests})
    return shapes


def bench_pod(
    name: str, scheduler: str, limits: dict[str, Any], shape: dict[str, Any], claim: bool = False
) -> dict[str, Any]:
    """A pod of ``shape``; with ``claim``, using the ResourceClaim of its own name."""
    resources: dict[str, Any] = {"requests": shape["requests"], "limits": limits}
    spec: dict[str, Any] = {"schedulerName": scheduler, **shape["spec"]}
    if claim:
        resources["claims"] = [{"name": "gpu"}]
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": shape["labels"]},
        "spec": {
            **spec,
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
    }


def bench_claim(name: str, request: dict[str, Any]) -> dict[str, Any]:
    """A pod's one ResourceClaim, asking ``request`` (written directly: a template's
    claim would need kube-controller-manager)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def misplaced(shape: dict[str, Any], node: dict[str, Any]) -> bool:
    """Whether a pod landed on a node its selector or the node's taint rules out."""
    spec = shape["spec"]
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return True
    tolerated = {t["key"] for t in spec.get("tolerations") or ()}
    return any(
        t.get("effect") == "NoSchedule" and t["key"] not in tolerated
        for t in (node.get("spec") or {}).get("taints") or ()
    )


async def advertise_whole_gpus(api: kube.Client, nodes: list[dict[str, Any]]) -> None:
    """``nvidia.com/gpu`` as NVIDIA's device plugin advertises it: one per card (the
    simulator advertises HAMi's split slots). A strategic merge: the other resources,
    the labels and the taints stay as the simulator wrote them."""
    slots = asyncio.Semaphore(32)
    gpus = {"nvidia.com/gpu": str(GPUS_PER_NODE)}

    async def one(node: dict[str, Any]) -> None:
        async with slots:
            await kube.request(
                api,
                "PATCH",
                f"/api/v1/nodes/{node['metadata']['name']}/status",
                {"status": {"capacity": gpus, "allocatable": gpus}},
                content_type="application/strategic-merge-patch+json",
            )

    await asyncio.gather(*(one(n) for n in nodes))


Capacity = dict[tuple[str, str], dict[str, Fraction]]
"""Per (pool, device) of the slices, each capacity's value."""


async def publish_dra(api: kube.Client, services: Services) -> Capacity:
    """Every simulated node's ResourceSlice as the node agent's DRA driver publishes it
    (services/node_agent/dra/slices.py, from the devices the simulator publishes, same
    UUIDs), and the project's DeviceClasses (DEVICE_CLASSES). The simulator itself
    publishes no slice: only an agent on a real node does, once its kubelet registered
    the driver."""
    cfg = config_module.load(services.cfg)
    nodes = expand(load_inventory(services.inventory))
    slots = asyncio.Semaphore(32)
    capacity: Capacity = {}

    async def one(body: dict[str, Any]) -> None:
        async with slots:
            await kube.request(api, "POST", f"{RESOURCE}/resourceslices", body)

    bodies = [resource_slice(cfg, node, devices, 1) for node, (_, devices) in nodes.items()]
    for body in bodies:
        for device in body["spec"]["devices"]:
            capacity[(body["spec"]["pool"]["name"], device["name"])] = {
                k: parse_quantity(v["value"]) for k, v in device["capacity"].items()
            }
    for document in yaml.safe_load_all(DEVICE_CLASSES.read_text()):
        await kube.request(api, "POST", f"{RESOURCE}/deviceclasses", document)
    await asyncio.gather(*(one(b) for b in bodies))
    return capacity


def check_nodes(nodes: list[dict[str, Any]], count: int) -> str:
    """What both schedulers will read, checked against the shapes asked for."""
    wrong = []
    for node in nodes:
        name = node["metadata"]["name"]
        n = int(name.rsplit("-", 1)[1])
        want = node_entry(n)
        alloc = node["status"].get("allocatable") or {}
        taints = [
            {k: t.get(k, "") for k in ("key", "value", "effect")}
            for t in (node.get("spec") or {}).get("taints") or ()
        ]
        labels = node["metadata"].get("labels") or {}
        if (
            alloc.get("nvidia.com/gpu") != str(GPUS_PER_NODE)
            or any(alloc.get(k) != v for k, v in ALLOCATABLE.items())
            or taints != want["taints"]
            or any(labels.get(k) != v for k, v in want["labels"].items())
        ):
            wrong.append(name)
    if len(nodes) != count or wrong:
        raise SystemExit(
            f"{len(nodes)} nodes (want {count}); not as the shapes say: {wrong[:5]}"
            f"{' ...' if len(wrong) > 5 else ''}"
        )
    pools = Counter(n["metadata"]["labels"]["pool"] for n in nodes)
    zones = Counter(n["metadata"]["labels"][ZONE] for n in nodes)
    tainted = sum(bool((n.get("spec") or {}).get("taints")) for n in nodes)
    return (
        f"nodes: {count} (zones {dict(sorted(zones.items()))}, pools "
        f"{dict(sorted(pools.items()))}, {tainted} tainted), each allocatable "
        f"nvidia.com/gpu {GPUS_PER_NODE}, cpu {ALLOCATABLE['cpu']}, memory "
        f"{ALLOCATABLE['memory']}, pods {ALLOCATABLE['pods']}"
    )


@dataclass
class Placed(Binds):
    """:class:`Binds` that also notes each pod's node."""

    node: dict[str, str] = field(default_factory=dict)

    async def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        node = obj["spec"].get("nodeName")
        if node:
            self.node.setdefault(obj["metadata"]["name"], node)
        await super()._on_pod(kind, obj)


async def pending_reasons(api: kube.Client, ns: str, limit: int = 3) -> list[str]:
    """The last few distinct FailedScheduling messages in ``ns``."""
    events, _ = await kube.list_all(
        api, f"/api/v1/namespaces/{ns}/events", query={"fieldSelector": "reason=FailedScheduling"}
    )
    seen: dict[str, str] = {}
    for e in events:
        seen[e.get("message", "")] = e.get("involvedObject", {}).get("name", "")
    return [f"{pod}: {msg}" for msg, pod in list(seen.items())[-limit:]]


async def scheduled_events(
    api: kube.Client, ns: str, bound: int, at: Iterable[float], timeout_s: float = 120
) -> float:
    """Seconds from the last bind until ``ns`` holds a ``Scheduled`` Event for each of
    the ``bound`` pods (0 if they were there at the first look; -1 if they never came):
    a scheduler that writes its Events behind its Bindings finishes them here."""
    last_bind = max(at, default=time.monotonic())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # The whole list: with a field selector the server tells no remaining count.
        told, _ = await kube.list_all(
            api, f"/api/v1/namespaces/{ns}/events", query={"fieldSelector": "reason=Scheduled"}
        )
        if len(told) >= bound:
            return max(0.0, time.monotonic() - last_bind)
        await asyncio.sleep(0.5)
    return -1.0


async def one_run(
    api: kube.Client,
    ns: str,
    scheduler: str,
    limits: dict[str, Any],
    shapes: list[dict[str, Any]],
    nodes: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    *,
    pids: dict[str, int],
    events: bool = True,
    claim: dict[str, Any] | None = None,
    capacity: Capacity | None = None,
) -> dict[str, Any]:
    await namespace(api, ns)
    binds = Placed(api, ns, args.pods)
    binds.start()
    created: dict[str, float] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(args.pods):
        queue.put_nowait(i)

    async def writer() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            name = f"p-{i:05d}"
            if claim is not None:  # the claim first: its pod is schedulable at once
                await kube.request(
                    api,
                    "POST",
                    f"{RESOURCE}/namespaces/{ns}/resourceclaims",
                    bench_claim(name, claim),
                )
            await kube.request(
                api,
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                bench_pod(name, scheduler, limits, shapes[i], claim is not None),
            )
            created[name] = time.monotonic()

    before = cpu_seconds(pids)
    start = time.monotonic()
    await asyncio.gather(*(writer() for _ in range(args.writers)))
    create_s = time.monotonic() - start
    events_after_s = 0.0
    if scheduler != "nobody":
        await binds.wait(args.timeout, settle_s=args.settle)
    after = cpu_seconds(pids)
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    window_s = time.monotonic() - start
    if scheduler != "nobody" and events:
        events_after_s = await scheduled_events(api, ns, len(binds.at), binds.at.values())
    latencies = sorted(binds.at[n] - created[n] for n in binds.at if n in created)
    end = max(binds.at.values(), default=start)
    per_node = Counter(binds.node.values())
    create_rate = args.pods / create_s if create_s > 0 else 0.0
    bind_rate = len(binds.at) / (end - start) if binds.at else 0.0
    result = {
        "pods": args.pods,
        "bound": len(binds.at),
        "create_s": round(create_s, 2),
        "create_per_s": round(create_rate, 1),
        "total_s": round(end - start, 2),
        "pods_per_s": round(bind_rate, 1),
        "of_create": round(bind_rate / create_rate, 2) if create_rate else 0.0,
        "p50_ms": round(pct(latencies, 0.50) * 1000),
        "p99_ms": round(pct(latencies, 0.99) * 1000),
        "max_ms": round(latencies[-1] * 1000) if latencies else 0,
        "max_pods_per_node": max(per_node.values(), default=0),
        **({"events_after_s": round(events_after_s, 2)} if events else {}),
        "cpu_s": {k: round(v, 1) for k, v in used.items()},
        "cpu_window_s": round(window_s, 2),
        "machine_share": round(sum(used.values()) / ((os.cpu_count() or 1) * window_s), 2),
        "misplaced": sum(
            misplaced(shapes[int(p.rsplit("-", 1)[1])], nodes[n])
            for p, n in binds.node.items()
            if n in nodes
        ),
    }
    if claim is not None and scheduler != "nobody":
        result.update(await check_claims(api, ns, capacity or {}))
    if len(binds.at) < args.pods and scheduler != "nobody":
        result["pending_reasons"] = await pending_reasons(api, ns)
    return result


def _allocated_on(allocation: dict[str, Any]) -> list[list[str]]:
    """The node names an allocation's node selector names (``matchFields``)."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ()
    return [
        list(f.get("values") or ())
        for t in terms
        for f in t.get("matchFields") or ()
        if f.get("key") == "metadata.name"
    ]


async def check_claims(api: kube.Client, ns: str, capacity: Capacity) -> dict[str, Any]:
    """After a claim run: every claim of a bound pod allocated on the pod's node (its
    devices from that node's pool, its node selector that node) and reserved for the
    pod; no device given beyond its capacity (each capacity's ``consumedCapacity``
    summed over the claims holding it; a result without it holds the device whole),
    no whole card shared."""
    pods, _ = await kube.list_all(api, f"/api/v1/namespaces/{ns}/pods")
    claims, _ = await kube.list_all(api, f"{RESOURCE}/namespaces/{ns}/resourceclaims")
    bound = {p["metadata"]["name"]: (p["spec"].get("nodeName"), p["metadata"]["uid"]) for p in pods}
    wrong: list[str] = []
    held: dict[tuple[str, str], list[dict[str, Fraction]]] = {}
    allocated = 0
    for claim in claims:
        name = claim["metadata"]["name"]
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        results = (allocation or {}).get("devices", {}).get("results") or ()
        for r in results:
            consumed = r.get("consumedCapacity") or {}
            held.setdefault((r["pool"], r["device"]), []).append(
                {k: parse_quantity(v) for k, v in consumed.items()}
            )
        allocated += bool(allocation)
        node, uid = bound.get(name, (None, None))
        if not node:
            if allocation:
                wrong.append(f"{name}: allocated, its pod not bound")
            continue
        if not allocation or not results:
            wrong.append(f"{name}: its pod is on {node}, the claim is not allocated")
            continue
        pools = sorted({r["pool"] for r in results})
        if pools != [node] or _allocated_on(allocation) != [[node]]:
            wrong.append(
                f"{name}: its pod is on {node}, the claim allocated from {pools} for "
                f"{_allocated_on(allocation)}"
            )
        if not any(
            r.get("resource") == "pods" and r.get("uid") == uid
            for r in status.get("reservedFor") or ()
        ):
            wrong.append(f"{name}: not reserved for its pod ({status.get('reservedFor')})")
    over: list[str] = []
    for (pool, device), shares in sorted(held.items()):
        total = capacity.get((pool, device))
        if total is None:
            over.append(f"{pool}/{device}: no such device in the slices")
            continue
        for k, value in total.items():
            summed = sum((share.get(k, value) for share in shares), Fraction(0))
            if summed > value:
                over.append(f"{pool}/{device}: {k} {float(summed)} of {float(value)}")
        whole = [sh for sh in shares if all(sh.get(k, v) >= v for k, v in total.items())]
        if whole and len(shares) > 1:
            over.append(f"{pool}/{device}: a whole card shared by {len(shares)} claims")
    return {
        "claims": len(claims),
        "claims_allocated": allocated,
        "claims_wrong": len(wrong),
        "devices_overcommitted": len(over),
        **({"claim_problems": (wrong + over)[:5]} if wrong or over else {}),
    }


async def clear_claims(api: kube.Client, ns: str) -> None:
    """Delete a run's claims (after its pods), playing kube-controller-manager's
    resourceclaim controller, which does not run here: kube-scheduler puts its
    ``resource.kubernetes.io/delete-protection`` finalizer on every claim it allocates,
    and only that controller lifts it. Then check that no ResourceClaim is left anywhere
    (an allocated one left would hold its devices in the next run)."""
    claims, _ = await kube.list_all(api, f"{RESOURCE}/namespaces/{ns}/resourceclaims")
    slots = asyncio.Semaphore(32)

    async def unprotect(claim: dict[str, Any]) -> None:
        async with slots:
            with contextlib.suppress(ApiException):  # gone meanwhile
                await kube.request(
                    api,
                    "PATCH",
                    f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim['metadata']['name']}",
                    {"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json",
                )

    await asyncio.gather(*(unprotect(c) for c in claims if c["metadata"].get("finalizers")))
    await kube.request(api, "DELETE", f"{RESOURCE}/namespaces/{ns}/resourceclaims")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        page = await kube.request(api, "GET", f"{RESOURCE}/resourceclaims", query={"limit": "1"})
        if not page["items"]:
            return
        await asyncio.sleep(1.0)
    left = 1 + int(page["metadata"].get("remainingItemCount") or 0)
    raise SystemExit(f"{left} ResourceClaims still there 120 s after their deletion")


async def clear(api: kube.Client, ns: str) -> None:
    """Delete a run's pods at once (no kubelet confirms a graceful delete). A delete of
    thousands of pods can outlast the API server's request timeout (it goes on there):
    wait for the pods to go, asking again whenever progress stops."""
    asked_at = progress_at = 0.0
    left = math.inf
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if time.monotonic() - progress_at > 15 and time.monotonic() - asked_at > 15:
            asked_at = time.monotonic()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    kube.request(
                        api,
                        "DELETE",
                        f"/api/v1/namespaces/{ns}/pods",
                        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                    ),
                    timeout=5,
                )
        page = await kube.request(  # one item and a count: listing all would load the server
            api, "GET", f"/api/v1/namespaces/{ns}/pods", query={"limit": "1"}
        )
        if not page["items"]:
            return
        count = 1 + int(page["metadata"].get("remainingItemCount") or 0)
        if count < left:
            left, progress_at = count, time.monotonic()
        await asyncio.sleep(2.0)


async def run(
    args: argparse.Namespace, cluster: LocalCluster, services: Services
) -> list[dict[str, Any]]:
    api = await connect(cluster)
    async with api:
        await registered(api, args.nodes)
        nodes, _ = await kube.list_all(api, "/api/v1/nodes")
        await advertise_whole_gpus(api, nodes)
        nodes, _ = await kube.list_all(api, "/api/v1/nodes")
        print(check_nodes(nodes, args.nodes), flush=True)
        by_name = {n["metadata"]["name"]: n for n in nodes}
        shapes = pod_shapes(args.pods, args.seed)
        runs = CLAIM_RUNS if args.claims else RUNS
        capacity = await publish_dra(api, services) if args.claims else None
        if capacity is not None:
            print(
                f"ResourceSlices: {args.nodes}, one per node (driver {GPU_CLASS}), "
                f"{len(capacity)} cards; DeviceClasses of {DEVICE_CLASSES.name}",
                flush=True,
            )
        await asyncio.sleep(5)  # let every scheduler's node cache catch up
        results = []
        applied: dict[str, Any] = {}
        for i, (label, scheduler, limits, settings, claim) in enumerate(runs):
            ns = f"e2e-{i}"
            if scheduler == "tessera" and len(services.procs) < len(SERVICES):
                # Tessera's central services start once kube-scheduler's run is over: they
                # would watch its pods too, and take CPU from it on a small machine.
                await asyncio.to_thread(services.start)
                await asyncio.sleep(5)  # the ledger rebuilt, every node's inventory applied
            if scheduler == "tessera" and settings != applied:
                # only the binder reads the settings these runs change
                await asyncio.to_thread(services.restart, "binder", settings)
                applied = settings
                await asyncio.sleep(5)
            pids = {p.name: p.popen.pid for p in cluster.procs} | services.pids
            pids[BENCH] = os.getpid()
            result = {
                "run": label,
                **await one_run(
                    api,
                    ns,
                    scheduler,
                    limits,
                    shapes,
                    by_name,
                    args,
                    pids=pids,
                    events=settings.get("scheduledEvents", True),
                    claim=claim,
                    capacity=capacity,
                ),
            }
            print(json.dumps(result), flush=True)
            results.append(result)
            if i < len(runs) - 1:  # the last run's pods go with the control plane
                await clear(api, ns)
                if claim is not None:
                    await clear_claims(api, ns)
                await asyncio.sleep(args.settle)  # releases reach the ledger before the next

        return results


def _events_after(r: dict[str, Any]) -> str:
    after = r.get("events_after_s")
    if after is None:
        return "none written"
    return "not all within 120 s" if after < 0 else f"{after:.2f}"


def table(results: list[dict[str, Any]], args: argparse.Namespace, runs: list[Run]) -> str:
    """The runs side by side; each compared with kube-scheduler's run of the same claim
    (without claims: its one run)."""
    ceiling = results[0]["create_per_s"]
    kube_runs = zip(runs, results, strict=False)
    bases = {str(run.claim): r for run, r in kube_runs if run.scheduler == "default-scheduler"}
    claims = ", each with its own ResourceClaim," if args.claims else ""
    lines = [
        f"end to end on one API server: {args.nodes} simulated nodes x 8 A100-80GB, "
        f"{args.pods} realistic pods{claims} per run (seed {args.seed}), {args.writers} writers, "
        f"{os.cpu_count()} cores shared by all; the API server alone creates "
        f"{ceiling:.1f} pods/s",
        "| run | bound | created/s | pods/s | pods/s of the API server's create rate "
        "| p50 ms | p99 ms | max ms | pods/s vs kube-scheduler | p99 vs kube-scheduler "
        "| Scheduled Events done after the last bind (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run, r in zip(runs[1:], results[1:], strict=True):
        base = bases.get(str(run.claim), results[1])
        speed = r["pods_per_s"] / base["pods_per_s"] if base["pods_per_s"] else 0.0
        p99 = r["p99_ms"] / base["p99_ms"] if base["p99_ms"] else 0.0
        lines.append(
            f"| {r['run']} | {r['bound']}/{r['pods']} | {r['create_per_s']:.1f} "
            f"| {r['pods_per_s']:.1f} | {r['pods_per_s'] / ceiling:.2f} | {r['p50_ms']} "
            f"| {r['p99_ms']} | {r['max_ms']} | {speed:.2f}x | {p99:.2f}x "
            f"| {_events_after(r)} |"
        )
    return "\n".join(lines)


CLAIM_DEFAULTS: dict[str, tuple[float, float]] = {
    "pods": (5000, 2000),
    "timeout": (300, 600),
    "settle": (10, 120),
}
"""Each option's default without and with ``--claims``. At 1,000 nodes kube-scheduler
placed claims at 21-34 pods/s here with 5,000 pods (2026-11-27, 2 shared cores: 5,000
whole-card claims took 238 s) and about 60 pods/s with 2,000, so 2,000 pods keep a run
to minutes; a run still short of its pods waits up to 120 s without a bind before it
ends (a slower scheduler's binds come in bursts)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, help="5000; 2000 with --claims")
    parser.add_argument("--seed", type=int, default=1, help="of the pods' requests")
    parser.add_argument("--writers", type=int, default=32, help="creates in flight")
    parser.add_argument(
        "--timeout", type=float, help="per run, after creation: 300 s; 600 with --claims"
    )
    parser.add_argument(
        "--settle",
        type=float,
        help="a run ends after this long with no new bind: 10 s; 120 with --claims",
    )
    parser.add_argument("--keep", action="store_true", help="keep the control plane's logs")
    parser.add_argument("--log-level", default="WARNING", help="of Tessera's services")
    parser.add_argument(
        "--claims",
        action="store_true",
        help="the claim runs instead: each pod with one ResourceClaim on the nodes' slices",
    )
    args = parser.parse_args()
    chosen = {k: getattr(args, k) for k in CLAIM_DEFAULTS}
    for key, (plain, claims) in CLAIM_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, claims if args.claims else plain)
    if args.claims:
        print(
            "claim runs: "
            + ", ".join(f"--{k} {getattr(args, k):g}" for k in CLAIM_DEFAULTS)
            + " ("
            + ", ".join(f"--{k} defaulted" for k, v in chosen.items() if v is None)
            + "): kube-scheduler places claims far slower than extended resources, so "
            "fewer pods, and longer to wait for a bind",
            flush=True,
        )
    if args.pods * 3 > args.nodes * GPUS_PER_NODE * 2:
        print(
            f"e2e: {args.pods} whole-GPU pods are over 2/3 of {args.nodes * GPUS_PER_NODE} "
            "GPUs: some may find no node, and each scheduler may leave different ones",
            file=sys.stderr,
        )
    workdir = Path(tempfile.mkdtemp(prefix="tessera-bench-e2e-"))
    inventory = [node_entry(n) for n in range(args.nodes)]
    with (
        LocalCluster(workdir=workdir / "cluster", with_scheduler=True, keep=args.keep) as cluster,
        tessera(
            workdir, cluster, args.nodes, args.log_level, inventory=inventory, first=["node-agent"]
        ) as services,
    ):
        results = asyncio.run(run(args, cluster, services))
    runs = CLAIM_RUNS if args.claims else RUNS
    print(table(results, args, runs))
    cores = os.cpu_count() or 1
    print(
        f"CPU seconds per process from the first create to the last bind ({cores} cores "
        f"shared by all), and the share of "
        "the machine they add up to:"
    )
    for r in results:
        busy = sorted(r["cpu_s"].items(), key=lambda kv: -kv[1])
        print(
            f"  {r['run']} ({r['cpu_window_s']:.1f} s, {r['machine_share']:.0%} of the "
            "machine): " + ", ".join(f"{k} {v:.1f}" for k, v in busy if v >= 0.1)
        )
    for r in results[1:]:
        if r["bound"] < r["pods"]:
            print(f"{r['run']}: {r['pods'] - r['bound']} pods left pending; FailedScheduling:")
            for line in r.get("pending_reasons", []):
                print(f"  {line}")
        if r["misplaced"]:
            print(f"{r['run']}: {r['misplaced']} pods on a node their selector or taint rules out")
        if "claims" in r:
            print(
                f"{r['run']}: {r['claims_allocated']}/{r['claims']} claims allocated, "
                f"{r['claims_wrong']} not on their pod's node or not reserved for it, "
                f"{r['devices_overcommitted']} devices over-committed"
            )
            for line in r.get("claim_problems", []):
                print(f"  {line}")
    print(f"(service logs: {workdir})")


if __name__ == "__main__":
    main()
