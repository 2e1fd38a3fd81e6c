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
the ``0/N nodes are available: ...`` message. It prints the cases and nodes compared,
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
``Gt: "abc"``, empty terms, zero requests) are in the mix.
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

from shared.core.hosts import PodSpec, node_spec, pod_spec
from shared.core.nodefit import Hosts
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
    return {
        "id": index,
        "nodes": nodes,
        "pods": pods,
        "namespaces": namespaces,
        "pod": _pod(rng, nodes, names),
    }


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
    if isinstance(spec.get("resources"), dict):
        out.add("pod: pod-level resources")
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
        lines = [json.dumps(c, separators=(",", ":")).encode() + b"\n" for c in cases]
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

PLUGIN_OF = {
    "node(s) were unschedulable": "NodeUnschedulable",
    "node(s) didn't match the requested node name": "NodeName",
    "node(s) had untolerated taint(s)": "TaintToleration",
    "node(s) didn't match Pod's node affinity/selector": "NodeAffinity",
    "node(s) didn't satisfy plugin(s) [NodeAffinity]": "NodeAffinity",
    "pod affinity terms conflict": "NodeAffinity",
    "node(s) didn't have free ports for the requested pod ports": "NodePorts",
    "Too many pods": "NodeResourcesFit",
    "node(s) didn't match pod topology spread constraints": "PodTopologySpread",
    "node(s) didn't match pod topology spread constraints (missing required label)": (
        "PodTopologySpread"
    ),
    "node(s) didn't match pod affinity rules": "InterPodAffinity",
    "node(s) didn't match pod anti-affinity rules": "InterPodAffinity",
    "node(s) didn't satisfy existing pods anti-affinity rules": "InterPodAffinity",
}


def plugin_of(reasons: Sequence[str] | frozenset[str]) -> str:
    for r in sorted(reasons):
        if r.startswith("Insufficient "):
            return "NodeResourcesFit"
        if r in PLUGIN_OF:
            return PLUGIN_OF[r]
    return "?"


Verdict = tuple[str, frozenset[str]] | None
"""None: feasible; else (code, reason texts)."""


@dataclass
class Answer:
    """One side's answer to a case."""

    prefilter: Verdict = None
    nodes: dict[str, Verdict] = field(default_factory=dict)
    message: str = ""
    error: str = ""


def kube_answer(result: Obj) -> Answer:
    pre = result.get("prefilter")
    nodes: dict[str, Verdict] = {}
    for name, r in (result.get("nodes") or {}).items():
        nodes[name] = None if r["feasible"] else (r["code"], frozenset(r.get("reasons") or ()))
    return Answer(
        prefilter=(pre["code"], frozenset(pre["reasons"] or ())) if pre else None,
        nodes=nodes,
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
    for p in case["pods"]:
        if not p["spec"].get("nodeName"):
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        hosts.add_pod(p["metadata"]["uid"], p["spec"]["nodeName"], pod_spec(p))
    names = [n["metadata"]["name"] for n in case["nodes"]]
    incoming = pod_spec(case["pod"])
    parsed = time.perf_counter()
    answer = _fit(hosts, incoming, names)
    if clock is not None:
        clock[0] += parsed - began
        clock[1] += time.perf_counter() - parsed
    return answer


def _fit(hosts: Hosts, incoming: PodSpec, names: list[str]) -> Answer:
    prep = hosts.prepare(incoming)
    if isinstance(prep, Status):
        verdict = (CODE_NAMES[prep.code], frozenset(r.text() for r in prep.reasons))
        return Answer(
            prefilter=verdict,
            nodes=dict.fromkeys(names, verdict),
            message=histogram(prep.message()),
        )
    nodes: dict[str, Verdict] = {}
    rejected = []
    for name in names:
        status = prep.filter(hosts.nodes[name])  # type: ignore[index]
        if status is None:
            nodes[name] = None
            continue
        rejected.append(status)
        nodes[name] = (CODE_NAMES[status.code], frozenset(r.text() for r in status.reasons))
    message = "" if len(rejected) < len(names) else counted(rejected, len(names)).message()
    return Answer(nodes=nodes, message=histogram(message))


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
        if kube.prefilter == tessera.prefilter:
            out = []
        else:
            side = kube.prefilter or tessera.prefilter
            assert side is not None
            cat = f"{plugin_of(side[1])}: PreFilter rejection differs"
            out = [Disagreement(cat, kube=_show(kube.prefilter), tessera=_show(tessera.prefilter))]
    else:
        out = []
        for name, k in kube.nodes.items():
            t = tessera.nodes.get(name)
            if k == t:
                continue
            if t is None:
                cat = f"{plugin_of(k[1])}: kube rejects, Tessera accepts"  # type: ignore[index]
            elif k is None:
                cat = f"{plugin_of(t[1])}: Tessera rejects, kube accepts"
            elif k[1] != t[1]:
                kp, tp = plugin_of(k[1]), plugin_of(t[1])
                cat = f"{kp}: reasons differ" if kp == tp else f"{kp} (kube) vs {tp} (Tessera)"
            else:
                cat = f"{plugin_of(k[1])}: code differs"
            out.append(Disagreement(cat, name, _show(k), _show(t)))
    if not out and kube.message != tessera.message:
        out.append(Disagreement("message", kube=kube.message, tessera=tessera.message))
    return out


def _show(v: Verdict) -> Any:
    return "feasible" if v is None else {"code": v[0], "reasons": sorted(v[1])}


def check(kube: Kube, cases: Sequence[Obj]) -> list[list[Disagreement]]:
    """Both sides on ``cases``: each case's disagreements."""
    results = kube.run(cases)
    return [
        compare(kube_answer(r), _tessera_or_error(c)) for c, r in zip(cases, results, strict=True)
    ]


def _tessera_or_error(case: Obj, clock: list[float] | None = None) -> Answer:
    try:
        return tessera_answer(case, clock)
    except Exception as exc:  # a crash is a disagreement of its own
        return Answer(error=f"{type(exc).__name__}: {exc}")


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
        cases = [generate(seed, i) for i in range(start, min(count, start + batch))]
        results = kube.run(cases)
        for case, result in zip(cases, results, strict=True):
            t = _tessera_or_error(case, tally.tessera_s)
            k = kube_answer(result)
            diffs = compare(k, t)
            tally.cases += 1
            tally.nodes += len(case["nodes"])
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
    return {k: case[k] for k in ("nodes", "pods", "namespaces", "pod")}


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
    print(
        f"parity: {tally.cases} cases (seed {args.seed}), {tally.nodes} nodes compared, "
        f"kube-scheduler v1.36.3 default profile vs Tessera's core"
    )
    print(
        f"  no node feasible (kube): {tally.no_fit} cases; PreFilter rejections (kube): "
        f"{tally.prefilter}"
    )
    print(
        f"  kube-scheduler: {kube_ms:.2f} ms/case wall through the pipe ({args.j} workers, "
        f"incl. JSON); {per_worker}/case per worker (harness -stats mean)"
    )
    parse_ms, fit_ms = (1000 * x / max(1, tally.cases) for x in tally.tessera_s)
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
