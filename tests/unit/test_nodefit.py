"""Node fit on the pure core (shared/core/hosts.py, shared/core/nodefit.py): requests
as kube-scheduler counts them, each filter's reason, the indexes, and placement with
every constraint on (pods without devices, gangs whose members repel each other).
Agreement with kube-scheduler itself, case by case, is bench/parity.py's."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.hosts import PodSpec, node_spec, pod_requests, pod_spec
from shared.core.ledger import Ledger
from shared.core.model import NodeName, PodRequest
from shared.core.nodefit import Hosts, Prepared
from shared.core.placement import Failure, GangMember, Placement, Placer
from shared.core.plugins.node_affinity import NODE_AFFINITY, OUTSIDE_NODE_SET
from shared.core.plugins.node_name import NODE_NAME
from shared.core.plugins.node_unschedulable import NODE_UNSCHEDULABLE
from shared.core.plugins.taint_toleration import TAINTED
from shared.core.status import Code, Status
from tests.unit.corekit import MANAGED, SPECS, gpus, ref, request

ZONE = "topology.kubernetes.io/zone"


def node(name: str, *, cpu: str = "8", pods: str = "10", **spec: Any) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, **spec.pop("labels", {})}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {"allocatable": {"cpu": cpu, "memory": "32Gi", "pods": pods}},
    }


def pod(
    cpu: str = "1",
    *,
    labels: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}],
        **spec,
    }
    if init:
        body["initContainers"] = init
    return {"metadata": {"namespace": "ns", "labels": labels or {}}, "spec": body}


def hosts(*nodes: dict[str, Any]) -> Hosts:
    h = Hosts()
    for n in nodes:
        h.set_spec(node_spec(n))
    return h


def bind(h: Hosts, name: str, obj: dict[str, Any], uid: str) -> None:
    h.add_pod(ref(uid).uid, NodeName(name), pod_spec(obj, MANAGED))


def why(h: Hosts, obj: dict[str, Any] | PodSpec) -> dict[str, str | None]:
    """Each node's first failing filter (its reason texts), None where the pod fits."""
    prep = h.prepare(obj if isinstance(obj, PodSpec) else pod_spec(obj, MANAGED))
    assert isinstance(prep, Prepared), prep
    out: dict[str, str | None] = {}
    for name, host in sorted(h.nodes.items()):
        status = prep.filter(host)
        out[name] = None if status is None else ", ".join(r.text() for r in status.reasons)
    return out


# --- requests -----------------------------------------------------------------------------


def test_init_and_sidecar_containers_count_as_kube_scheduler_counts_them() -> None:
    spec = pod(
        "1",
        init=[
            {
                "name": "sidecar",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "500m"}},
            },
            {"name": "setup", "resources": {"limits": {"cpu": "3"}}},  # requests default to limits
        ],
        overhead={"cpu": "100m"},
    )["spec"]
    # app 1 + sidecar 0.5 running together = 1.5; the setup step runs beside the sidecar:
    # 3 + 0.5 = 3.5, the larger; plus the overhead.
    assert pod_requests(spec)["cpu"] == 3_600_000_000  # in billionths of a cpu


def test_tessera_device_names_are_left_to_the_device_families() -> None:
    obj = pod()
    obj["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": 1,
        "example.com/nic": 2,
    }
    spec = pod_spec(obj, MANAGED)
    assert "nvidia.com/gpu" not in spec.requests
    assert spec.requests["example.com/nic"] == 2


# --- filters --------------------------------------------------------------------------------


def test_each_filter_rejects_with_kube_schedulers_reason_in_its_order() -> None:
    h = hosts(
        node("cordoned", unschedulable=True, taints=[{"key": "k", "effect": "NoSchedule"}]),
        node("tainted", taints=[{"key": "k", "value": "v", "effect": "NoExecute"}]),
        node("other-pool", labels={"pool": "b"}),
        node("small", cpu="1", labels={"pool": "a"}),
        node("fits", labels={"pool": "a"}),
    )
    assert why(h, pod("2", nodeSelector={"pool": "a"})) == {
        "cordoned": "node(s) were unschedulable",
        "tainted": "node(s) had untolerated taint(s)",
        "other-pool": "node(s) didn't match Pod's node affinity/selector",
        "small": "Insufficient cpu",
        "fits": None,
    }


NODE_ONLY = (OUTSIDE_NODE_SET, NODE_UNSCHEDULABLE, NODE_NAME, TAINTED, NODE_AFFINITY)
POOLS = st.sampled_from(["a", "b", "c"])
TAINTS = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(["gpu", "spot"]),
            "value": st.sampled_from(["", "x"]),
            "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
        }
    ),
    max_size=2,
)
NODES = st.lists(
    st.builds(
        lambda pool, taints, cordoned: {
            "labels": {"pool": pool},
            "taints": taints,
            "unschedulable": cordoned,
        },
        POOLS,
        TAINTS,
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)
PODS = st.builds(
    lambda selector, tolerations, avoid, named: {
        **({"nodeSelector": {"pool": selector}} if selector else {}),
        "tolerations": tolerations,
        **({"nodeName": named} if named else {}),
        **(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "NotIn", "values": [avoid]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            }
            if avoid
            else {}
        ),
    },
    st.one_of(st.none(), POOLS),
    st.lists(
        st.fixed_dictionaries(
            {
                "key": st.sampled_from(["gpu", "spot", "node.kubernetes.io/unschedulable"]),
                "operator": st.just("Exists"),
            }
        ),
        max_size=2,
    ),
    st.one_of(st.none(), POOLS),
    st.one_of(st.none(), st.sampled_from(["n0", "n1"])),
)


@settings(max_examples=300, deadline=None)
@given(NODES, st.lists(PODS, min_size=1, max_size=4), st.integers(0, 7), TAINTS)
def test_the_nodes_a_walk_skips_are_those_the_node_only_filters_reject(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    changed: int,
    taints: list[dict[str, str]],
) -> None:
    """``Prepared.ruled_out`` (the nodes the device walk skips unfitted) is exactly the
    nodes whose first failing filter reads the Node object alone, for pods of several
    shapes sharing its cache, and still after a node's taints change."""
    h = hosts(*(node(f"n{i}", **spec) for i, spec in enumerate(nodes)))

    def check() -> None:
        for spec in pods:
            prep = h.prepare(pod_spec(pod(**spec), MANAGED))
            assert isinstance(prep, Prepared)
            rejected = {n for n, host in h.nodes.items() if prep.filter(host) in NODE_ONLY}
            if spec.get("nodeName"):
                assert prep.ruled_out() == frozenset()  # pinned: the walk finds it alone
            else:
                assert prep.ruled_out() == rejected

    check()
    which = changed % len(nodes)
    h.set_spec(node_spec(node(f"n{which}", **{**nodes[which], "taints": taints})))
    check()


def test_tolerations_match_by_key_value_and_effect() -> None:
    h = hosts(node("n", taints=[{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]))
    wrong = [{"key": "gpu", "operator": "Equal", "value": "v100", "effect": "NoSchedule"}]
    right = [{"key": "gpu", "operator": "Equal", "value": "a100"}]
    anything = [{"operator": "Exists"}]
    assert why(h, pod(tolerations=wrong))["n"] == "node(s) had untolerated taint(s)"
    assert why(h, pod(tolerations=right))["n"] is None
    assert why(h, pod(tolerations=anything))["n"] is None


def test_resources_report_every_shortfall_and_whether_load_could_help() -> None:
    h = hosts(node("n", cpu="4", pods="1"))
    bind(h, "n", pod("3"), "busy")
    prep = h.prepare(pod_spec(pod("2"), MANAGED))
    assert isinstance(prep, Prepared)
    status = prep.filter(h.nodes[NodeName("n")])
    assert status is not None
    assert [r.text() for r in status.reasons] == ["Too many pods", "Insufficient cpu"]
    assert status.code == Code.UNSCHEDULABLE  # 2 of 4 cpu: a release would help
    never = h.prepare(pod_spec(pod("5"), MANAGED))
    assert isinstance(never, Prepared)
    huge = never.filter(h.nodes[NodeName("n")])
    assert huge is not None
    assert huge.code == Code.UNRESOLVABLE


def test_host_ports_conflict_on_the_wildcard_address() -> None:
    h = hosts(node("n"))
    web = [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]
    bind(h, "n", pod(containers=web), "web")
    other_ip = [
        {"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}]}
    ]
    udp = [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]
    assert why(h, pod(containers=other_ip))["n"] == (
        "node(s) didn't have free ports for the requested pod ports"
    )
    assert why(h, pod(containers=udp))["n"] is None


def test_required_anti_affinity_works_both_ways() -> None:
    h = hosts(
        node("a1", labels={ZONE: "a"}),
        node("a2", labels={ZONE: "a"}),
        node("b1", labels={ZONE: "b"}),
    )
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}
            ]
        }
    }
    bind(h, "a1", pod(labels={"app": "db"}, affinity=anti), "db-0")
    mine = why(h, pod(labels={"app": "db"}, affinity=anti))
    assert mine == {
        "a1": "node(s) didn't match pod anti-affinity rules",
        "a2": "node(s) didn't match pod anti-affinity rules",
        "b1": None,
    }
    theirs = why(h, pod(labels={"app": "db"}))  # no rule of its own: db-0's keeps it out
    assert theirs["a2"] == "node(s) didn't satisfy existing pods anti-affinity rules"
    assert theirs["b1"] is None


def test_a_first_pod_may_satisfy_its_own_affinity() -> None:
    h = hosts(node("z", labels={ZONE: "a"}), node("no-zone"))
    near = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ZONE}
            ]
        }
    }
    found = why(h, pod(labels={"app": "x"}, affinity=near))
    assert found == {"no-zone": "node(s) didn't match pod affinity rules", "z": None}


def test_topology_spread_counts_domains_and_min_domains() -> None:
    h = hosts(node("a", labels={ZONE: "a"}), node("b", labels={ZONE: "b"}), node("none"))
    bind(h, "a", pod(labels={"app": "w"}), "w-0")
    constraint = {
        "maxSkew": 1,
        "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "w"}},
    }
    found = why(h, pod(labels={"app": "w"}, topologySpreadConstraints=[constraint]))
    assert found == {
        "a": "node(s) didn't match pod topology spread constraints",
        "b": None,
        "none": "node(s) didn't match pod topology spread constraints (missing required label)",
    }
    # With 3 domains required and 2 known, the global minimum counts as 0.
    strict = {**constraint, "minDomains": 3, "maxSkew": 2}
    found = why(h, pod(labels={"app": "w"}, topologySpreadConstraints=[strict]))
    assert found["a"] is None
    assert found["b"] is None


def test_match_fields_narrow_the_nodes_and_a_conflict_rejects_them_all() -> None:
    h = hosts(node("n1"), node("n2"))

    def pinned(*terms: list[str]) -> dict[str, Any]:
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": values}
                                for values in terms
                            ]
                        }
                    ]
                }
            }
        }

    assert why(h, pod(affinity=pinned(["n2"]))) == {
        "n1": "node(s) didn't satisfy plugin(s) [NodeAffinity]",
        "n2": None,
    }
    conflict = h.prepare(pod_spec(pod(affinity=pinned(["n1"], ["n2"])), MANAGED))
    assert isinstance(conflict, Status)
    assert conflict.message() == "0/2 nodes are available: pod affinity terms conflict."


# --- indexes and placement -------------------------------------------------------------------


def placer_with(nodes: dict[str, dict[str, Any]], gpu_nodes: tuple[str, ...] = ()) -> Placer:
    from shared.core.hosts import node_spec

    ledger = Ledger(SPECS)
    for name, obj in nodes.items():
        ledger.set_spec(node_spec(obj))
        if name in gpu_nodes:
            ledger.set_node(NodeName(name), gpus(2))
    return Placer(ledger)


def test_a_pod_without_devices_is_placed_on_cpu_and_memory_alone() -> None:
    pl = placer_with({"small": node("small", cpu="1"), "big": node("big", cpu="16")})
    placed = pl.place(ref(), PodRequest(), spec=pod_spec(pod("4"), MANAGED))
    assert isinstance(placed, Placement)
    assert placed.node == "big"
    assert placed.grants == ()
    failed = pl.place(ref(), PodRequest(), spec=pod_spec(pod("64"), MANAGED))
    assert isinstance(failed, Failure)
    assert failed.message == "0/2 nodes are available: 2 Insufficient cpu."
    assert failed.unresolvable


def test_gang_members_repel_each_other_inside_the_transaction() -> None:
    names = ("n1", "n2")
    pl = placer_with({n: node(n) for n in names}, gpu_nodes=names)
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"job": "j"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    spec = pod_spec(pod(labels={"job": "j"}, affinity=anti), MANAGED)
    two = [
        GangMember(pod=ref(), request=request({"nvidia.com/gpu": 1}), spec=spec) for _ in range(2)
    ]
    result = pl.place_gang(two, 2)
    assert result.ok
    assert {p.node for p in result.placed} == set(names)
    before = pl.ledger.snapshot()
    three = [
        GangMember(pod=ref(), request=request({"nvidia.com/gpu": 1}), spec=spec) for _ in range(3)
    ]
    assert not pl.place_gang(three, 3).ok
    assert pl.ledger.snapshot() == before  # the failed gang left no pod counted anywhere


def test_a_node_out_of_cpu_leaves_the_device_index_and_comes_back_when_freed() -> None:
    pl = placer_with({"n": node("n", cpu="2")}, gpu_nodes=("n",))
    spec = pod_spec(pod("2"), MANAGED)
    first = pl.place(
        ref("first"), request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}), spec=spec
    )
    assert isinstance(first, Placement)
    host = pl.ledger.nodes[NodeName("n")].host
    assert host.full  # 0 of 2 cpu free: nothing seen so far fits
    assert all(
        d not in pl.ledger.pools[d.pool].where for d in pl.ledger.nodes[NodeName("n")].devices
    )
    refused = pl.place(ref(), request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}), spec=spec)
    assert isinstance(refused, Failure)
    assert "Insufficient cpu" in refused.message
    pl.release(first.pod)
    assert not host.full
    assert isinstance(
        pl.place(ref(), request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}), spec=spec),
        Placement,
    )
