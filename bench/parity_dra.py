"""Differential test: Tessera's DRA allocation core against the real structured allocator.

    python bench/parity_dra.py [--cases 2000] [--seed 1] [--show 3] [--binary PATH]

Generates random cases for one node, seeded (case ``i`` of seed ``s`` is the same on
every run): ResourceSlices (one or two drivers; a pool per node, sometimes in two
slices, sometimes with a stale older generation or a slice missing; a pool for every
node; rack pools chosen by node selectors; a slice whose devices each name their nodes;
a partitionable card, its partitions drawing on shared counters, now and then an invalid
pool; devices with int, bool, string and version attributes, some in another domain;
capacities with a default, a validRange with a step, validValues, or no policy; some
devices shared, some tainted, some with binding conditions), DeviceClasses with CEL
selectors, claims already allocated (devices held whole, shares consuming capacity,
admin access), and one to three claims to allocate (ExactCount or All, selectors,
capacity requests, some beyond a policy's range, firstAvailable, admin access,
tolerations, matchAttribute and distinctAttribute constraints, now and then a selector
that does not compile or fails on a device).
Both sides decide:

- the pinned release's allocator, run by tools/parity in its ``-dra`` mode (built from
  tools/ on first use into the temporary directory, keyed by its sources);
- shared/core/dra: ``read`` the same objects, ``prepare`` once, ``allocate``.

It compares the outcome (fits, unschedulable, or an error that stops the attempt), the
reason text of an unschedulable one, and, where it fits, every device result (request,
driver, pool, device, admin access, a share or not, consumed capacity, tolerations,
binding conditions), the node selector, the number of config entries, and what each
shared device has consumed after the allocation. Of an error it compares the text; of a
selector's error, which class or claim, which selector, and whether it failed compiling
or running (CEL's own words after that differ between the libraries). Exits 1 on any
disagreement. A case where the Go allocator reaches kube-scheduler's default filter
timeout (10 s) or Tessera its step budget (MAX_STEPS) is counted apart, not compared:
the search is exponential on some claims that do not fit, on both sides.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.core.dra import allocate, prepare  # noqa: E402
from shared.core.dra import read as dra_read  # noqa: E402
from shared.core.quantity import parse_quantity  # noqa: E402

Obj = dict[str, Any]
NODE = "node-a"
GPU = "gpu.tessera.io"
NET = "net.example.com"
VERSIONS = ["535.104.5", "550.54.15", "580.65.6", "1.2.3-rc.1", "1.2.3"]
MI = 1024 * 1024
MAX_STEPS = 300_000
"""Tessera's search budget per case (seconds of Python); the harness stops the Go
allocator after kube-scheduler's default filter timeout (10 s). A case either side
stops is counted, not compared."""


def _capacity(rng: random.Random) -> dict[str, Obj]:
    out: dict[str, Obj] = {}
    profile = rng.choice(["hami", "hami", "hami", "slots", "bare", "plain"])
    if profile == "hami":
        total = rng.choice([16, 24, 40, 80]) * 1024
        policy: Obj = {"default": f"{total}Mi"}
        if rng.random() < 0.8:
            step = rng.choice([1, 256, 1024])
            policy["validRange"] = {"min": f"{step}Mi", "max": f"{total}Mi", "step": f"{step}Mi"}
        out["memory"] = {"value": f"{total}Mi", "requestPolicy": policy}
        step = rng.choice([1, 5, 10])
        policy = {"validRange": {"min": str(step), "max": "100", "step": str(step)}}
        if rng.random() < 0.7:
            policy["default"] = "100"
        out["cores"] = {"value": "100", "requestPolicy": policy}
    elif profile == "slots":
        out["slots"] = {
            "value": "8",
            "requestPolicy": {"default": "1", "validValues": ["1", "2", "4", "8"]},
        }
    elif profile == "plain":
        out["memory"] = {"value": f"{rng.choice([16, 40])}Gi"}
    if rng.random() < 0.1:
        out["example.com/bandwidth"] = {"value": str(rng.choice([10, 40, 100]))}
    return out


def _device(rng: random.Random, i: int, driver: str) -> Obj:
    attributes: Obj = {
        "type": {"string": rng.choice(["gpu", "gpu", "mig"])},
        "index": {"int": i},
        "healthy": {"bool": rng.random() < 0.85},
        "driverVersion": {"version": rng.choice(VERSIONS)},
        "numa": {"int": rng.randint(0, 1)},
    }
    if rng.random() < 0.5:
        attributes["example.com/zone"] = {"string": rng.choice(["a", "b"])}
    if rng.random() < 0.2:
        del attributes["numa"]
    device: Obj = {"name": f"{driver.split('.')[0]}-{i}", "attributes": attributes}
    capacity = _capacity(rng)
    if capacity:
        device["capacity"] = capacity
        if rng.random() < 0.6:
            device["allowMultipleAllocations"] = True
    if rng.random() < 0.05:
        device["bindingConditions"] = ["attached"]
        device["bindingFailureConditions"] = ["attach-failed"]
        if rng.random() < 0.5:
            device["bindsToNode"] = True
    if rng.random() < 0.1:
        device["taints"] = [{"key": "gpu.tessera.io/unhealthy", "effect": "NoSchedule"}]
    return device


def _slices(rng: random.Random) -> tuple[list[Obj], list[tuple[str, str, Obj]]]:
    """The cluster's slices, and the devices the node sees (driver, pool, device)."""
    slices: list[Obj] = []
    seen: list[tuple[str, str, Obj]] = []
    drivers = [GPU] + ([NET] if rng.random() < 0.7 else [])
    for driver in drivers:
        pool = f"{NODE}-{driver.split('.')[0]}"
        generation = rng.randint(1, 3)
        parts = 2 if rng.random() < 0.2 else 1
        missing = parts == 2 and rng.random() < 0.15
        index = 0
        for part in range(parts):
            devices = [_device(rng, index + k, driver) for k in range(rng.randint(2, 5))]
            index += len(devices)
            spec = {
                "driver": driver,
                "nodeName": NODE,
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": parts},
                "devices": devices,
            }
            if missing and part == 1:
                continue
            slices.append({"metadata": {"name": f"{pool}-{part}"}, "spec": spec})
            seen.extend((driver, pool, d) for d in devices)
        if rng.random() < 0.15:  # an older generation, which no one reads
            old = {
                "driver": driver,
                "nodeName": NODE,
                "pool": {"name": pool, "generation": generation - 1, "resourceSliceCount": 1},
                "devices": [_device(rng, 90, driver)],
            }
            slices.append({"metadata": {"name": f"{pool}-old"}, "spec": old})
    # At most two of the pools beside the node's own: the search is exponential in the
    # devices on claims that do not fit (on both sides), and a few more devices than
    # this make single cases take minutes.
    extras = rng.sample(["fabric", "rack", "parts", "spread"], k=rng.choice([0, 1, 1, 2]))
    if "parts" in extras:
        _partitions(rng, slices, seen)
    if "spread" in extras:
        _per_device(rng, slices, seen)
    if "fabric" in extras:  # a pool every node reaches
        devices = [_device(rng, 50 + k, NET) for k in range(rng.randint(1, 2))]
        spec = {
            "driver": NET,
            "allNodes": True,
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        }
        slices.append({"metadata": {"name": "fabric"}, "spec": spec})
        seen.extend((NET, "fabric", d) for d in devices)
    if "rack" in extras:  # a rack's pool, chosen by a node selector
        terms: list[Obj] = [
            {
                "matchExpressions": [
                    {"key": "rack", "operator": "In", "values": rng.choice([["r1"], ["r1", "r2"]])}
                ]
            }
        ]
        if rng.random() < 0.3:
            terms[0]["matchFields"] = [
                {"key": "metadata.name", "operator": "In", "values": [rng.choice([NODE, "node-b"])]}
            ]
        if rng.random() < 0.1:
            terms.append({"matchExpressions": [{"key": "zone", "operator": "Exists"}]})
        for part in range(rng.choice([1, 1, 2])):
            devices = [_device(rng, 60 + 10 * part + k, NET) for k in range(rng.randint(1, 2))]
            spec = {
                "driver": NET,
                "nodeSelector": {"nodeSelectorTerms": terms},
                "pool": {"name": f"rack-{part}", "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            }
            slices.append({"metadata": {"name": f"rack-{part}"}, "spec": spec})
            seen.extend((NET, f"rack-{part}", d) for d in devices)
    if rng.random() < 0.3:  # another node's pool
        other = {
            "driver": GPU,
            "nodeName": "node-b",
            "pool": {"name": "node-b-gpu", "generation": 1, "resourceSliceCount": 1},
            "devices": [_device(rng, 0, GPU)],
        }
        slices.append({"metadata": {"name": "node-b-gpu"}, "spec": other})
    return slices, seen


def _partitions(rng: random.Random, slices: list[Obj], seen: list[tuple[str, str, Obj]]) -> None:
    """A partitionable card: a pool of one slice of shared counters (its memory and
    eight compute slices) and one of partitions drawing on them, some overlapping, now
    and then one drawing on a counter the pool lacks (the pool is then invalid)."""
    pool = f"{NODE}-parts"
    counters = {"memory": {"value": "80Gi"}, "slices": {"value": "8"}}
    devices = []
    for k in range(rng.randint(2, 5)):
        device = _device(rng, 70 + k, GPU)
        size = rng.choice([1, 2, 4, 8])
        drawn = {"memory": {"value": f"{10 * size}Gi"}, "slices": {"value": str(size)}}
        if rng.random() < 0.04:
            drawn["nonexistent"] = {"value": "1"}
        device["consumesCounters"] = [{"counterSet": "card", "counters": drawn}]
        devices.append(device)
    if rng.random() < 0.04:
        devices.append(dict(devices[0]))  # a duplicate name: the pool is invalid
    base = {"driver": GPU, "nodeName": NODE}
    ref = {"name": pool, "generation": 1, "resourceSliceCount": 2}
    slices.append(
        {
            "metadata": {"name": f"{pool}-counters"},
            "spec": {
                **base,
                "pool": ref,
                "sharedCounters": [{"name": "card", "counters": counters}],
            },
        }
    )
    slices.append(
        {"metadata": {"name": f"{pool}-devices"}, "spec": {**base, "pool": ref, "devices": devices}}
    )
    seen.extend((GPU, pool, d) for d in devices)


def _per_device(rng: random.Random, slices: list[Obj], seen: list[tuple[str, str, Obj]]) -> None:
    """A slice with per-device node selection: each device names its node, or every
    node, or a node selector (the rack's)."""
    devices = []
    for k in range(rng.randint(2, 4)):
        device = _device(rng, 80 + k, NET)
        match rng.choice(["here", "here", "other", "all", "rack"]):
            case "here":
                device["nodeName"] = NODE
            case "other":
                device["nodeName"] = "node-b"
            case "all":
                device["allNodes"] = True
            case _:
                rack = {"key": "rack", "operator": "In", "values": ["r1"]}
                device["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [rack]}]}
        devices.append(device)
    spec = {
        "driver": NET,
        "perDeviceNodeSelection": True,
        "pool": {"name": "spread", "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    slices.append({"metadata": {"name": "spread"}, "spec": spec})
    seen.extend((NET, "spread", d) for d in devices)


GUARDED = [
    f"device.attributes['{GPU}'].index < 2.5",
    f"device.attributes['{GPU}'].index == 1.0 || device.attributes['{GPU}'].type == 'mig'",
    f"device.attributes['{GPU}'].type == 'gpu'",
    f"device.attributes['{GPU}'].index >= 1",
    f"device.attributes['{GPU}'].healthy",
    f"device.attributes['{GPU}'].driverVersion.isGreaterThan(semver('550.0.0'))",
    f"device.attributes['{GPU}'].driverVersion.compareTo(semver('1.2.3')) == 0",
    f"!has(device.attributes['{GPU}'].numa) || device.attributes['{GPU}'].numa == 0",
    "has(device.attributes['example.com'].zone) && device.attributes['example.com'].zone == 'a'",
    f"has(device.capacity['{GPU}'].memory) && "
    f"device.capacity['{GPU}'].memory.compareTo(quantity('30Gi')) >= 0",
    f"has(device.capacity['{GPU}'].memory) && "
    f"device.capacity['{GPU}'].memory.isLessThan(quantity('40000Mi'))",
    "device.allowMultipleAllocations",
    f"device.attributes['{GPU}'].type != 'mig' && device.attributes['{GPU}'].index != 2",
]
BROKEN = [
    "device.attributes[",  # does not compile
    f"device.attributes['{GPU}'].missing == 1",  # no such key on every device
]


def _selectors(rng: random.Random, driver: str, p: float) -> list[Obj]:
    out = []
    while rng.random() < p:
        text = rng.choice(GUARDED).replace(GPU, driver)
        if rng.random() < 0.02:
            text = rng.choice(BROKEN)
        out.append({"cel": {"expression": text}})
        p /= 2
    return out


def _classes(rng: random.Random) -> list[Obj]:
    classes = [
        {
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{GPU}'"}}]},
        },
        {
            "metadata": {"name": "net"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NET}'"}}]},
        },
        {"metadata": {"name": "any"}, "spec": {}},
        {
            "metadata": {"name": "gpu-new"},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f"device.driver == '{GPU}' && device.attributes['{GPU}']"
                            ".driverVersion.isGreaterThan(semver('540.0.0'))"
                        }
                    }
                ],
                "config": [{"opaque": {"driver": GPU, "parameters": {"sharing": "MPS"}}}],
            },
        },
    ]
    extra = _selectors(rng, GPU, 0.25)
    if extra:
        classes[0]["spec"]["selectors"].extend(extra)
    return classes


def _amounts(rng: random.Random) -> Obj:
    memory = [f"{rng.randint(1, 50)}Gi", f"{rng.randint(1, 40000)}Mi", "1500k", "100Gi"]
    cores = [1, 3, 7, 25, 30, 50, 99, 100, 120]
    match rng.choice(["memory", "cores", "both", "both", "slots"]):
        case "memory":
            out: Obj = {"memory": rng.choice(memory)}
        case "cores":
            out = {"cores": str(rng.choice(cores))}
        case "both":
            out = {"memory": rng.choice(memory), "cores": str(rng.choice(cores))}
        case _:
            out = {"slots": str(rng.choice([1, 2, 3, 5, 8, 9]))}
    if rng.random() < 0.03:
        out["nonexistent"] = "1"
    return out


def _exactly(rng: random.Random) -> Obj:
    cls = rng.choice(["gpu", "gpu", "gpu", "net", "any", "any", "gpu-new"])
    if rng.random() < 0.01:
        cls = "no-such-class"
    driver = NET if cls == "net" else GPU
    req: Obj = {"deviceClassName": cls}
    if sel := _selectors(rng, driver, 0.35 if cls != "any" else 0.0):
        req["selectors"] = sel
    if rng.random() < 0.1:
        req["allocationMode"] = "All"
    else:
        req["allocationMode"] = "ExactCount"
        req["count"] = rng.choice([1, 1, 1, 1, 2, 3])
    if rng.random() < 0.3:
        req["capacity"] = {"requests": _amounts(rng)}
    if rng.random() < 0.06:
        req["adminAccess"] = True
    if rng.random() < 0.15:
        req["tolerations"] = [{"key": "gpu.tessera.io/unhealthy", "operator": "Exists"}]
    return req


def _claim(rng: random.Random, name: str) -> Obj:
    requests = []
    for r in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < 0.2:
            subs = [{"name": f"s{k}", **_exactly(rng)} for k in range(rng.randint(2, 3))]
            requests.append({"name": f"r{r}", "firstAvailable": subs})
        else:
            requests.append({"name": f"r{r}", "exactly": _exactly(rng)})
    devices: Obj = {"requests": requests}
    constraints = []
    while rng.random() < 0.22:
        names = [q["name"] for q in requests if rng.random() < 0.6]
        if rng.random() < 0.2 and any("firstAvailable" in q for q in requests):
            q = next(q for q in requests if "firstAvailable" in q)
            names.append(f"{q['name']}/s0")
        attr = rng.choice(
            [
                f"{GPU}/numa",
                f"{GPU}/type",
                "example.com/zone",
                f"{GPU}/healthy",
                f"{GPU}/driverVersion",
                f"{NET}/numa",
            ]
        )
        kind = "matchAttribute" if rng.random() < 0.5 else "distinctAttribute"
        if kind == "distinctAttribute" and rng.random() < 0.6:
            attr = f"{GPU}/index"
        c: Obj = {kind: attr}
        if names:
            c["requests"] = names
        constraints.append(c)
    if constraints:
        devices["constraints"] = constraints
    if rng.random() < 0.2:
        devices["config"] = [
            {"requests": [requests[0]["name"]], "opaque": {"driver": GPU, "parameters": {"x": 1}}}
        ]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"devices": devices},
    }


def _allocated(rng: random.Random, seen: list[tuple[str, str, Obj]]) -> list[Obj]:
    claims = []
    for i in range(rng.choice([0, 0, 1, 2, 3])):
        results = []
        for driver, pool, device in rng.sample(seen, k=min(len(seen), rng.randint(1, 2))):
            result: Obj = {"request": "r", "driver": driver, "pool": pool, "device": device["name"]}
            if rng.random() < 0.1:
                result["adminAccess"] = True
            elif device.get("allowMultipleAllocations"):
                result["shareID"] = f"00000000-0000-0000-0000-{i:06d}{len(results):06d}"
                consumed = {}
                for name, cap in (device.get("capacity") or {}).items():
                    total = parse_quantity(cap["value"])
                    share = total * Fraction(rng.choice([1, 2, 4, 8]), 8)
                    consumed[name] = dra_read.quantity_text(share)
                result["consumedCapacity"] = consumed
            results.append(result)
        claims.append(
            {
                "metadata": {"name": f"held-{i}", "namespace": "ns", "uid": f"uid-held-{i}"},
                "spec": {"devices": {"requests": []}},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        )
    return claims


def generate(seed: int, index: int) -> Obj:
    """Case ``index`` of ``seed``."""
    rng = random.Random(f"dra-{seed}-{index}")
    slices, seen = _slices(rng)
    return {
        "id": index,
        "node": {
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "rack": "r1"}}
        },
        "slices": slices,
        "classes": _classes(rng),
        "allocated": _allocated(rng, seen),
        "claims": [_claim(rng, f"claim-{k}") for k in range(rng.choice([1, 1, 2, 3]))],
    }


# --- the two sides -------------------------------------------------------------------


def tessera(case: Obj) -> Obj:
    """shared/core/dra's answer, in the harness's shape."""
    classes = {c.name: c for c in map(dra_read.class_record, case["classes"])}
    claims = [dra_read.claim_record(c) for c in case["claims"]]
    prep = prepare(claims, classes)
    if not isinstance(prep, tuple):
        return {"outcome": "unschedulable", "reason": prep.reason}
    in_use = dra_read.in_use(case["allocated"])
    pools = dra_read.node_pools(case["slices"], NODE, case["node"]["metadata"]["labels"])
    out = allocate(prep, NODE, pools, in_use, max_steps=MAX_STEPS)
    if out.reason.endswith("timed out trying to allocate devices"):
        return {"outcome": "timeout", "reason": out.reason}
    if out.error:
        return {"outcome": "error", "reason": out.reason}
    if out.allocations is None:
        return {"outcome": "unschedulable", "reason": out.reason}
    totals: dict[str, dict[str, Fraction]] = {}
    for key, amounts in in_use.consumed.items():
        into = totals.setdefault("/".join(key), {})
        for name, v in amounts.items():
            into[name] = into.get(name, Fraction(0)) + v
    allocations = []
    for a in out.allocations:
        allocations.append(dra_read.allocation_json(a, lambda: "share"))
        for r in a.results:
            if r.share:
                into = totals.setdefault(f"{r.driver}/{r.pool}/{r.device}", {})
                for name, v in (r.consumed or {}).items():
                    into[name] = into.get(name, Fraction(0)) + v
    consumed = {
        k: {n: str(-(-v.numerator * 1000 // v.denominator)) for n, v in m.items()}
        for k, m in totals.items()
    }
    return {"outcome": "fit", "allocations": allocations, "consumed": consumed}


def _milli(text: str) -> int:
    v = parse_quantity(text)
    return -(-v.numerator * 1000 // v.denominator)


def _results(allocation: Obj) -> list[tuple[Any, ...]]:
    out = []
    for r in (allocation.get("devices") or {}).get("results") or ():
        consumed = {k: _milli(v) for k, v in (r.get("consumedCapacity") or {}).items()}
        out.append(
            (
                json.dumps(r.get("tolerations") or [], sort_keys=True),
                tuple(r.get("bindingConditions") or ()),
                tuple(r.get("bindingFailureConditions") or ()),
                r["request"],
                r["driver"],
                r["pool"],
                r["device"],
                bool(r.get("adminAccess")),
                r.get("shareID") is not None,
                tuple(sorted(consumed.items())),
            )
        )
    return out


def features(case: Obj, kube: Obj) -> set[str]:
    """What a case that fits exercised (so a feature never seen is visible)."""
    out = set()
    for a in kube.get("allocations") or ():
        for r in a["devices"]["results"]:
            if r.get("shareID"):
                out.add("a share of a shared device")
            if r.get("adminAccess"):
                out.add("admin access")
            if "/" in r["request"]:
                out.add(
                    "firstAvailable: "
                    + ("first" if r["request"].endswith("/s0") else "later")
                    + " subrequest"
                )
            if r.get("tolerations"):
                out.add("tolerations")
            if r.get("bindingConditions"):
                out.add("binding conditions")
            if r["pool"].endswith("-parts"):
                out.add("a partition drawing on shared counters")
            if r["pool"] == "spread":
                out.add("a device with its own node selection")
        if not a.get("nodeSelector"):
            out.add("no node selector (allNodes pool)")
        elif "matchExpressions" in json.dumps(a["nodeSelector"]):
            out.add("node selector from a slice's")
    for c in case["claims"]:
        for q in c["spec"]["devices"]["requests"]:
            for ex in [q.get("exactly") or {}, *q.get("firstAvailable", ())]:
                if ex.get("allocationMode") == "All":
                    out.add("allocationMode All")
                if ex.get("capacity"):
                    out.add("capacity requests")
        for k in c["spec"]["devices"].get("constraints") or ():
            out.add("matchAttribute" if "matchAttribute" in k else "distinctAttribute")
    if any(
        r.get("shareID")
        for c in case["allocated"]
        for r in c["status"]["allocation"]["devices"]["results"]
    ):
        out.add("shares held already")
    return out


def warm_times(cases: list[Obj]) -> list[float]:
    """Milliseconds of ``prepare`` + ``allocate`` per case with the records read before
    and each selector's answers remembered (a second decision on unchanged slices, as
    the allocator's ledger would make one per pod and node)."""
    records = []
    for case in cases:
        classes = {c.name: c for c in map(dra_read.class_record, case["classes"])}
        claims = [dra_read.claim_record(c) for c in case["claims"]]
        pools = dra_read.node_pools(case["slices"], NODE, case["node"]["metadata"]["labels"])
        records.append((claims, classes, pools, dra_read.in_use(case["allocated"])))
    times = []
    for round_ in range(2):
        for claims, classes, pools, in_use in records:
            start = time.perf_counter()
            prep = prepare(claims, classes)
            if isinstance(prep, tuple):
                allocate(prep, NODE, pools, in_use, max_steps=MAX_STEPS)
            if round_:
                times.append(1000 * (time.perf_counter() - start))
    return times


def differences(kube: Obj, ours: Obj) -> list[str]:
    """What differs, as category strings (empty: they agree)."""
    if "timeout" in (kube["outcome"], ours["outcome"]):
        return []  # counted apart (see main)
    if kube["outcome"] != ours["outcome"]:
        return [
            f"outcome: kube {kube['outcome']} ({kube.get('reason', '')[:80]}), "
            f"tessera {ours['outcome']} ({ours.get('reason', '')[:80]})"
        ]
    if kube["outcome"] == "unschedulable" and kube.get("reason") != ours.get("reason"):
        return ["unschedulable reason"]
    if (
        kube["outcome"] == "error"
        and "CEL" not in kube["reason"]
        and kube["reason"] != ours["reason"]
    ):
        return ["error text (not CEL)"]
    if kube["outcome"] != "fit":
        return []
    diffs = []
    ka, oa = kube.get("allocations") or [], ours["allocations"]
    if [_results(a) for a in ka] != [_results(a) for a in oa]:
        diffs.append("device results")
    if [a.get("nodeSelector") for a in ka] != [a.get("nodeSelector") for a in oa]:
        diffs.append("node selector")
    if [len((a.get("devices") or {}).get("config") or ()) for a in ka] != [
        len((a.get("devices") or {}).get("config") or ()) for a in oa
    ]:
        diffs.append("config")
    if (kube.get("consumed") or {}) != ours["consumed"]:
        diffs.append("consumed capacity")
    return diffs


def build_harness() -> Path:
    """tools/parity built into the temporary directory, keyed by its sources."""
    digest = hashlib.sha256()
    for path in [*sorted((ROOT / "tools" / "parity").glob("*.go")), ROOT / "tools" / "go.mod"]:
        digest.update(path.read_bytes())
    binary = Path(tempfile.gettempdir()) / f"tessera-parity-{digest.hexdigest()[:12]}"
    if not binary.exists():
        env = {**os.environ, "CGO_ENABLED": "0"}
        subprocess.run(
            ["go", "build", "-o", str(binary), "./parity"], cwd=ROOT / "tools", env=env, check=True
        )
    return binary


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=0, help="print N disagreeing cases")
    parser.add_argument("--binary", type=Path, default=None)
    args = parser.parse_args()
    binary = args.binary or build_harness()
    cases = [generate(args.seed, i) for i in range(args.cases)]
    start = time.perf_counter()
    proc = subprocess.run(
        [str(binary), "-dra"],
        input="".join(json.dumps(c, separators=(",", ":")) + "\n" for c in cases),
        capture_output=True,
        text=True,
        check=True,
    )
    kube_s = time.perf_counter() - start
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(answers) == len(cases), proc.stderr[-2000:]
    outcomes: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    stopped: Counter[str] = Counter()
    disagreements: Counter[str] = Counter()
    shown = 0
    ours_s = 0.0
    for case, kube in zip(cases, answers, strict=True):
        start = time.perf_counter()
        ours = tessera(case)
        ours_s += time.perf_counter() - start
        reason = kube.get("reason", "")
        if kube["outcome"] == "error":
            reason = reason.split(": ", 2)[-1] if "CEL" in reason else reason.split(": ", 1)[-1]
        reason = re.sub(r"device \S+ because", "device D because", reason)
        reason = re.sub(r"request r\d(/s\d)?", "request R", reason)
        reason = re.sub(r"resource pool \S+ is", "resource pool P is", reason)
        outcomes[kube["outcome"] + (": " + reason[:90] if reason else "")] += 1
        if kube["outcome"] == "fit":
            seen.update(features(case, kube))
        if ours["outcome"] == "timeout":
            stopped["tessera's step budget reached (not compared)"] += 1
        if kube["outcome"] == "timeout":
            stopped["kube's filter timeout reached (not compared)"] += 1
        diffs = differences(kube, ours)
        for d in diffs:
            disagreements[d] += 1
        if diffs and shown < args.show:
            shown += 1
            print(json.dumps({"case": case, "kube": kube, "tessera": ours, "diffs": diffs}))
    n = len(cases)
    print(f"cases {n}, disagreements {sum(1 for _ in disagreements.elements())}")
    for what, count in disagreements.most_common():
        print(f"  {count:5d}  {what}")
    print("outcomes (kube):")
    for what, count in sorted(outcomes.items()):
        print(f"  {count:5d}  {what}")
    for what, count in sorted(stopped.items()):
        print(f"{what}: {count}")
    print("in the cases that fit:")
    for what, count in sorted(seen.items()):
        print(f"  {count:5d}  {what}")
    print(
        f"time per case: kube {1000 * kube_s / n:.2f} ms (one process, decode + allocate + "
        f"encode, with the pipe), tessera {1000 * ours_s / n:.2f} ms (read + prepare + "
        "allocate)"
    )
    warm = sorted(warm_times(cases))
    pct = [warm[min(len(warm) - 1, int(q * len(warm)))] for q in (0.5, 0.9, 0.99)]
    print(
        f"tessera warm (records read once, selectors answered before): median {pct[0]:.3f} "
        f"ms, p90 {pct[1]:.3f} ms, p99 {pct[2]:.3f} ms, max {warm[-1]:.1f} ms"
    )
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
