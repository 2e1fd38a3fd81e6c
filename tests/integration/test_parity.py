"""Tessera's node-fit core against kube-scheduler itself (tools/parity, v1.36.3).

A fixed-seed slice of bench/parity.py's random cases must show no disagreement, and a
few hand-written cases, one per filter plugin, must agree AND give the expected reason
(so a harness or comparison that silently agreed on nothing would fail here too).
Node by node, as bench/parity.py compares: feasibility, the reason texts (as a set) and
the code; a PreFilter rejection; and the ``0/N nodes are available`` message.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.localcluster import ensure_binaries

pytestmark = pytest.mark.integration


def _load_bench() -> Any:
    """bench/parity.py (the generator and comparison), imported from its path."""
    path = Path(__file__).resolve().parents[2] / "bench" / "parity.py"
    spec = importlib.util.spec_from_file_location("bench_parity", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_parity"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


parity = _load_bench()

SEED = 20260101
CASES = 300

UNSCHED = "Unschedulable"
UNRES = "UnschedulableAndUnresolvable"


@pytest.fixture(scope="module")
def kube() -> Iterator[Any]:
    binary = ensure_binaries(["tessera-parity"], quiet=True) / "tessera-parity"
    harness = parity.Kube(binary, workers=2)
    yield harness
    harness.close()


# --- building cases by hand ----------------------------------------------------------------


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    cpu: str = "4",
    memory: str = "8Gi",
    pods: str = "10",
    foo: str | None = None,
) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    if foo is not None:
        alloc["example.com/foo"] = foo
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"capacity": alloc, "allocatable": alloc},
    }


def pod(
    name: str = "incoming",
    *,
    ns: str = "default",
    labels: dict[str, str] | None = None,
    on: str | None = None,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    ports: list[dict[str, Any]] | None = None,
    terminating: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
    resources = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if resources:
        container["resources"] = resources
    if ports:
        container["ports"] = ports
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}"}
    if labels:
        meta["labels"] = labels
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj: dict[str, Any] = {
        "metadata": meta,
        "spec": {"schedulerName": "default-scheduler", "containers": [container], **spec},
    }
    if on is not None:
        obj["spec"]["nodeName"] = on
        obj["status"] = {"phase": "Running"}
    return obj


NAMESPACE_LABELS = {"default": {}, "team-a": {"team": "a"}, "team-b": {"team": "b"}}


def case(
    nodes: list[dict[str, Any]], incoming: dict[str, Any], bound: tuple[Any, ...] = ()
) -> dict[str, Any]:
    return {
        "id": "hand",
        "nodes": nodes,
        "pods": list(bound),
        "namespaces": [
            {"metadata": {"name": n, "labels": {**labels, "kubernetes.io/metadata.name": n}}}
            for n, labels in NAMESPACE_LABELS.items()
        ],
        "pod": incoming,
    }


def agree(kube: Any, c: dict[str, Any]) -> Any:
    """Both sides' answer, asserted equal; kube's answer (an ``Answer``)."""
    [result] = kube.run([c])
    assert not result.get("error"), result["error"]
    mine, theirs = parity.tessera_answer(c), parity.kube_answer(result)
    diffs = parity.compare(theirs, mine)
    assert diffs == [], f"kube and Tessera disagree: {diffs}\n{json.dumps(c)}"
    return theirs


def rejected(code: str, *reasons: str) -> tuple[str, frozenset[str]]:
    return (code, frozenset(reasons))


ZONE = "topology.kubernetes.io/zone"


# --- the random slice ------------------------------------------------------------------


def test_random_cases_agree(kube: Any) -> None:
    cases = [parity.generate(SEED, i) for i in range(CASES)]
    found = [(c, ds) for c, ds in zip(cases, parity.check(kube, cases), strict=True) if ds]
    if not found:
        return
    counts: dict[str, int] = {}
    for _, ds in found:
        for d in ds:
            counts[d.category] = counts.get(d.category, 0) + 1
    first, diffs = found[0]
    small = parity.shrink(kube, first, diffs[0].category, budget_s=20)
    shown = parity.check(kube, [small])[0]
    pytest.fail(
        f"{len(found)}/{CASES} cases disagree (seed {SEED}), by category: {counts}\n"
        f"first (case {first['id']}), shrunk: {shown}\n{json.dumps(parity.minimal(small))}"
    )


DEVICE_CASES = 150


def test_device_and_scored_cases_agree(kube: Any) -> None:
    """A fixed-seed slice of the new kinds: device cases (Tessera's filters and device
    fit against NodeResourcesFit on the advertised totals; refusals of Tessera's per-card
    view counted by documented class) and scored cases (Tessera's node among kube's
    best). Each kind must come up, not only agree."""
    cases = parity.cases(SEED, 0, DEVICE_CASES)
    results = kube.run(cases)
    outcomes = [parity.evaluate(c, r) for c, r in zip(cases, results, strict=True)]
    found = [(c, o.diffs) for c, o in zip(cases, outcomes, strict=True) if o.diffs]
    assert not found, (
        f"{len(found)} of {len(cases)} cases disagree; first (case {found[0][0]['id']}, "
        f"{found[0][0].get('kind', 'scored')}): {found[0][1]}\n"
        f"{json.dumps(parity.minimal(found[0][0]))[:4000]}"
    )
    classes: dict[str, int] = {}
    for o in outcomes:
        for cls, n in o.classes.items():
            classes[cls] = classes.get(cls, 0) + n
    assert {"count above the node's cards", "per-card memory"} <= set(classes), classes
    assert sum(o.chose for o in outcomes) >= 20
    device_rejections = sum(
        1
        for r in results
        for v in (r.get("nodes") or {}).values()
        if any(x.startswith("Insufficient nvidia.com/") for x in v.get("reasons") or ())
    )
    assert device_rejections > 0


def test_two_half_cards_do_not_take_one_card_request(kube: Any) -> None:
    """The documented per-card memory class by hand: two 80 GB cards with 40 GB free
    each; kube's totals (80 GB free) take a 60 GB request, Tessera's cards do not."""
    n = node("gpu-0", cpu="8", memory="32Gi")
    n["status"]["allocatable"].update(
        {"nvidia.com/gpu": "20", "nvidia.com/gpumem": "163840", "nvidia.com/gpucores": "200"}
    )
    n["status"]["capacity"] = n["status"]["allocatable"]
    half = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960"}
    bound = [pod(f"half-{i}", on="gpu-0", limits=half) for i in range(2)]
    incoming = pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "61440"})
    c = case([n], incoming, tuple(bound))
    c.update(
        kind="devices",
        inventory={"gpu-0": [["NVIDIA-A100-SXM4-80GB", 81920]] * 2},
        grants={f"uid-default-half-{i}": [[i, 40960, 0, False]] for i in range(2)},
    )
    result = kube.run([c])[0]
    assert result["nodes"]["gpu-0"]["feasible"], result
    outcome = parity.evaluate(c, result)
    assert outcome.diffs == []
    assert outcome.classes == {"per-card memory": 1}


# --- one plugin at a time -----------------------------------------------------------------


def test_node_resources_fit(kube: Any) -> None:
    # 1.5 cpu + a 0.5 cpu sidecar beside a 3 cpu init step, + 0.1 overhead: 3.6 cpu
    incoming = pod(
        requests={"cpu": "1500m", "memory": "1Gi"},
        limits={"example.com/foo": "1"},
        initContainers=[
            {
                "name": "sidecar",
                "image": "registry.example/proxy:1",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "500m"}},
            },
            {
                "name": "migrate",
                "image": "registry.example/migrate:1",
                "resources": {"limits": {"cpu": "3"}},
            },
        ],
        overhead={"cpu": "100m"},
    )
    nodes = [
        node("exact", cpu="3600m", foo="1"),
        node("short", cpu="3500m", foo="1"),
        node("busy", cpu="8", foo="1"),
        node("no-foo", cpu="8"),
        node("full", cpu="8", pods="1", foo="2"),
    ]
    bound = (
        pod("hog", on="busy", limits={"cpu": "5"}),  # requests default to limits
        pod("idle", on="full"),
    )
    answer = agree(kube, case(nodes, incoming, bound))
    assert answer.nodes == {
        "exact": None,
        "short": rejected(UNRES, "Insufficient cpu"),
        "busy": rejected(UNSCHED, "Insufficient cpu"),
        "no-foo": rejected(UNRES, "Insufficient example.com/foo"),
        "full": rejected(UNSCHED, "Too many pods"),
    }


def test_taints_and_cordons(kube: Any) -> None:
    nodes = [
        node("gpu", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
        node("spot", taints=[{"key": "spot", "effect": "PreferNoSchedule"}]),
        node("maint", taints=[{"key": "maintenance", "value": "true", "effect": "NoExecute"}]),
        node("cordoned", unschedulable=True),
    ]
    tolerations = [
        {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
        {"key": "maintenance", "operator": "Equal", "value": "true"},
    ]
    answer = agree(kube, case(nodes, pod(tolerations=tolerations)))
    assert answer.nodes == {
        "gpu": rejected(UNRES, "node(s) had untolerated taint(s)"),
        "spot": None,
        "maint": None,
        "cordoned": rejected(UNRES, "node(s) were unschedulable"),
    }
    # tolerating the unschedulable taint lets a pod onto a cordoned node
    tolerations = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    answer = agree(kube, case(nodes, pod(tolerations=tolerations)))
    assert answer.nodes["cordoned"] is None


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def test_node_affinity_and_match_fields(kube: Any) -> None:
    nodes = [
        node("a", labels={ZONE: "a", "cores": "8"}),
        node("b", labels={ZONE: "b", "cores": "4"}),
        node("c", labels={ZONE: "c"}),
    ]
    # terms are ORed, expressions ANDed; an invalid Gt value makes its term match nothing
    affinity = _required(
        {
            "matchExpressions": [
                {"key": ZONE, "operator": "In", "values": ["a", "b"]},
                {"key": "cores", "operator": "Gt", "values": ["5"]},
            ]
        },
        {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["abc"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]},
    )
    answer = agree(kube, case(nodes, pod(affinity=affinity)))
    miss = rejected(UNRES, "node(s) didn't match Pod's node affinity/selector")
    assert answer.nodes == {"a": None, "b": miss, "c": None}

    # every term names nodes: PreFilter narrows to {a, b}; c is outside the set
    affinity = _required(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]},
        {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}],
            "matchExpressions": [{"key": ZONE, "operator": "In", "values": ["c"]}],
        },
    )
    answer = agree(kube, case(nodes, pod(affinity=affinity)))
    assert answer.nodes == {
        "a": None,
        "b": miss,
        "c": rejected(UNRES, "node(s) didn't satisfy plugin(s) [NodeAffinity]"),
    }

    # one term naming two different nodes: no node at all, said once in PreFilter
    affinity = _required(
        {
            "matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["a"]},
                {"key": "metadata.name", "operator": "In", "values": ["b"]},
            ]
        }
    )
    answer = agree(kube, case(nodes, pod(affinity=affinity)))
    assert answer.prefilter == rejected(UNRES, "pod affinity terms conflict")
    assert answer.message == "0/3 nodes are available: pod affinity terms conflict."

    # nodeSelector with required affinity: both must hold
    answer = agree(kube, case(nodes, pod(nodeSelector={"cores": "4"})))
    assert answer.nodes == {"a": miss, "b": None, "c": miss}


def test_node_ports(kube: Any) -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    bound = (
        pod(
            "local", on="n1", ports=[{"containerPort": 80, "hostPort": 8080, "hostIP": "127.0.0.1"}]
        ),
        pod("udp", on="n2", ports=[{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]),
        pod(
            "other", on="n3", ports=[{"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}]
        ),
    )
    conflict = rejected(UNSCHED, "node(s) didn't have free ports for the requested pod ports")
    wanted = [{"containerPort": 8080, "hostPort": 8080, "hostIP": "127.0.0.1"}]
    answer = agree(kube, case(nodes, pod(ports=wanted), bound))
    assert answer.nodes == {"n1": conflict, "n2": None, "n3": None}
    # a wildcard address conflicts with every address of the same protocol and port
    answer = agree(kube, case(nodes, pod(ports=[{"containerPort": 80, "hostPort": 8080}]), bound))
    assert answer.nodes == {"n1": conflict, "n2": None, "n3": conflict}


def _term(labels: dict[str, str], key: str, **more: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": labels}, "topologyKey": key, **more}


def test_inter_pod_affinity(kube: Any) -> None:
    host = "kubernetes.io/hostname"
    nodes = [
        node("a1", labels={ZONE: "a"}),
        node("a2", labels={ZONE: "a"}),
        node("b1", labels={ZONE: "b"}),
        node("nozone"),
    ]
    guard = pod(
        "guard",
        on="b1",
        labels={"app": "guard"},
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [_term({"app": "web"}, host)]
            }
        },
    )
    bound = (pod("web-0", on="a1", labels={"app": "web"}), guard)
    # the incoming pod's anti-affinity (zone), and the guard's (symmetric, hostname)
    incoming = pod(
        labels={"app": "web"},
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [_term({"app": "web"}, ZONE)]
            }
        },
    )
    answer = agree(kube, case(nodes, incoming, bound))
    anti = rejected(UNSCHED, "node(s) didn't match pod anti-affinity rules")
    assert answer.nodes == {
        "a1": anti,
        "a2": anti,
        "b1": rejected(UNSCHED, "node(s) didn't satisfy existing pods anti-affinity rules"),
        "nozone": None,
    }
    # affinity: only where a web pod runs in the zone; a node without the key never
    affine = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [_term({"app": "web"}, ZONE)]
        }
    }
    answer = agree(kube, case(nodes, pod(labels={"app": "db"}, affinity=affine), bound))
    no = rejected(UNRES, "node(s) didn't match pod affinity rules")
    assert answer.nodes == {"a1": None, "a2": None, "b1": no, "nozone": no}
    # the first of a series that wants itself: allowed wherever the key is
    own = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [_term({"app": "cache"}, ZONE)]
        }
    }
    answer = agree(kube, case(nodes, pod(labels={"app": "cache"}, affinity=own), bound))
    assert answer.nodes == {"a1": None, "a2": None, "b1": None, "nozone": no}
    # a namespace selector: web pods in team-a namespaces only
    selected = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                _term({"app": "web"}, ZONE, namespaceSelector={"matchLabels": {"team": "a"}})
            ]
        }
    }
    bound_ns = (*bound, pod("web-a", ns="team-a", on="b1", labels={"app": "web"}))
    answer = agree(kube, case(nodes, pod(labels={"app": "db"}, affinity=selected), bound_ns))
    assert answer.nodes == {"a1": None, "a2": None, "b1": anti, "nozone": None}


def _spread(**more: Any) -> dict[str, Any]:
    return {
        "maxSkew": 1,
        "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
        **more,
    }


def test_topology_spread(kube: Any) -> None:
    nodes = [
        node("a1", labels={ZONE: "a"}),
        node("a2", labels={ZONE: "a"}),
        node("b1", labels={ZONE: "b"}),
        node("c1", labels={ZONE: "c"}),
        node("nozone"),
    ]
    web = {"app": "web"}
    bound = (
        pod("w0", on="a1", labels=web),
        pod("w1", on="a2", labels=web),
        pod("w2", on="b1", labels=web),
        pod("gone", on="c1", labels=web, terminating=True),  # not counted
        pod("other-ns", ns="team-a", on="c1", labels=web),  # not counted
    )
    incoming = pod(labels=web, topologySpreadConstraints=[_spread()])
    answer = agree(kube, case(nodes, incoming, bound))
    skew = rejected(UNSCHED, "node(s) didn't match pod topology spread constraints")
    assert answer.nodes == {
        "a1": skew,
        "a2": skew,
        "b1": skew,
        "c1": None,
        "nozone": rejected(
            UNRES, "node(s) didn't match pod topology spread constraints (missing required label)"
        ),
    }
    # two domains, one web pod each: fine, unless minDomains asks for three (minimum 0)
    two = nodes[2:4]
    pair = (pod("w0", on="b1", labels=web), pod("w1", on="c1", labels=web))
    answer = agree(kube, case(two, incoming, pair))
    assert answer.nodes == {"b1": None, "c1": None}
    incoming = pod(labels=web, topologySpreadConstraints=[_spread(minDomains=3)])
    answer = agree(kube, case(two, incoming, pair))
    assert answer.nodes == {"b1": skew, "c1": skew}
    assert answer.message == (
        "0/2 nodes are available: 2 node(s) didn't match pod topology spread constraints."
    )


# --- divergences the random cases found (minimal repros; they fail until fixed) -----------


def test_pod_level_limits_default_the_requests(kube: Any) -> None:
    """The API server defaults pod-level requests to pod-level limits (PodLevelResources,
    beta and on since 1.34): 3 cpu on the node already, 2 more do not fit in 4."""
    nodes = [node("n1", cpu="4"), node("n2", cpu="4", memory="8Gi")]
    bound = (pod("capped", on="n1", resources={"limits": {"cpu": "3"}}),)
    answer = agree(kube, case(nodes, pod(requests={"cpu": "2"}), bound))
    assert answer.nodes == {"n1": rejected(UNSCHED, "Insufficient cpu"), "n2": None}
    answer = agree(kube, case(nodes, pod(resources={"limits": {"memory": "12Gi"}}), bound))
    assert answer.nodes["n2"] == rejected(UNRES, "Insufficient memory")


def test_gt_lt_parse_integers_as_go_does(kube: Any) -> None:
    """Gt/Lt compare base-10 int64s (strconv.ParseInt): "1_0" and 20 digits are not ones."""
    nodes = [
        node("twelve", labels={"cores": "12"}),
        node("underscore", labels={"cores": "1_0"}),
        node("huge", labels={"cores": "99999999999999999999"}),
    ]
    gt = _required({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]})
    answer = agree(kube, case(nodes, pod(affinity=gt)))
    miss = rejected(UNRES, "node(s) didn't match Pod's node affinity/selector")
    assert answer.nodes == {"twelve": None, "underscore": miss, "huge": miss}
    lt = _required({"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["1_00"]}]})
    answer = agree(kube, case(nodes, pod(affinity=lt)))
    assert answer.nodes == {"twelve": miss, "underscore": miss, "huge": miss}


def test_prefilter_message_counts_only_nodes(kube: Any) -> None:
    """A pod still bound to a deleted node does not make that node count in ``0/N``."""
    conflict = _required(
        {
            "matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]},
                {"key": "metadata.name", "operator": "In", "values": ["n2"]},
            ]
        }
    )
    bound = (pod("orphan", on="gone"),)
    answer = agree(kube, case([node("n1")], pod(affinity=conflict), bound))
    assert answer.message == "0/1 nodes are available: pod affinity terms conflict."


def test_volume_binding_and_volume_zone(kube: Any) -> None:
    """A bound claim's volume: its node affinity (whose ``metadata.name`` fields kube
    leaves unchecked), its zone labels (a beta one matched by a node's GA label); and an
    immediate claim not bound yet, refused in PreFilter."""
    nodes = [
        node("a", labels={ZONE: "z1"}),
        node("b", labels={ZONE: "z2"}),
        node("c", labels={ZONE: "z3"}),
        node("unzoned"),
    ]
    near = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["a", "b", "unzoned"]}
    elsewhere = {"key": "metadata.name", "operator": "In", "values": ["nowhere"]}
    volume = {
        "metadata": {
            "name": "pv-1",
            "labels": {"failure-domain.beta.kubernetes.io/zone": "z1__z3"},
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/data"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [{"matchExpressions": [near], "matchFields": [elsewhere]}]
                }
            },
        },
    }
    claim = {
        "metadata": {
            "name": "data",
            "namespace": "default",
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
        },
        "spec": {"storageClassName": "", "volumeName": "pv-1"},
        "status": {"phase": "Bound"},
    }
    mounts = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    c = {
        **case(nodes, pod(volumes=mounts)),
        "persistentVolumeClaims": [claim],
        "persistentVolumes": [volume],
    }
    answer = agree(kube, c)
    assert answer.nodes == {
        "a": None,
        "b": rejected(UNRES, "node(s) had no available volume zone"),
        "c": rejected(UNRES, "node(s) didn't match PersistentVolume's node affinity"),
        "unzoned": None,
    }
    unbound = {"metadata": {"name": "data", "namespace": "default"}, "spec": {}}
    answer = agree(kube, {**c, "persistentVolumeClaims": [unbound]})
    assert answer.message == (
        "0/4 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    )
