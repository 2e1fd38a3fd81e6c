"""Differential test: Tessera's node-fit core against kube-scheduler itself, node by node.

    python bench/parity.py [--cases 10000] [--seed 1] [--show 5] [-j 2]

Generates random clusters (2-12 nodes, 0-40 bound pods, 2-4 namespaces) and one pod to
schedule per case, seeded (case ``i`` of seed ``s`` is the same on every run and
machine), and asks both sides which nodes would take the pod and why not the others:

- kube-scheduler v1.36.3's default profile, run in-process by tools/parity
  (``tessera-parity``, one process kept open, cases streamed through it);
- Tessera's core: shared/core/hosts.py parses the same objects, shared/core/nodefit.py's
  ``Hosts.prepare`` + ``Prepared.filter`` answer for every node, shared/core/status.py's
  ``counted`` renders the message.

Per node it compares feasibility, the set of reason texts and the code (Unschedulable
vs UnschedulableAndUnresolvable); a PreFilter rejection; and, when no node is feasible,
the ``0/N nodes are available: ...`` message. Each case index gives two cases (``cases``):

- a scored one (``"score": true``): besides the filters, the node ``Placer.place``
  (shared/core/placement.py) chooses under :data:`KUBE_LIKE` must be among the nodes of
  kube's highest total score (kube breaks ties at random);
- a device case (``generate_devices``): the same cluster, its nodes given NVIDIA cards
  (Tessera's inventory) advertised as extended resources (``nvidia.com/gpu``,
  ``gpumem``, ``gpucores``, or Volcano's ``vgpu-number``, ``vgpu-memory``,
  ``vgpu-cores``, ``gpu-number``: totals, as kube-scheduler sees them), bound pods
  holding slices or whole cards, and the incoming pod asking for some; Tessera's filters
  and device fit (``Placer.verdicts``) against kube's filters with NodeResourcesFit on
  those totals. Where Tessera's per-card view refuses a node that the totals allow, the
  refusal is counted under its documented class (``device_class``; docs/compat.md), not
  as a disagreement. It prints the cases and nodes compared,
the disagreements by category (the filter plugin concerned and what differs), how often
each feature and each kube reason came up (so a reason never seen is visible), and the
time per case on each side: kube as wall time through the pipe (all ``-j`` workers) and
as the harness's own per-case mean (``-stats``, one worker: decode + evaluate + encode),
Tessera as parse + build the host side + PreFilter + Filter on every node + message, on
one core. With ``--show N`` the first N disagreeing cases are shrunk (objects, list
items and fields removed while the same disagreement remains) and printed as JSON.
Exits 1 when there is any disagreement.

The generator (``generate``) is shared with tests/integration/test_parity.py. Objects
are what the API server would store: valid labels, tolerations, selectors and
resources, every namespace listed with its ``kubernetes.io/metadata.name`` label, bound
pods Running or Pending; a few deliberately odd but valid values (node affinity
``Gt: "abc"``, empty terms, zero requests) are in the mix. A fifth of the pods mount
PersistentVolumeClaims (bound, unbound, lost, being deleted, missing, generic ephemeral
ones) with their PersistentVolumes (node affinity, zone and region labels) and
StorageClasses, which shared/core/claims.py reads for Tessera; none binds late
(``WaitForFirstConsumer`` and unbound), where Tessera waits on purpose (docs/compat.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from shared.core import claims
from shared.core.framework import DEFAULT_FILTERS
from shared.core.hosts import PodSpec, node_spec, pod_spec
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceInfo,
    DeviceUUID,
    NodeName,
    PodRef,
    PodRequest,
    PodUID,
)
from shared.core.nodefit import Hosts
from shared.core.placement import GangMember, Placement, PlacementConfig, Placer
from shared.core.request import RequestParser
from shared.core.spec import DeviceSpecs
from shared.core.status import Code, Status, counted

Obj = dict[str, Any]

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
RACK = "example.com/rack"
"""A topology key only some nodes carry."""
FOO = "example.com/foo"
HUGE = "hugepages-2Mi"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

# --- the generator ---------------------------------------------------------------------

NAMESPACES = {
    "default": {},
    "team-a": {"team": "a", "env": "prod"},
    "team-b": {"team": "b", "env": "dev"},
    "sandbox": {"env": "dev"},
}
APPS = ("web", "db", "cache", "batch")
TIERS = ("front", "back")
TRACKS = ("stable", "canary")
POOLS = ("general", "gpu", "highmem")
CORES = ("2", "4", "8", "16", "007", "1_0", "abc", "99999999999999999999")
"""Values of the numeric node label ``cores`` (Gt/Lt): some parse in Python, not in Go."""
BOUNDS = ("1", "3", "4", "8", "10", "007", "abc", "1_0", "99999999999999999999")
"""Gt/Lt values: all valid label values (the API server checks that, not the number)."""

TAINTS = (
    ("dedicated", "gpu", "NoSchedule"),
    ("dedicated", "infra", "NoExecute"),
    ("spot", "", "PreferNoSchedule"),
    ("spot", "", "NoSchedule"),
    ("maintenance", "true", "NoExecute"),
    ("example.com/empty", "", "NoSchedule"),
    (UNSCHEDULABLE_TAINT, "", "NoSchedule"),
    ("gpu", "true", "PreferNoSchedule"),
)
TOLERATIONS: tuple[Obj, ...] = (
    {"operator": "Exists"},
    {"operator": "Exists", "effect": "NoSchedule"},
    {"operator": "Exists", "effect": "NoExecute"},
    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "gpu"},
    {"key": "dedicated", "operator": "", "value": "gpu", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal", "value": "infra"},
    {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
    {"key": "spot", "operator": "Exists"},
    {"key": "spot", "operator": "Equal", "value": ""},
    {"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"},
    {"key": "spot", "effect": "NoSchedule"},
    {
        "key": "maintenance",
        "operator": "Equal",
        "value": "true",
        "effect": "NoExecute",
        "tolerationSeconds": 60,
    },
    {"key": "maintenance", "operator": "Equal", "value": "false"},
    {"key": "example.com/empty", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "example.com/empty", "operator": "Equal", "value": "", "effect": ""},
    {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
    {"key": UNSCHEDULABLE_TAINT, "operator": "Exists"},
    {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoExecute"},
    {"key": "gpu", "operator": "Exists", "effect": "PreferNoSchedule"},
)

CPU_ALLOC = ("500m", "1", "2", "3500m", "4", "4", "8")
MEM_ALLOC = ("2Gi", "4Gi", "8Gi", "8Gi", "16Gi", "6000Mi")
EPH_ALLOC = ("10Gi", "20Gi", "50Gi")
HUGE_ALLOC = ("0", "64Mi", "256Mi")
FOO_ALLOC = ("0", "1", "2", "4")

CPU_REQ = ("0", "10m", "0.1m", "100m", "250m", "500m", "0.5", "5e-1", "1", "1500m", "2", "3", "5")
MEM_REQ = ("0", "64Mi", "128Mi", "512Mi", "1Gi", "1.5Gi", "3Gi", "6Gi", "12Gi", "1000M", "1e9")
EPH_REQ = ("0", "1Gi", "5Gi", "20Gi", "60Gi")
HUGE_REQ = ("2Mi", "32Mi", "64Mi", "128Mi", "512Mi")
FOO_REQ = ("0", "1", "1", "2", "3", "5")

BOUND_CPU = ("0", "50m", "100m", "200m", "250m", "500m", "1")
BOUND_MEM = ("0", "64Mi", "128Mi", "256Mi", "512Mi", "1Gi", "2Gi")

HOST_PORTS = (80, 443, 8080, 53)
HOST_IPS = (None, None, "0.0.0.0", "127.0.0.1", "10.0.0.1", "", "::")


def _pick(rng: random.Random, weighted: Sequence[tuple[Any, float]]) -> Any:
    values, weights = zip(*weighted, strict=True)
    return rng.choices(values, weights)[0]


def _node(rng: random.Random, i: int, roomy: bool) -> Obj:
    name = f"node-{i}"
    labels = {HOSTNAME: name if rng.random() < 0.97 else f"host-{i}"}
    if rng.random() < 0.85:
        labels[ZONE] = rng.choice("abc")
    if rng.random() < 0.5:
        labels[RACK] = rng.choice(("r1", "r2"))
    if rng.random() < 0.6:
        labels["pool"] = rng.choice(POOLS)
    if rng.random() < 0.3:
        labels["gpu"] = rng.choice(("true", "false"))
    if rng.random() < 0.5:
        labels["cores"] = rng.choice(CORES)
    if rng.random() < 0.1:
        labels["edge"] = ""
    node: Obj = {"metadata": {"name": name, "labels": labels}}
    spec: Obj = {}
    if rng.random() < 0.3:
        taints: list[Obj] = []
        for key, value, effect in rng.sample(TAINTS, rng.choice((1, 1, 2))):
            if any(t["key"] == key and t["effect"] == effect for t in taints):
                continue
            taint: Obj = {"key": key, "effect": effect}
            if value or rng.random() < 0.5:
                taint["value"] = value
            taints.append(taint)
        spec["taints"] = taints
    if rng.random() < 0.07:
        spec["unschedulable"] = True
    if spec:
        node["spec"] = spec
    if roomy:  # room for everything: the other filters decide
        alloc = {"cpu": "32", "memory": "128Gi", "pods": str(rng.choice((20, 110)))}
    else:
        alloc = {
            "cpu": rng.choice(CPU_ALLOC),
            "memory": rng.choice(MEM_ALLOC),
            "pods": str(rng.randint(3, 10) if rng.random() < 0.8 else 110),
        }
    if rng.random() < 0.7:
        alloc["ephemeral-storage"] = rng.choice(EPH_ALLOC)
    if rng.random() < 0.3:
        alloc[HUGE] = rng.choice(HUGE_ALLOC)
    if rng.random() < 0.3:
        alloc[FOO] = rng.choice(FOO_ALLOC)
    if rng.random() < 0.15:
        node["status"] = {"capacity": alloc}  # allocatable defaults to capacity
    else:
        node["status"] = {
            "capacity": {**alloc, "cpu": "16", "memory": "64Gi"},
            "allocatable": alloc,
        }
    return node


def _resources(
    rng: random.Random, cpu: Sequence[str], mem: Sequence[str], extras: float
) -> Obj | None:
    """A container's ``resources``: each resource in requests, limits or both (equal)."""
    wanted: dict[str, str] = {}
    if rng.random() < 0.8:
        wanted["cpu"] = rng.choice(cpu)
    if rng.random() < 0.7:
        wanted["memory"] = rng.choice(mem)
    if rng.random() < 0.2 * extras:
        wanted["ephemeral-storage"] = rng.choice(EPH_REQ)
    requests: Obj = {}
    limits: Obj = {}
    for name, value in wanted.items():
        where = _pick(rng, (("requests", 6), ("limits", 2), ("both", 2)))
        if where in ("requests", "both"):
            requests[name] = value
        if where in ("limits", "both"):
            limits[name] = value
    # Extended resources and hugepages: no overcommit (requests == limits, limits given).
    if rng.random() < 0.15 * extras:
        value = rng.choice(FOO_REQ)
        limits[FOO] = value
        if rng.random() < 0.5:
            requests[FOO] = value
    if rng.random() < 0.1 * extras and wanted.keys() & {"cpu", "memory"}:
        value = rng.choice(HUGE_REQ)
        limits[HUGE] = value
        if rng.random() < 0.5:
            requests[HUGE] = value
    out: Obj = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out or None


def _ports(rng: random.Random, host_network: bool, seen: set[tuple[Any, ...]]) -> list[Obj]:
    ports = []
    for _ in range(rng.choice((1, 1, 2))):
        port = rng.choice(HOST_PORTS)
        protocol = _pick(rng, ((None, 4), ("TCP", 2), ("UDP", 2), ("SCTP", 1)))
        ip = None if host_network else rng.choice(HOST_IPS)
        key = (ip or "0.0.0.0", protocol or "TCP", port)
        if key in seen:
            continue
        seen.add(key)
        p: Obj = {"containerPort": port}
        if not host_network:
            p["hostPort"] = port
        if protocol is not None:
            p["protocol"] = protocol
        if ip is not None:
            p["hostIP"] = ip
        ports.append(p)
    return ports


def _containers(rng: random.Random, *, bound: bool, pod_level: bool) -> Obj:
    """``containers`` and maybe ``initContainers`` (regular and restartable sidecars)."""
    cpu, mem = (BOUND_CPU, BOUND_MEM) if bound else (CPU_REQ, MEM_REQ)
    extras = 0.5 if bound else 1.0
    host_network = rng.random() < 0.03
    seen: set[tuple[Any, ...]] = set()
    out: Obj = {}

    def container(name: str, ports: bool) -> Obj:
        c: Obj = {"name": name, "image": "registry.example/app:1"}
        res = _resources(rng, cpu, mem, extras)
        if pod_level and res:
            # pod-level resources: containers keep only what cannot be set at pod level
            res = {
                k: {n: v for n, v in q.items() if n not in ("cpu", "memory")}
                for k, q in res.items()
            }
            res = {k: q for k, q in res.items() if q} or None
        if res:
            c["resources"] = res
        if ports:
            c["ports"] = _ports(rng, host_network, seen)
        return c

    port_p = 0.15 if not bound else 0.1
    out["containers"] = [
        container(f"c{i}", rng.random() < port_p) for i in range(rng.choice((1, 1, 1, 2)))
    ]
    if rng.random() < 0.25:
        inits = []
        for i in range(rng.choice((1, 1, 2))):
            sidecar = rng.random() < 0.5
            c = container(f"init{i}", rng.random() < (0.3 if sidecar else 0.1))
            if sidecar:
                c["restartPolicy"] = "Always"
            inits.append(c)
        out["initContainers"] = inits
    if host_network and any(c.get("ports") for c in out["containers"]):
        out["hostNetwork"] = True
    else:
        for c in out["containers"]:
            if host_network:
                c.pop("ports", None)
    return out


def _pod_level(rng: random.Random) -> Obj:
    """Pod-level ``resources`` (cpu/memory): requests, limits only, or both (equal)."""
    wanted = {"cpu": rng.choice(CPU_REQ[1:]), "memory": rng.choice(MEM_REQ[1:])}
    if rng.random() < 0.3:
        del wanted[rng.choice(("cpu", "memory"))]
    where = _pick(rng, (("requests", 2), ("limits", 2), ("both", 1)))
    out: Obj = {}
    if where in ("requests", "both"):
        out["requests"] = dict(wanted)
    if where in ("limits", "both"):
        out["limits"] = dict(wanted)
    return out


def _labels(rng: random.Random) -> dict[str, str]:
    labels = {}
    if rng.random() < 0.85:
        labels["app"] = _pick(rng, ((APPS[0], 4), (APPS[1], 2), (APPS[2], 1), (APPS[3], 1)))
    if rng.random() < 0.5:
        labels["tier"] = rng.choice(TIERS)
    if rng.random() < 0.2:
        labels["track"] = rng.choice(TRACKS)
    return labels


def _expression(rng: random.Random) -> Obj:
    key = _pick(rng, (("app", 5), ("tier", 3), ("track", 2)))
    vocab = {"app": APPS, "tier": TIERS, "track": TRACKS}[key]
    op = _pick(rng, (("In", 4), ("NotIn", 2), ("Exists", 2), ("DoesNotExist", 1)))
    e: Obj = {"key": key, "operator": op}
    if op in ("In", "NotIn"):
        e["values"] = rng.sample(vocab, rng.choice((1, 1, 2)))
    return e


def _selector(rng: random.Random, own: dict[str, str], *, nil: float = 0.04) -> Obj | None:
    """A label selector, often matching ``own`` labels: nil (matches nothing), ``{}``
    (everything), matchLabels and/or matchExpressions."""
    r = rng.random()
    if r < nil:
        return None
    if r < nil + 0.08:
        return {}
    sel: Obj = {}
    if rng.random() < 0.75:
        keys = [k for k in ("app", "tier") if k in own or rng.random() < 0.3]
        ml = {}
        for k in keys[: rng.choice((1, 1, 2))]:
            vocab = APPS if k == "app" else TIERS
            ml[k] = own[k] if k in own and rng.random() < 0.7 else rng.choice(vocab)
        if ml:
            sel["matchLabels"] = ml
    if rng.random() < 0.35 or not sel:
        sel["matchExpressions"] = [_expression(rng) for _ in range(rng.choice((1, 1, 2)))]
    return sel


def _ns_fields(rng: random.Random, namespaces: Sequence[str], term: Obj) -> None:
    r = rng.random()
    if r < 0.45:
        return
    if r < 0.6:
        names = rng.sample(namespaces, min(len(namespaces), rng.choice((1, 2))))
        if rng.random() < 0.1:
            names.append("ghost")  # a namespace that does not exist
        term["namespaces"] = names
    elif r < 0.78:
        term["namespaceSelector"] = {}
    elif r < 0.88:
        term["namespaceSelector"] = {
            "matchLabels": rng.choice(({"team": "a"}, {"env": "dev"}, {"env": "prod"}))
        }
    elif r < 0.95:
        term["namespaceSelector"] = {
            "matchExpressions": rng.choice(
                (
                    [{"key": "team", "operator": "NotIn", "values": ["a"]}],
                    [{"key": "env", "operator": "DoesNotExist"}],
                    [
                        {"key": "team", "operator": "NotIn", "values": ["b"]},
                        {"key": "env", "operator": "NotIn", "values": ["dev"]},
                    ],
                    [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": [rng.choice(namespaces)],
                        }
                    ],
                )
            )
        }
    else:
        term["namespaces"] = [rng.choice(namespaces)]
        term["namespaceSelector"] = {"matchLabels": {"env": rng.choice(("dev", "prod"))}}


def _affinity_term(
    rng: random.Random, own: dict[str, str], namespaces: Sequence[str], *, keys: bool = True
) -> Obj:
    sel = _selector(rng, own, nil=0.02)
    term: Obj = {"topologyKey": _pick(rng, ((ZONE, 4), (HOSTNAME, 4), (RACK, 2)))}
    if sel is not None:
        term["labelSelector"] = sel
    _ns_fields(rng, namespaces, term)
    if keys and sel is not None and rng.random() < 0.15:
        free = [k for k in ("app", "tier", "track") if k not in sel.get("matchLabels", {})]
        if free:
            chosen = rng.sample(free, rng.choice((1, 1, 2)) if len(free) > 1 else 1)
            if rng.random() < 0.6:
                term["matchLabelKeys"] = chosen[:1]
                if len(chosen) > 1:
                    term["mismatchLabelKeys"] = chosen[1:]
            else:
                term["mismatchLabelKeys"] = chosen
    return term


def _pod_affinity(
    rng: random.Random,
    own: dict[str, str],
    namespaces: Sequence[str],
    p_aff: float,
    p_anti: float,
) -> Obj | None:
    out: Obj = {}
    if rng.random() < p_aff:
        out["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                _affinity_term(rng, own, namespaces) for _ in range(rng.choice((1, 1, 2)))
            ]
        }
    if rng.random() < p_anti:
        out["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                _affinity_term(rng, own, namespaces) for _ in range(rng.choice((1, 1, 2)))
            ]
        }
    return out or None


def _node_expression(rng: random.Random) -> Obj:
    op = _pick(
        rng,
        (("In", 30), ("NotIn", 15), ("Exists", 15), ("DoesNotExist", 10), ("Gt", 15), ("Lt", 15)),
    )
    if op in ("Gt", "Lt"):
        key = "cores" if rng.random() < 0.85 else ZONE
        return {"key": key, "operator": op, "values": [rng.choice(BOUNDS)]}
    key = _pick(rng, ((ZONE, 4), ("pool", 3), ("gpu", 2), (RACK, 2), ("edge", 1), ("cores", 1)))
    if op in ("Exists", "DoesNotExist"):
        return {"key": key, "operator": op}
    vocab: Sequence[str] = {
        ZONE: ("a", "b", "c", "d"),
        "pool": (*POOLS, "batch"),
        "gpu": ("true", "false"),
        RACK: ("r1", "r2", "r3"),
        "edge": ("", "x"),
        "cores": CORES[:5],
    }[key]
    return {"key": key, "operator": op, "values": rng.sample(vocab, rng.choice((1, 1, 2)))}


def _node_affinity(rng: random.Random, nodes: Sequence[Obj]) -> Obj:
    names = [n["metadata"]["name"] for n in nodes]
    terms: list[Obj] = []
    for _ in range(_pick(rng, ((1, 6), (2, 3), (3, 1)))):
        r = rng.random()
        if r < 0.06:
            terms.append(rng.choice(({}, {"matchExpressions": []})))  # an empty term
            continue
        term: Obj = {}
        if rng.random() < 0.9:
            term["matchExpressions"] = [
                _node_expression(rng) for _ in range(rng.choice((1, 1, 2, 3)))
            ]
        if rng.random() < 0.3 or not term:
            fields = []
            for _ in range(rng.choice((1, 1, 1, 2))):
                value = rng.choice(names) if rng.random() < 0.9 else "node-99"
                fields.append(
                    {
                        "key": "metadata.name",
                        "operator": rng.choice(("In", "In", "NotIn")),
                        "values": [value],
                    }
                )
            term["matchFields"] = fields
        terms.append(term)
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}


def _spread(rng: random.Random, own: dict[str, str]) -> list[Obj]:
    out: list[Obj] = []
    seen = set()
    for _ in range(rng.choice((1, 1, 2))):
        key = _pick(rng, ((ZONE, 45), (HOSTNAME, 35), (RACK, 20)))
        when = "DoNotSchedule" if rng.random() < 0.75 else "ScheduleAnyway"
        if (key, when) in seen:
            continue
        seen.add((key, when))
        c: Obj = {
            "maxSkew": _pick(rng, ((1, 5), (2, 2), (3, 1))),
            "topologyKey": key,
            "whenUnsatisfiable": when,
        }
        sel = _selector(rng, own, nil=0.03)
        if sel is not None:
            c["labelSelector"] = sel
        if when == "DoNotSchedule" and rng.random() < 0.35:
            c["minDomains"] = rng.choice((1, 2, 3, 4))
        if rng.random() < 0.2:
            c["nodeAffinityPolicy"] = rng.choice(("Honor", "Ignore"))
        if rng.random() < 0.2:
            c["nodeTaintsPolicy"] = rng.choice(("Honor", "Ignore"))
        if sel is not None and rng.random() < 0.15:
            free = [k for k in ("app", "tier", "track") if k not in sel.get("matchLabels", {})]
            if free:
                c["matchLabelKeys"] = rng.sample(free, 1)
        out.append(c)
    return out


def _tolerations(rng: random.Random) -> list[Obj]:
    return [dict(t) for t in rng.sample(TOLERATIONS, rng.choice((1, 1, 2, 3)))]


def _namespace(rng: random.Random, namespaces: Sequence[str]) -> str:
    """Mostly the first (so pods share the incoming pod's namespace), else any."""
    return namespaces[0] if rng.random() < 0.5 else rng.choice(namespaces)


def _bound_pod(rng: random.Random, j: int, node: str, namespaces: Sequence[str]) -> Obj:
    ns = _namespace(rng, namespaces)
    labels = _labels(rng)
    meta: Obj = {"name": f"bound-{j}", "namespace": ns, "uid": f"uid-bound-{j}"}
    if labels:
        meta["labels"] = labels
    if rng.random() < 0.08:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    pod_level = rng.random() < 0.03
    spec: Obj = {
        "schedulerName": "default-scheduler",
        "nodeName": node,
        **_containers(rng, bound=True, pod_level=pod_level),
    }
    if pod_level:
        spec["resources"] = _pod_level(rng)
    if rng.random() < 0.05:
        spec["overhead"] = {"cpu": "100m", "memory": "64Mi"}
    affinity = _pod_affinity(rng, labels, namespaces, 0.05, 0.12)
    if affinity:
        spec["affinity"] = affinity
    if rng.random() < 0.1:
        spec["tolerations"] = _tolerations(rng)
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Running" if rng.random() < 0.9 else "Pending"},
    }


def _pod(rng: random.Random, nodes: Sequence[Obj], namespaces: Sequence[str]) -> Obj:
    ns = _namespace(rng, namespaces)
    labels = _labels(rng)
    meta: Obj = {"name": "incoming", "namespace": ns, "uid": "uid-incoming"}
    if labels:
        meta["labels"] = labels
    pod_level = rng.random() < 0.06
    spec: Obj = {
        "schedulerName": "default-scheduler",
        **_containers(rng, bound=False, pod_level=pod_level),
    }
    if pod_level:
        spec["resources"] = _pod_level(rng)
    if rng.random() < 0.1:
        spec["overhead"] = {"cpu": rng.choice(("50m", "250m")), "memory": "64Mi"}
    if rng.random() < 0.15:
        sel = {}
        for key, vocab in ((ZONE, ("a", "b", "c")), ("pool", POOLS), ("edge", ("",))):
            if rng.random() < 0.5:
                sel[key] = rng.choice(vocab)
        spec["nodeSelector"] = sel or {ZONE: "a"}
    affinity: Obj = {}
    if rng.random() < 0.3:
        affinity["nodeAffinity"] = _node_affinity(rng, nodes)
    elif rng.random() < 0.05:
        affinity["nodeAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [_node_expression(rng)]}}
            ]
        }
    affinity.update(_pod_affinity(rng, labels, namespaces, 0.15, 0.2) or {})
    if affinity:
        spec["affinity"] = affinity
    if rng.random() < 0.35:
        spec["tolerations"] = _tolerations(rng)
    if rng.random() < 0.3:
        spec["topologySpreadConstraints"] = _spread(rng, labels)
    return {"metadata": meta, "spec": spec}


BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
BETA_REGION = "failure-domain.beta.kubernetes.io/region"
VOLUME_ZONES = ("a", "b", "c", "d", "a__b", "b__c", "a__")
"""Zone label values of volumes (``__`` separates several; an empty one voids the label)."""
STORAGE_CLASSES: tuple[Obj, ...] = (
    {"metadata": {"name": "fast"}, "provisioner": "example.com/disk"},
    {
        "metadata": {"name": "late"},
        "provisioner": "example.com/disk",
        "volumeBindingMode": "WaitForFirstConsumer",
    },
)
CLAIM_STATES = (
    ("bound", 60),
    ("no-pv", 4),
    ("unbound", 8),
    ("half-bound", 3),
    ("lost", 3),
    ("deleting", 3),
    ("missing", 5),
    ("foreign", 3),
)


def _persistent_volume(rng: random.Random, name: str, nodes: Sequence[Obj]) -> Obj:
    """A volume: node affinity (a node's hostname, or any node expression; now and
    then a ``metadata.name`` field, which a volume's terms never match), zone labels."""
    spec: Obj = {
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "hostPath": {"path": f"/data/{name}"},
    }
    if rng.random() < 0.5:
        terms = []
        for _ in range(rng.choice((1, 1, 2))):
            r = rng.random()
            if r < 0.5:
                hosts = [n["metadata"]["labels"][HOSTNAME] for n in nodes]
                expr = {"key": HOSTNAME, "operator": "In", "values": rng.sample(hosts, 1)}
                terms.append({"matchExpressions": [expr]})
            elif r < 0.95:
                terms.append({"matchExpressions": [_node_expression(rng)]})
            else:
                node = rng.choice(nodes)["metadata"]["name"]
                field = {"key": "metadata.name", "operator": "In", "values": [node]}
                terms.append({"matchFields": [field]})
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
    meta: Obj = {"name": name}
    if rng.random() < 0.4:
        keys = rng.sample((ZONE, BETA_ZONE, REGION, BETA_REGION), rng.choice((1, 1, 2)))
        meta["labels"] = {k: rng.choice(VOLUME_ZONES) for k in keys}
    return {"metadata": meta, "spec": spec}


def _volumes(rng: random.Random, case: Obj) -> None:
    """Give the case's pod claim-backed volumes, with their claims, volumes and classes
    in the case; some nodes get region and beta zone labels."""
    pod = case["pod"]
    ns, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
    pvcs: list[Obj] = []
    pvs: list[Obj] = []
    volumes: list[Obj] = []
    for i in range(rng.choice((1, 1, 2, 3))):
        ephemeral = rng.random() < 0.2
        name = f"vol-{i}"
        claim = f"{pod['metadata']['name']}-{name}" if ephemeral else f"data-{i}"
        if ephemeral:
            template = {"spec": {"accessModes": ["ReadWriteOnce"]}}
            volumes.append({"name": name, "ephemeral": {"volumeClaimTemplate": template}})
        else:
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim}})
        state = _pick(rng, CLAIM_STATES)
        if state == "missing":
            continue
        meta: Obj = {"name": claim, "namespace": ns}
        spec: Obj = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        }
        storage_class = rng.choice((None, "", "fast", "late", "gone"))
        if state == "unbound" and storage_class == "late":
            storage_class = "fast"  # unbound and bound late: Tessera waits on purpose
        if storage_class is not None:
            spec["storageClassName"] = storage_class
        owner = uid if state != "foreign" else "uid-other"
        if ephemeral or state == "foreign":
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": owner, "controller": True}
            ]
        phase = "Pending"
        if state != "unbound":
            spec["volumeName"] = f"pv-{i}"
            if state != "half-bound":
                meta["annotations"] = {claims.BIND_COMPLETED: "yes"}
            phase = "Lost" if state == "lost" else "Bound"
            if state != "no-pv":
                pvs.append(_persistent_volume(rng, f"pv-{i}", case["nodes"]))
        if state == "deleting":
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            meta["finalizers"] = ["kubernetes.io/pvc-protection"]
        pvcs.append({"metadata": meta, "spec": spec, "status": {"phase": phase}})
    pod["spec"]["volumes"] = volumes
    for n in case["nodes"]:
        labels = n["metadata"]["labels"]
        if rng.random() < 0.3:
            labels[REGION] = rng.choice("abcd")
        if rng.random() < 0.2:
            labels[BETA_ZONE] = labels.get(ZONE) or rng.choice("abcd")
    case["persistentVolumeClaims"] = pvcs
    case["persistentVolumes"] = pvs
    case["storageClasses"] = [copy.deepcopy(c) for c in STORAGE_CLASSES]


def generate(seed: int, index: int) -> Obj:
    """Case ``index`` of ``seed``: the same on every run (its own random stream)."""
    rng = random.Random(f"parity:{seed}:{index}")
    names = ["default", *rng.sample(["team-a", "team-b", "sandbox"], rng.choice((1, 2, 2, 3)))]
    namespaces = [
        {
            "metadata": {
                "name": n,
                "labels": {**NAMESPACES[n], "kubernetes.io/metadata.name": n},
            }
        }
        for n in names
    ]
    roomy = rng.random() < 0.4
    nodes = [
        _node(rng, i, roomy) for i in range(_pick(rng, [(n, 12 - n // 2) for n in range(2, 13)]))
    ]
    count = 0 if rng.random() < 0.08 else min(40, int(rng.triangular(1, 41, 8)))
    on = [n["metadata"]["name"] for n in nodes]
    pods = [
        # now and then a pod still on a node whose Node object is gone
        _bound_pod(rng, j, rng.choice(on) if rng.random() < 0.99 else "node-gone", names)
        for j in range(count)
    ]
    case = {
        "id": index,
        "nodes": nodes,
        "pods": pods,
        "namespaces": namespaces,
        "pod": _pod(rng, nodes, names),
    }
    volumes = random.Random(f"parity-volumes:{seed}:{index}")  # the cases before kept theirs
    if volumes.random() < 0.2:
        _volumes(volumes, case)
    images = random.Random(f"parity-images:{seed}:{index}")
    if images.random() < 0.3:
        _images(images, case)
    return case


IMAGES = (
    # (the names a node lists, what a pod writes, size in MiB)
    (
        ("registry.example/base:latest", "registry.example/base@sha256:0b1c"),
        "registry.example/base",
        300,
    ),
    (("registry.example/cuda:12",), "registry.example/cuda:12", 2600),
    (("registry.example/app:1",), "registry.example/app:1", 30),
    (("registry.example/tiny:1",), "registry.example/tiny:1", 5),
    (("localhost:5000/tool:latest",), "localhost:5000/tool", 900),
    (("registry.example/torch@sha256:9f2e",), "registry.example/torch@sha256:9f2e", 1500),
)
"""Images for ImageLocality: untagged names (``:latest`` added), a registry port, a
digest, sizes on both sides of its 23 MiB floor and 1000 MiB per container ceiling."""


def _images(rng: random.Random, case: Obj) -> None:
    """Node ``status.images`` drawn from :data:`IMAGES`, and the pod's containers
    running some of them (ImageLocality's score)."""
    for node in case["nodes"]:
        held = rng.sample(IMAGES, rng.randint(0, len(IMAGES)))
        node["status"]["images"] = [
            {"names": list(names), "sizeBytes": size << 20} for names, _, size in held
        ]
    spec = case["pod"]["spec"]
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or ():
            c["image"] = rng.choice(IMAGES)[1]


def features(case: Obj) -> set[str]:
    """What a case exercises (for the coverage figures)."""
    out = set()
    pod = case["pod"]
    spec = pod["spec"]
    text = json.dumps(spec)
    if any(n.get("spec", {}).get("taints") for n in case["nodes"]):
        out.add("node taints")
    if any(n.get("spec", {}).get("unschedulable") for n in case["nodes"]):
        out.add("cordoned node")
    if any("allocatable" not in n["status"] for n in case["nodes"]):
        out.add("node capacity only")
    bound = case["pods"]
    if any(p["metadata"].get("deletionTimestamp") for p in bound):
        out.add("terminating bound pod")
    if any(p["spec"].get("affinity", {}).get("podAntiAffinity") for p in bound):
        out.add("bound pod anti-affinity")
    if any('"hostPort"' in json.dumps(p["spec"]) or p["spec"].get("hostNetwork") for p in bound):
        out.add("bound pod host ports")
    for name, needle in (
        ("pod: extended resource", FOO),
        ("pod: hugepages", HUGE),
        ("pod: ephemeral-storage", "ephemeral-storage"),
        ("pod: limits only", '"limits"'),
        ("pod: host ports", '"containerPort"'),
        ("pod: sidecar", '"restartPolicy"'),
        ("pod: tolerations", '"tolerations"'),
        ("pod: node selector", '"nodeSelector"'),
        ("pod: required node affinity", '"nodeSelectorTerms"'),
        ("pod: matchFields", '"matchFields"'),
        ("pod: Gt/Lt", '"operator": "Gt"'),
        ("pod: pod affinity", '"podAffinity"'),
        ("pod: pod anti-affinity", '"podAntiAffinity"'),
        ("pod: namespaceSelector", '"namespaceSelector"'),
        ("pod: matchLabelKeys", "LabelKeys"),
        ("pod: topology spread", '"topologySpreadConstraints"'),
        ("pod: spread minDomains", '"minDomains"'),
        ("pod: spread inclusion policy", "Policy"),
        ("pod: overhead", '"overhead"'),
    ):
        if needle in text:
            out.add(name)
    if '"operator": "Lt"' in text:
        out.add("pod: Gt/Lt")
    if spec.get("initContainers"):
        out.add("pod: init containers")
    if any(n["status"].get("images") for n in case["nodes"]):
        out.add("node images")
    if isinstance(spec.get("resources"), dict):
        out.add("pod: pod-level resources")
    if spec.get("volumes"):
        out.add("pod: claimed volumes")
    if any(v.get("ephemeral") for v in spec.get("volumes") or ()):
        out.add("pod: generic ephemeral volume")
    volumes = case.get("persistentVolumes") or ()
    if any(v["spec"].get("nodeAffinity") for v in volumes):
        out.add("volume: node affinity")
    if any(v["metadata"].get("labels") for v in volumes):
        out.add("volume: zone labels")
    return out


# --- the two sides ---------------------------------------------------------------------


def harness_binary() -> Path:
    """tools/parity built at the pinned release (minutes the first time, then cached)."""
    from tools.localcluster import ensure_binaries

    return ensure_binaries(["tessera-parity"]) / "tessera-parity"


class Kube:
    """One ``tessera-parity`` process; cases streamed through it in order."""

    def __init__(self, binary: Path, workers: int = 2, stats: bool = False) -> None:
        args = [str(binary), "-j", str(workers)]
        if stats:
            args.append("-stats")
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=1 << 20,
        )
        self.workers = workers
        self.cases = 0
        self.seconds = 0.0

    def run(self, cases: Sequence[Obj]) -> list[Obj]:
        """The harness's answer to each case, in order."""
        lines = [
            json.dumps(
                {k: v for k, v in c.items() if k not in TESSERA_ONLY}, separators=(",", ":")
            ).encode()
            + b"\n"
            for c in cases
        ]
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None
        assert stdout is not None
        failed: list[BaseException] = []

        def write() -> None:
            try:
                for line in lines:
                    stdin.write(line)
                stdin.flush()
            except OSError as exc:  # the process died; the reader reports it
                failed.append(exc)

        start = time.perf_counter()
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        out = []
        for _ in lines:
            line = stdout.readline()
            if not line:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"tessera-parity exited: {err[-2000:]} {failed}")
            out.append(json.loads(line))
        writer.join()
        self.seconds += time.perf_counter() - start
        self.cases += len(lines)
        return out

    def close(self) -> str:
        """End the process; what it printed on stderr (the ``-stats`` figures)."""
        try:
            _, err = self.proc.communicate(timeout=30)  # closes stdin: the harness ends
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode()


CODE_NAMES = {
    Code.UNSCHEDULABLE: "Unschedulable",
    Code.UNRESOLVABLE: "UnschedulableAndUnresolvable",
    Code.ERROR: "Error",
}

Verdict = tuple[str, frozenset[str]] | None
"""None: feasible; else (code, reason texts)."""


@dataclass
class Answer:
    """One side's answer to a case."""

    prefilter: Verdict = None
    nodes: dict[str, Verdict] = field(default_factory=dict)
    message: str = ""
    error: str = ""
    plugins: dict[str, str] = field(default_factory=dict)
    """The plugin that decided each rejection, as each side's Status names it (the
    PreFilter's under ``PREFILTER``)."""

    def plugin(self, node: str) -> str:
        """The plugin that rejected ``node`` (or the PreFilter's), "?" if none is named."""
        return self.plugins.get(node) or "?"


PREFILTER = ""
"""The key of the PreFilter's plugin in ``Answer.plugins`` (no node has this name)."""


def kube_answer(result: Obj) -> Answer:
    pre = result.get("prefilter")
    nodes: dict[str, Verdict] = {}
    plugins = {PREFILTER: pre.get("plugin") or ""} if pre else {}
    for name, r in (result.get("nodes") or {}).items():
        nodes[name] = None if r["feasible"] else (r["code"], frozenset(r.get("reasons") or ()))
        if not r["feasible"]:
            plugins[name] = r.get("plugin") or ""
    return Answer(
        prefilter=(pre["code"], frozenset(pre["reasons"] or ())) if pre else None,
        nodes=nodes,
        plugins=plugins,
        message=histogram(result.get("message") or ""),
        error=result.get("error") or "",
    )


def histogram(message: str) -> str:
    """``0/N nodes are available: ... .`` without what kube appends after it."""
    cut = message.find(". ")
    return message[: cut + 1] if cut >= 0 else message


def tessera_answer(case: Obj, clock: list[float] | None = None) -> Answer:
    """Tessera's core on a case, as the watcher feeds it (bound, non-terminal pods).
    ``clock`` (two floats) accumulates the seconds spent parsing the objects into the
    host side, and in PreFilter + Filter + message."""
    began = time.perf_counter()
    hosts = Hosts()
    for ns in case["namespaces"]:
        hosts.set_namespace(ns["metadata"]["name"], ns["metadata"].get("labels") or {})
    for n in case["nodes"]:
        hosts.set_spec(node_spec(n))
    for uid, node, p in _assigned(case):
        hosts.add_pod(uid, node, pod_spec(p))
    names = [n["metadata"]["name"] for n in case["nodes"]]
    incoming = _incoming(case)
    parsed = time.perf_counter()
    answer = _fit(hosts, incoming, names)
    if clock is not None:
        clock[0] += parsed - began
        clock[1] += time.perf_counter() - parsed
    return answer


def _assigned(case: Obj) -> Iterator[tuple[PodUID, str, Obj]]:
    """The case's pods the watcher counts on a node: bound, phase not terminal."""
    for p in case["pods"]:
        node = p["spec"].get("nodeName")
        if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            yield PodUID(p["metadata"]["uid"]), node, p


def _incoming(case: Obj, managed: frozenset[str] = frozenset()) -> PodSpec:
    """The pod to schedule as node fit reads it (``managed``: device names left out),
    its claims resolved against the case's."""
    incoming = pod_spec(case["pod"], managed)
    uses = claims.pod_uses(case["pod"])
    if uses is not None:
        incoming = replace(incoming, claims=claims.claims_of(uses, _records(case).get)[0])
    return incoming


def _records(case: Obj) -> dict[claims.Key, claims.Record]:
    """The case's claims, volumes and classes as the watcher keeps them."""
    records: dict[claims.Key, claims.Record] = {}
    for c in case.get("persistentVolumeClaims") or ():
        key = f"{c['metadata'].get('namespace') or 'default'}/{c['metadata']['name']}"
        records["pvc", key] = claims.pvc_record(c)
    for v in case.get("persistentVolumes") or ():
        records["pv", v["metadata"]["name"]] = claims.pv_record(v)
    for c in case.get("storageClasses") or ():
        records["class", c["metadata"]["name"]] = claims.class_record(c)
    return records


def _fit(hosts: Hosts, incoming: PodSpec, names: list[str]) -> Answer:
    prep = hosts.prepare(incoming)
    if isinstance(prep, Status):
        verdict = (CODE_NAMES[prep.code], frozenset(r.text() for r in prep.reasons))
        return Answer(
            prefilter=verdict,
            nodes=dict.fromkeys(names, verdict),
            message=histogram(prep.message()),
            plugins={PREFILTER: prep.plugin},
        )
    nodes: dict[str, Verdict] = {}
    plugins: dict[str, str] = {}
    rejected = []
    for name in names:
        status = prep.filter(hosts.nodes[name])  # type: ignore[index]
        if status is None:
            nodes[name] = None
            continue
        rejected.append(status)
        nodes[name] = (CODE_NAMES[status.code], frozenset(r.text() for r in status.reasons))
        plugins[name] = status.plugin
    message = "" if len(rejected) < len(names) else counted(rejected, len(names)).message()
    return Answer(nodes=nodes, message=histogram(message), plugins=plugins)


@dataclass(frozen=True)
class Disagreement:
    category: str
    node: str = ""
    kube: Any = None
    tessera: Any = None


def compare(kube: Answer, tessera: Answer) -> list[Disagreement]:
    """Every difference between the two answers, each with its category."""
    if kube.error:
        return [Disagreement("harness error", kube=kube.error)]
    if tessera.error:
        return [Disagreement("Tessera raised", tessera=tessera.error)]
    if kube.prefilter is not None or tessera.prefilter is not None:
        kp, tp = kube.plugin(PREFILTER), tessera.plugin(PREFILTER)
        if kube.prefilter == tessera.prefilter and kp == tp:
            out = []
        else:
            cat = f"{kp if kube.prefilter else tp}: PreFilter rejection differs"
            if kube.prefilter == tessera.prefilter:
                cat = f"{kp} (kube) vs {tp} (Tessera): PreFilter plugin differs"
            out = [Disagreement(cat, kube=_show(kube.prefilter), tessera=_show(tessera.prefilter))]
    else:
        out = []
        for name, k in kube.nodes.items():
            t = tessera.nodes.get(name)
            kp, tp = kube.plugin(name), tessera.plugin(name)
            if k == t and (k is None or kp == tp):
                continue
            if t is None:
                cat = f"{kp}: kube rejects, Tessera accepts"
            elif k is None:
                cat = f"{tp}: Tessera rejects, kube accepts"
            elif kp != tp:
                cat = f"{kp} (kube) vs {tp} (Tessera)"
            elif k[1] != t[1]:
                cat = f"{kp}: reasons differ"
            else:
                cat = f"{kp}: code differs"
            out.append(Disagreement(cat, name, _show(k), _show(t)))
    if not out and kube.message != tessera.message:
        out.append(Disagreement("message", kube=kube.message, tessera=tessera.message))
    return out


def _show(v: Verdict) -> Any:
    return "feasible" if v is None else {"code": v[0], "reasons": sorted(v[1])}


def check(kube: Kube, cases: Sequence[Obj]) -> list[list[Disagreement]]:
    """Both sides on ``cases``: each case's disagreements."""
    results = kube.run(cases)
    return [evaluate(c, r).diffs for c, r in zip(cases, results, strict=True)]


def _tessera_or_error(case: Obj, clock: list[float] | None = None) -> Answer:
    try:
        return tessera_answer(case, clock)
    except Exception as exc:  # a crash is a disagreement of its own
        return Answer(error=f"{type(exc).__name__}: {exc}")


# --- device cases ----------------------------------------------------------------------

SPECS = DeviceSpecs()
PARSER = RequestParser(SPECS)
MANAGED = frozenset(PARSER.table.by_name)
"""Tessera's device names: its node fit leaves them to the device families."""
SPLIT = SPECS.nvidia.device_split_count
FLAVOURS: dict[str, dict[str, str]] = {
    "hami": {
        "count": "nvidia.com/gpu",
        "memory": "nvidia.com/gpumem",
        "cores": "nvidia.com/gpucores",
    },
    "volcano": {
        "count": "volcano.sh/vgpu-number",
        "memory": "volcano.sh/vgpu-memory",
        "cores": "volcano.sh/vgpu-cores",
        "whole": "volcano.sh/gpu-number",
    },
}
"""The names a node's device plugin advertises and pods ask for, per upstream."""
CARDS = (("NVIDIA-A100-SXM4-80GB", 81920), ("NVIDIA-A100-PCIE-40GB", 40960))
BOUND_MIB = (2000, 5000, 10000, 20000, 40000)
WANT_MIB = (None, 4000, 10000, 20000, 30000, 40000)
"""Per-card memory the incoming pod asks (None: none named, the whole card's); never
above the smallest card, so no request is refused as larger than every card."""
TESSERA_ONLY = ("kind", "inventory", "grants")
"""Case fields the harness is not sent: the devices as Tessera's inventory describes
them, and what the bound pods hold of them (card index, MiB, cores, whole)."""


def _limits(container: Obj, limits: dict[str, str]) -> None:
    """Device names in a container's limits (and requests, which must then equal them)."""
    res = container.setdefault("resources", {})
    res.setdefault("limits", {}).update(limits)
    if "requests" in res:
        res["requests"].update(limits)


def _advertise(node: Obj, names: dict[str, str], cards: list[list[Any]]) -> None:
    """What the device plugin registers, as kube-scheduler sees it: totals per node."""
    adv = {
        names["count"]: str(len(cards) * SPLIT),
        names["memory"]: str(sum(mib for _, mib in cards)),
        names["cores"]: str(100 * len(cards)),
    }
    if "whole" in names:
        adv[names["whole"]] = str(len(cards))
    for key in ("capacity", "allocatable"):
        if key in node["status"]:
            node["status"][key].update(adv)


def generate_devices(seed: int, index: int) -> Obj:
    """A device case: case ``index`` of ``seed`` (the same cluster and filters), its nodes
    given cards (advertised as extended resources), some bound pods holding slices or
    whole cards of them, and the incoming pod asking for devices in one flavour's names."""
    case = generate(seed, index)
    rng = random.Random(f"parity-devices:{seed}:{index}")
    names = FLAVOURS[rng.choice(sorted(FLAVOURS))]
    inventory: dict[str, list[list[Any]]] = {}
    for n in case["nodes"]:
        k = rng.choice((0, 1, 1, 2, 2, 4))
        if k:
            model, mib = rng.choice(CARDS)
            inventory[n["metadata"]["name"]] = cards = [[model, mib] for _ in range(k)]
            _advertise(n, names, cards)
    used = {node: [[0, 0, 0, False] for _ in cards] for node, cards in inventory.items()}
    grants: dict[str, list[list[Any]]] = {}
    for p in case["pods"]:
        node = p["spec"]["nodeName"]
        cards = inventory.get(node)
        if not cards or rng.random() < 0.4:
            continue
        use = used[node]
        if "whole" in names and rng.random() < 0.25:
            idle = [i for i, u in enumerate(use) if not u[0]]
            if not idle:
                continue
            i = rng.choice(idle)
            use[i] = [1, cards[i][1], 100, True]
            held = [[i, cards[i][1], 100, True]]
            limits = {names["whole"]: "1"}
        else:
            count, mib = rng.choice((1, 1, 1, 2)), rng.choice(BOUND_MIB)
            cores = rng.choice((0, 0, 10, 30))
            room = [
                i
                for i, u in enumerate(use)
                if not u[3] and u[0] < SPLIT and cards[i][1] - u[1] >= mib and u[2] + cores <= 90
            ]
            if len(room) < count:
                continue
            held = [[i, mib, cores, False] for i in sorted(rng.sample(room, count))]
            for i, _, _, _ in held:
                use[i][0] += 1
                use[i][1] += mib
                use[i][2] += cores
            limits = {names["count"]: str(count), names["memory"]: str(mib)}
            if cores:
                limits[names["cores"]] = str(cores)
        grants[p["metadata"]["uid"]] = held
        _limits(p["spec"]["containers"][0], limits)
    if "whole" in names and rng.random() < 0.2:
        want = {names["whole"]: str(rng.choice((1, 1, 2)))}
    else:
        want = {names["count"]: str(rng.choice((1, 1, 1, 2, 3)))}
        mib = rng.choice(WANT_MIB)
        if mib:
            want[names["memory"]] = str(mib)
        cores = rng.choice((None, None, 10, 30, 60))
        if cores:
            want[names["cores"]] = str(cores)
    _limits(case["pod"]["spec"]["containers"][0], want)
    case.update(kind="devices", inventory=inventory, grants=grants)
    return case


def _uuid(node: str, index: int) -> DeviceUUID:
    return DeviceUUID(f"GPU-{node}-{index}")


def _ledger(case: Obj) -> Ledger:
    """The case as the allocator's ledger holds it: Node objects, every card of the
    inventory, the bound pods (those holding devices as their grants)."""
    ledger = Ledger(SPECS)
    hosts = ledger.hosts
    for ns in case["namespaces"]:
        hosts.set_namespace(ns["metadata"]["name"], ns["metadata"].get("labels") or {})
    for n in case["nodes"]:
        ledger.set_spec(node_spec(n))
    inventory = case.get("inventory") or {}
    for node, cards in inventory.items():
        devices = [
            DeviceInfo(uuid=_uuid(node, i), index=i, vendor="nvidia", model=m, memory_mib=mib)
            for i, (m, mib) in enumerate(cards)
        ]
        ledger.set_node(NodeName(node), devices)
    held = case.get("grants") or {}
    for uid, node, p in _assigned(case):
        spec = pod_spec(p, MANAGED)
        if uid not in held:
            hosts.add_pod(uid, node, spec)
            continue
        devices = tuple(
            DeviceGrant(
                uuid=_uuid(node, i),
                index=i,
                model=inventory[node][i][0],
                memory_mib=mib,
                cores=cores,
                exclusive=whole,
            )
            for i, mib, cores, whole in held[uid]
        )
        container = ContainerGrant(container=p["spec"]["containers"][0]["name"], devices=devices)
        ref = PodRef(namespace=p["metadata"]["namespace"], name=p["metadata"]["name"], uid=uid)
        ledger.grant(PodGrant(pod=ref, node=NodeName(node), containers=(container,), spec=spec))
    return ledger


def _incoming_ref(case: Obj) -> PodRef:
    meta = case["pod"]["metadata"]
    return PodRef(namespace=meta["namespace"], name=meta["name"], uid=PodUID(meta["uid"]))


def _request(case: Obj) -> PodRequest:
    parsed = PARSER.parse(case["pod"])
    if not isinstance(parsed, PodRequest):
        raise ValueError(f"Tessera refuses the request: {[e.message for e in parsed]}")
    return parsed


@dataclass
class DeviceAnswer:
    """Tessera on a device case: its filters alone, and filters + device fit."""

    filters: Answer
    full: dict[str, Verdict]
    request: PodRequest


def tessera_devices(case: Obj) -> DeviceAnswer:
    """Tessera's answer per node on a device case: shared/core/nodefit.py's filters (the
    device names left out, as the allocator parses pods), then ``Placer.verdicts``
    (shared/core/placement.py: the filters, then the device families on the node's cards
    as the ledger holds them)."""
    ledger = _ledger(case)
    names = [n["metadata"]["name"] for n in case["nodes"]]
    spec = _incoming(case, MANAGED)
    request = _request(case)
    filters = _fit(ledger.hosts, spec, names)
    status, answers = Placer(ledger).verdicts(GangMember(_incoming_ref(case), request, spec=spec))
    if not answers:  # refused before any node: every node says so
        verdict = (CODE_NAMES[status.code], frozenset(r.text() for r in status.reasons))
        return DeviceAnswer(filters, dict.fromkeys(names, verdict), request)
    full = {
        name: None if s is None else (CODE_NAMES[s.code], frozenset(r.text() for r in s.reasons))
        for name, s in answers
    }
    return DeviceAnswer(filters, full, request)


def device_class(case: Obj, node: str, request: PodRequest) -> str | None:
    """Why Tessera's device fit may refuse ``node`` where kube-scheduler's totals take the
    pod (docs/compat.md, "Devices as kube-scheduler sees them"): the first documented
    class that applies, computed from the case's cards and grants alone; None if none
    does (then the refusal is a disagreement)."""
    cards = (case.get("inventory") or {}).get(node) or []
    use = [[0, 0, 0, False] for _ in cards]
    for p in case["pods"]:
        if p["spec"].get("nodeName") == node:
            for i, mib, cores, whole in (case.get("grants") or {}).get(p["metadata"]["uid"], ()):
                u = use[i]
                use[i] = [u[0] + 1, u[1] + mib, u[2] + cores, u[3] or whole]
    for r in (d for c in request.containers for d in c.devices):
        if r.count > len(cards):
            return "count above the node's cards"
        if r.exclusive:
            if sum(1 for u in use if not u[0]) < r.count:
                return "whole card already shared"
            continue
        shared = [i for i, u in enumerate(use) if not u[3] and u[0] < SPLIT]
        if len(shared) < r.count:
            return "card held whole"
        mem_ok = [
            i
            for i in shared
            if cards[i][1] - use[i][1]
            >= (r.memory_mib if r.memory_mib is not None else cards[i][1])
        ]
        if len(mem_ok) < r.count:
            return "per-card memory"
        if sum(1 for i in mem_ok if use[i][2] + r.cores <= 100) < r.count:
            return "per-card cores"
    return None


BEFORE_DEVICES = DEFAULT_FILTERS[: DEFAULT_FILTERS.index("NodeResourcesFit") + 1]
"""The filter plugins that run before (or as) NodeResourcesFit checks the device names
(tools/parity/README.md, "What runs"): kube stops at the first that refuses."""


def _managed(reason: str) -> bool:
    return reason.startswith("Insufficient ") and reason[len("Insufficient ") :] in MANAGED


def compare_devices(
    case: Obj, kube: Answer, t: DeviceAnswer
) -> tuple[list[Disagreement], Counter[str]]:
    """A device case: the PreFilter and every node as :func:`compare` does, on kube's
    reasons less those about device names (NodeResourcesFit on the advertised totals).
    Where only those remain, kube's refusal must be a refusal of Tessera's devices; a
    node Tessera's devices refuse while kube takes it must fall in a documented class
    (counted, not a disagreement). The message is not compared (the device reasons are
    Tessera's own)."""
    if kube.error or t.filters.error or kube.prefilter is not None or t.filters.prefilter:
        return [d for d in compare(kube, t.filters) if d.category != "message"], Counter()
    out: list[Disagreement] = []
    classes: Counter[str] = Counter()
    for name, k in kube.nodes.items():
        f, full = t.filters.nodes.get(name), t.full.get(name)
        rest = frozenset(r for r in k[1] if not _managed(r)) if k is not None else frozenset()
        devices = k is not None and rest != k[1]
        if f is not None or rest:
            if k is not None and f is not None and rest == f[1] and (devices or k[0] == f[0]):
                continue
            decided = t.filters.plugin(name)
            if devices and not rest and f is not None and decided not in BEFORE_DEVICES:
                continue  # kube stopped at NodeResourcesFit, before Tessera's plugin
            kube_side = (k[0], rest) if k is not None and rest else (None if devices else k)
            out.extend(
                compare(
                    Answer(nodes={name: kube_side}, plugins={name: kube.plugin(name)}),
                    Answer(nodes={name: f}, plugins={name: decided}),
                )
            )
            continue
        if (k is None) == (full is None):
            continue
        if full is None:
            out.append(Disagreement("devices: kube rejects, Tessera accepts", name, _show(k)))
            continue
        found = device_class(case, name, t.request)
        if found is None:
            cat = "devices: Tessera rejects, kube accepts (no documented class)"
            out.append(Disagreement(cat, name, "feasible", _show(full)))
        else:
            classes[found] += 1
    return out, classes


# --- the node chosen -------------------------------------------------------------------

KUBE_LIKE = PlacementConfig(node_policy="spread", fragmentation_guard=0)
"""The profile that mimics kube-scheduler's default scores for a pod without devices
(docs/compat.md, "Choosing a node"): ``nodePolicy: spread`` scores the feasible nodes of
a window of ``scoreWindow`` (16, above any case's node count) with ``Prepared.score``
(shared/core/nodefit.py: LeastAllocated, BalancedAllocation, PreferNoSchedule taints,
preferred node and pod affinity, ScheduleAnyway spread, with kube's weights), and
``fragmentationGuard: 0`` turns the FGD choice off."""


def tessera_choice(case: Obj) -> str | None:
    """The node ``Placer.place`` (shared/core/placement.py) picks under :data:`KUBE_LIKE`."""
    placed = Placer(_ledger(case), KUBE_LIKE).place(
        _incoming_ref(case), _request(case), spec=_incoming(case, MANAGED)
    )
    return placed.node if isinstance(placed, Placement) else None


def compare_choice(result: Obj, chosen: str | None) -> list[Disagreement]:
    """Tessera's node must be among the nodes of kube's highest total score (the
    scheduler breaks ties at random); with no score (no feasible node) it places none."""
    scores: dict[str, Obj] = result.get("scores") or {}
    if not scores:
        if chosen is None:
            return []
        return [Disagreement("choice: Tessera places, kube scores no node", chosen)]
    best = max(s["total"] for s in scores.values())
    top = sorted(n for n, s in scores.items() if s["total"] == best)
    if chosen in top:
        return []
    theirs = scores.get(chosen or "", {}).get("total")
    return [
        Disagreement(
            "choice: Tessera's node is not among kube's best",
            chosen or "",
            {"best": top, "total": best},
            {"node": chosen, "kube's total for it": theirs},
        )
    ]


SCORE_ERROR = ("running PreScore plugin", "running Score plugin")
KUBE_SCORE_ERROR = "kube's scoring fails the cycle (preferred Gt/Lt not an integer)"


def replace_error(answer: Answer) -> Answer:
    """``answer`` without its error (the filters' verdicts stand)."""
    return Answer(answer.prefilter, answer.nodes, answer.message, plugins=answer.plugins)


@dataclass
class Outcome:
    """One case's comparison: disagreements, documented device differences by class,
    and whether a node choice was compared."""

    diffs: list[Disagreement]
    classes: Counter[str] = field(default_factory=Counter)
    chose: bool = False


def evaluate(case: Obj, result: Obj, clock: list[float] | None = None) -> Outcome:
    """Both sides on one case of either kind (``kind``: ``devices``, or filters and, with
    ``score`` set, the node chosen)."""
    k = kube_answer(result)
    try:
        if case.get("kind") == "devices":
            return Outcome(*compare_devices(case, k, tessera_devices(case)))
        if case.get("score") and k.error.startswith(SCORE_ERROR):
            # kube fails the cycle in scoring (an Error status): the filters still count
            diffs = compare(replace_error(k), _tessera_or_error(case, clock))
            return Outcome(diffs, Counter({KUBE_SCORE_ERROR: 1}) if not diffs else Counter())
        diffs = compare(k, _tessera_or_error(case, clock))
        if diffs or k.error or not case.get("score"):
            return Outcome(diffs)
        chose = bool(result.get("scores"))
        return Outcome(compare_choice(result, tessera_choice(case)), chose=chose)
    except Exception as exc:  # a crash is a disagreement of its own
        return Outcome([Disagreement("Tessera raised", tessera=f"{type(exc).__name__}: {exc}")])


def cases(seed: int, start: int, stop: int) -> list[Obj]:
    """Cases ``start`` to ``stop`` of ``seed``, each twice: scored (filters and the node
    chosen) and as a device case."""
    out = []
    for i in range(start, stop):
        scored = generate(seed, i)
        scored["score"] = True
        out += [scored, generate_devices(seed, i)]
    return out


# --- shrinking -------------------------------------------------------------------------

_KEEP = {
    "metadata",
    "spec",
    "status",
    "containers",
    "name",
    "uid",
    "namespace",
    "schedulerName",
    "nodeName",
    "phase",
    "image",
    "topologyKey",
    "maxSkew",
    "whenUnsatisfiable",
    "containerPort",
    "nodeSelectorTerms",
    "weight",
    "preference",
    "podAffinityTerm",
}
"""Keys never removed: what the API server requires."""
_LEAVES = {"tolerations", "taints", "matchExpressions", "matchFields", "ports"}
"""Lists whose items are removed whole, never in part (their fields go together)."""
_NON_EMPTY = {"containers", "nodeSelectorTerms"}


def _paths(obj: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """Paths of the parts of ``obj`` that may be removed, outermost first."""
    if isinstance(obj, dict):
        for k in obj:
            if k in _KEEP:
                continue
            if k == "labelSelector" and ("matchLabelKeys" in obj or "mismatchLabelKeys" in obj):
                continue  # the API server refuses label keys without a selector
            yield (*path, k)
        for k, v in obj.items():
            yield from _paths(v, (*path, k))
    elif isinstance(obj, list):
        key = path[-1] if path else None
        if not (key in _NON_EMPTY and len(obj) == 1):
            for i in range(len(obj)):
                yield (*path, i)
        if key not in _LEAVES:
            for i, v in enumerate(obj):
                yield from _paths(v, (*path, i))


def _without(case: Obj, path: tuple[Any, ...]) -> Obj:
    out = copy.deepcopy(case)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    # a resource removed from limits goes from requests too (no extended request alone)
    if len(path) >= 2 and path[-2] == "limits":
        requests = parent_of(out, path[:-2]).get("requests")
        if isinstance(requests, dict):
            requests.pop(path[-1], None)
    return out


def parent_of(case: Obj, path: tuple[Any, ...]) -> Any:
    obj: Any = case
    for step in path:
        obj = obj[step]
    return obj


def _valid(obj: Any) -> bool:
    """No list that must not be empty is (single removals keep one; several may not)."""
    if isinstance(obj, dict):
        return all((k not in _NON_EMPTY or bool(v)) and _valid(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_valid(v) for v in obj)
    return True


def _drop_nodes(case: Obj, names: set[str]) -> Obj:
    out = dict(case)
    out["nodes"] = [n for n in case["nodes"] if n["metadata"]["name"] not in names]
    out["pods"] = [p for p in case["pods"] if p["spec"]["nodeName"] not in names]
    return out


def _drop_pods(case: Obj, idx: set[int]) -> Obj:
    return {**case, "pods": [p for i, p in enumerate(case["pods"]) if i not in idx]}


def shrink(kube: Kube, case: Obj, category: str, budget_s: float = 60.0) -> Obj:
    """A smaller case with the same category of disagreement (greedy, batched)."""
    deadline = time.monotonic() + budget_s

    def keeps(candidates: list[Obj]) -> list[bool]:
        return [any(d.category == category for d in ds) for ds in check(kube, candidates)]

    def first(candidates: list[Obj]) -> Obj | None:
        if not candidates:
            return None
        for cand, ok in zip(candidates, keeps(candidates), strict=True):
            if ok:
                return cand
        return None

    while time.monotonic() < deadline:
        before = json.dumps(case, sort_keys=True)
        case = _shrink_once(case, keeps, first, deadline)
        if json.dumps(case, sort_keys=True) == before:
            break
    return case


def _order(path: tuple[Any, ...]) -> list[tuple[int, Any]]:
    return [(0, s) if isinstance(s, int) else (1, s) for s in path]


def _shrink_once(
    case: Obj,
    keeps: Callable[[list[Obj]], list[bool]],
    first: Callable[[list[Obj]], Obj | None],
    deadline: float,
) -> Obj:
    # whole bound pods: all, halves, quarters ..., then one at a time
    chunk = len(case["pods"])
    while chunk >= 1 and case["pods"] and time.monotonic() < deadline:
        n = len(case["pods"])
        cands = [_drop_pods(case, set(range(i, min(n, i + chunk)))) for i in range(0, n, chunk)]
        found = first(cands)
        if found is not None:
            case = found
            chunk = min(chunk, len(case["pods"]))
        else:
            chunk //= 2
    # whole nodes (with their pods)
    while time.monotonic() < deadline:
        names = [n["metadata"]["name"] for n in case["nodes"]]
        found = first([_drop_nodes(case, {name}) for name in names] if len(names) > 1 else [])
        if found is None:
            break
        case = found
    # namespaces nobody is in
    used = {p["metadata"]["namespace"] for p in [*case["pods"], case["pod"]]}
    for ns in list(case["namespaces"]):
        if ns["metadata"]["name"] in used:
            continue
        cand = {**case, "namespaces": [x for x in case["namespaces"] if x is not ns]}
        if keeps([cand])[0]:
            case = cand
    # parts of objects: every removable part tried at once (one batch per round)
    while time.monotonic() < deadline:
        paths = [
            p for section in ("nodes", "pods", "pod") for p in _paths(case[section], (section,))
        ]
        cands = [_without(case, p) for p in paths]
        oks = keeps(cands) if cands else []
        good = [p for p, ok in zip(paths, oks, strict=True) if ok]
        if not good:
            break
        # all the removals that keep it, together (deepest and last first), else the first
        together = case
        for p in sorted(good, key=_order, reverse=True):
            try:
                together = _without(together, p)
            except (KeyError, IndexError, TypeError):
                together = case
                break
        ok = together is not case and _valid(together) and keeps([together])[0]
        case = together if ok else cands[oks.index(True)]
    return case


# --- the run ---------------------------------------------------------------------------


@dataclass
class Tally:
    cases: int = 0
    nodes: int = 0
    disagreeing_cases: int = 0
    by_category: Counter[str] = field(default_factory=Counter)
    cases_by_category: Counter[str] = field(default_factory=Counter)
    features: Counter[str] = field(default_factory=Counter)
    kube_reasons: Counter[str] = field(default_factory=Counter)
    no_fit: int = 0
    prefilter: int = 0
    device_cases: int = 0
    choices: int = 0
    """Scored cases with a feasible node: Tessera's choice compared with kube's scores."""
    tied: int = 0
    """... of which kube's best total was shared by several nodes."""
    differences: Counter[str] = field(default_factory=Counter)
    """Documented differences (docs/compat.md) by class: nodes, or cases for scoring."""
    tessera_s: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Seconds in Tessera: parsing into the host side; PreFilter + Filter + message."""
    first: list[tuple[Obj, Disagreement]] = field(default_factory=list)
    """The first disagreeing cases (up to ``keep``) ..."""
    examples: dict[str, tuple[Obj, Disagreement]] = field(default_factory=dict)
    """... and the first of each category."""

    def to_show(self, n: int) -> list[tuple[Obj, Disagreement]]:
        """Up to ``n`` examples: one per category first, then the earliest others."""
        out = list(self.examples.values())[:n]
        for case, d in self.first:
            if len(out) >= n:
                break
            if all(case is not c for c, _ in out):
                out.append((case, d))
        return sorted(out, key=lambda x: x[0]["id"])


def run(kube: Kube, seed: int, count: int, batch: int = 250, keep: int = 0) -> Tally:
    tally = Tally()
    for start in range(0, count, batch):
        both = cases(seed, start, min(count, start + batch))
        results = kube.run(both)
        for case, result in zip(both, results, strict=True):
            outcome = evaluate(case, result, tally.tessera_s)
            diffs = outcome.diffs
            k = kube_answer(result)
            devices = case.get("kind") == "devices"
            tally.cases += 1
            tally.device_cases += devices
            tally.nodes += len(case["nodes"])
            tally.differences.update(outcome.classes)
            tally.choices += outcome.chose
            if outcome.chose:
                scores = result["scores"]
                best = max(s["total"] for s in scores.values())
                tally.tied += sum(1 for s in scores.values() if s["total"] == best) > 1
            if not devices:
                tally.features.update(features(case))
            if k.prefilter is not None:
                tally.prefilter += 1
            if k.nodes and all(v is not None for v in k.nodes.values()):
                tally.no_fit += 1
            for v in k.nodes.values():
                if v is not None:
                    tally.kube_reasons.update(
                        "Insufficient <extended>" if r.startswith("Insufficient ex") else r
                        for r in v[1]
                    )
            if diffs:
                tally.disagreeing_cases += 1
                tally.by_category.update(d.category for d in diffs)
                tally.cases_by_category.update({d.category for d in diffs})
                if len(tally.first) < keep:
                    tally.first.append((case, diffs[0]))
                for d in diffs:
                    if keep and d.category not in tally.examples:
                        tally.examples[d.category] = (case, d)
    return tally


def minimal(case: Obj) -> Obj:
    keys = ("nodes", "pods", "namespaces", "persistentVolumeClaims", "persistentVolumes")
    return {k: case[k] for k in (*keys, "storageClasses", "pod") if k in case}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=0, help="shrink and print N disagreements")
    parser.add_argument("-j", type=int, default=2, help="tessera-parity workers")
    args = parser.parse_args()

    kube = Kube(harness_binary(), workers=args.j, stats=True)
    try:
        tally = run(kube, args.seed, args.cases, keep=args.show)
        shown = []
        for case, d in tally.to_show(args.show):
            small = shrink(kube, case, d.category)
            diffs = [x for x in check(kube, [small])[0] if x.category == d.category]
            shown.append((small, case["id"], diffs or [d]))
    finally:
        stats = kube.close()
    kube_ms = 1000 * kube.seconds / max(1, kube.cases)
    mean = re.search(r"mean (\d+)", stats)
    per_worker = f"{int(mean.group(1)) / 1000:.2f} ms" if mean else "?"
    scored = tally.cases - tally.device_cases
    print(
        f"parity: {tally.cases} cases (seed {args.seed}; {scored} scored, "
        f"{tally.device_cases} with devices), {tally.nodes} nodes compared, "
        f"kube-scheduler v1.36.3 default profile vs Tessera's core"
    )
    print(
        f"  node chosen: {tally.choices} scored cases with a feasible node ({tally.tied} with "
        "a tie for kube's best), Tessera's choice under nodePolicy spread, "
        "fragmentationGuard 0 among kube's best"
    )
    print(
        f"  no node feasible (kube): {tally.no_fit} cases; PreFilter rejections (kube): "
        f"{tally.prefilter}"
    )
    print(
        f"  kube-scheduler: {kube_ms:.2f} ms/case wall through the pipe ({args.j} workers, "
        f"incl. JSON); {per_worker}/case per worker (harness -stats mean)"
    )
    parse_ms, fit_ms = (1000 * x / max(1, scored) for x in tally.tessera_s)
    print(
        f"  Tessera core:   {parse_ms + fit_ms:.2f} ms/case on one core: {parse_ms:.2f} parsing "
        f"the objects into the host side, {fit_ms:.2f} PreFilter + Filter on every node + "
        "message"
    )
    total = sum(tally.by_category.values())
    print(f"  disagreements: {total} in {tally.disagreeing_cases} cases")
    if tally.by_category:
        width = max(len(c) for c in tally.by_category)
        print(f"    {'category':<{width}}  {'nodes':>6}  {'cases':>6}")
        for cat, n in tally.by_category.most_common():
            print(f"    {cat:<{width}}  {n:>6}  {tally.cases_by_category[cat]:>6}")
    print(f"  documented differences (docs/compat.md): {sum(tally.differences.values())}")
    for cls, n in tally.differences.most_common():
        print(f"    {n:>6}  {cls}")
    print("  features exercised (cases):")
    for name, n in sorted(tally.features.items()):
        print(f"    {name:<32} {n:>6}")
    print("  kube reasons seen (node rejections):")
    for reason, n in tally.kube_reasons.most_common():
        print(f"    {n:>6}  {reason}")
    for case, index, diffs in shown:
        print(f"\n--- case {index} (seed {args.seed}), shrunk: {diffs[0].category}")
        for d in diffs:
            where = f" on {d.node}" if d.node else ""
            print(f"  kube{where}:    {json.dumps(d.kube)}")
            print(f"  Tessera{where}: {json.dumps(d.tessera)}")
        print(json.dumps(minimal(case), separators=(",", ":")))
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
