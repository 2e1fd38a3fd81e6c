"""The scheduling framework (shared/core/framework.py): plugins found by name, a
profile in kube-scheduler's shape over the defaults, every refusal naming its plugin."""

from __future__ import annotations

import gc
import pkgutil
import weakref
from typing import Any

import pytest

from shared.core import plugins
from shared.core.framework import (
    DEFAULT_DEVICES,
    DEFAULT_FILTERS,
    DEFAULT_SCORES,
    FilterPlugin,
    PluginRef,
    Plugins,
    PluginSet,
    Profile,
    ProfileError,
    ScorePlugin,
    registry,
)
from shared.core.hosts import pod_spec
from shared.core.model import NodeName
from shared.core.nodefit import Prepared
from shared.core.placement import Failure, Placement, PlacementConfig, Placer
from shared.core.policy import Shape, Workload
from tests.unit.corekit import MANAGED, gpu, gpus, npu, placer, ref, request
from tests.unit.test_nodefit import bind, hosts, node, pod
from tests.unit.test_policy import cluster as policy_cluster
from tests.unit.test_policy import pinned, put, share


def names(profile: Profile) -> tuple[list[str], list[tuple[str, int]]]:
    """A profile's filters by name in order, and its scores by name with their weights."""
    return [f.name for f in profile.filters], [(s.name, w) for s, w in profile.scores]


def test_every_plugin_module_ships_one_named_plugin_and_the_defaults_exist() -> None:
    modules = {m.name for m in pkgutil.iter_modules(plugins.__path__)}
    found = registry()
    assert {p.__module__.rsplit(".", 1)[1] for p in found.values()} == modules
    assert set(DEFAULT_FILTERS) <= {n for n, p in found.items() if issubclass(p, FilterPlugin)}
    assert {n for n, _ in DEFAULT_SCORES} <= {
        n for n, p in found.items() if issubclass(p, ScorePlugin)
    }


def test_the_default_profile_is_kube_schedulers_order_and_weights() -> None:
    filters, scores = names(Profile.build())
    assert filters == [
        "NodeUnschedulable",
        "NodeName",
        "TaintToleration",
        "NodeAffinity",
        "NodePorts",
        "NodeResourcesFit",
        "VolumeRestrictions",
        "VolumeBinding",
        "VolumeZone",
        "PodTopologySpread",
        "InterPodAffinity",
        "DynamicResources",
    ]
    assert scores == [
        ("NodeResourcesFit", 1),
        ("NodeResourcesBalancedAllocation", 1),
        ("TaintToleration", 3),
        ("NodeAffinity", 2),
        ("PodTopologySpread", 2),
        ("InterPodAffinity", 2),
        ("ImageLocality", 1),
    ]


def test_a_profile_merges_over_the_defaults_as_kube_scheduler_does() -> None:
    # A default named again keeps its place with the new weight; a disabled one goes;
    # "*" drops every default and the enabled ones come in their own order.
    profile = Profile.build(
        Plugins(
            score=PluginSet(
                enabled=[PluginRef(name="NodeAffinity", weight=7)],
                disabled=[PluginRef(name="TaintToleration")],
            ),
            filter=PluginSet(
                enabled=[PluginRef(name="NodePorts"), PluginRef(name="NodeUnschedulable")],
                disabled=[PluginRef(name="*")],
            ),
        )
    )
    filters, scores = names(profile)
    assert filters == ["NodePorts", "NodeUnschedulable"]
    assert scores == [
        ("NodeResourcesFit", 1),
        ("NodeResourcesBalancedAllocation", 1),
        ("NodeAffinity", 7),
        ("PodTopologySpread", 2),
        ("InterPodAffinity", 2),
        ("ImageLocality", 1),
    ]


@pytest.mark.parametrize(
    ("plugins_", "expected"),
    [
        (Plugins(filter=PluginSet(enabled=[PluginRef(name="GpuFit")])), "no filter plugin"),
        (Plugins(score=PluginSet(enabled=[PluginRef(name="NodePorts")])), "no score extension"),
        (Plugins(filter=PluginSet(disabled=[PluginRef(name="NodePortz")])), "no such plugin"),
    ],
)
def test_a_profile_naming_what_does_not_exist_is_refused(plugins_: Plugins, expected: str) -> None:
    with pytest.raises(ProfileError, match=expected):
        Profile.build(plugins_)


def test_each_refusal_names_the_plugin_that_decided_it() -> None:
    h = hosts(
        node("cordoned", unschedulable=True),
        node("tainted", taints=[{"key": "k", "value": "v", "effect": "NoExecute"}]),
        node("other-pool", labels={"pool": "b"}),
        node("small", cpu="1", labels={"pool": "a"}),
        node("port-taken", labels={"pool": "a"}),
        node("fits", labels={"pool": "a"}),
    )
    port = [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]
    bind(h, "port-taken", pod("1", containers=port), "holder")
    incoming = pod("2", nodeSelector={"pool": "a"}, containers=port)
    incoming["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}
    prep = h.prepare(pod_spec(incoming, MANAGED))
    assert isinstance(prep, Prepared)
    decided = {}
    for name, host in sorted(h.nodes.items()):
        status = prep.filter(host)
        decided[name] = status.plugin if status is not None else None
    assert decided == {
        "cordoned": "NodeUnschedulable",
        "tainted": "TaintToleration",
        "other-pool": "NodeAffinity",
        "small": "NodeResourcesFit",
        "port-taken": "NodePorts",
        "fits": None,
    }


def test_a_filter_left_out_of_the_profile_no_longer_refuses() -> None:
    h = hosts(node("tainted", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]))
    spec = pod_spec(pod("1"), MANAGED)
    prep = h.prepare(spec)
    assert isinstance(prep, Prepared)
    assert prep.filter(h.nodes[NodeName("tainted")]) is not None
    h.profile = Profile.build(
        Plugins(filter=PluginSet(disabled=[PluginRef(name="TaintToleration")]))
    )
    prep = h.prepare(spec)
    assert isinstance(prep, Prepared)
    assert prep.filter(h.nodes[NodeName("tainted")]) is None


def test_score_weights_come_from_the_profile() -> None:
    # "busy" packs better (binpack: most allocated); "ssd" is what the pod prefers.
    h = hosts(node("busy"), node("ssd", labels={"disk": "ssd"}))
    bind(h, "busy", pod("6"), "load")
    preferred = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 1,
                "preference": {
                    "matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]
                },
            }
        ]
    }
    spec = pod_spec(pod("1", affinity={"nodeAffinity": preferred}), MANAGED)
    targets = [h.nodes[NodeName("busy")], h.nodes[NodeName("ssd")]]

    def best() -> str:
        prep = h.prepare(spec)
        assert isinstance(prep, Prepared)
        scores = prep.score(targets, "binpack")
        return targets[scores.index(max(scores))].name

    assert best() == "ssd"  # NodeAffinity's 2 x 100 outweighs the packing
    h.profile = Profile.build(Plugins(score=PluginSet(disabled=[PluginRef(name="NodeAffinity")])))
    assert best() == "busy"
    h.profile = Profile.build(
        Plugins(score=PluginSet(enabled=[PluginRef(name="NodeResourcesFit", weight=10)]))
    )
    assert (
        best() == "busy"
    )  # 10 x the packing difference (cpu and memory averaged) outweighs 2 x 100


def _with_images(name: str, *images: tuple[str, int]) -> dict[str, Any]:
    obj = node(name)
    obj["status"]["images"] = [{"names": [n], "sizeBytes": mib << 20} for n, mib in images]
    return obj


def test_image_locality_weighs_the_images_a_node_holds_by_how_many_nodes_share_them() -> None:
    cuda = ("registry.example/cuda:12", 2000)
    base = ("registry.example/base:latest", 600)
    h = hosts(
        _with_images("cuda-here", cuda),
        _with_images("base-everywhere-1", base),
        _with_images("base-everywhere-2", base),
        node("bare"),
    )
    obj = pod("1")
    obj["spec"]["containers"][0]["image"] = "registry.example/cuda:12"
    obj["spec"]["initContainers"] = [{"name": "setup", "image": "registry.example/base"}]
    spec = pod_spec(obj, MANAGED)
    assert spec.images == ("registry.example/base:latest", "registry.example/cuda:12")
    only = Profile.build(
        Plugins(
            score=PluginSet(
                disabled=[PluginRef(name="*")], enabled=[PluginRef(name="ImageLocality")]
            )
        )
    )
    h.profile = only
    prep = h.prepare(spec)
    assert isinstance(prep, Prepared)
    names = ["cuda-here", "base-everywhere-1", "bare"]
    scores = dict(
        zip(names, prep.score([h.nodes[NodeName(n)] for n in names], "spread"), strict=True)
    )
    # kube-scheduler's formula: size x (nodes holding it / nodes), clamped to 23 MiB ..
    # 1000 MiB per container (two here), scaled to 0-100
    low, high = 23 << 20, 2 * (1000 << 20)
    cuda_held = int((2000 << 20) * (1 / 4))
    base_held = int((600 << 20) * (2 / 4))
    assert scores == {
        "cuda-here": float(100 * (cuda_held - low) // (high - low)),
        "base-everywhere-1": float(100 * (base_held - low) // (high - low)),
        "bare": 0.0,
    }
    # the node that held it alone goes: no node holds it any more
    h.drop_spec(NodeName("cuda-here"))
    assert "registry.example/cuda:12" not in h.images
    assert h.images["registry.example/base:latest"] == (600 << 20, 2)


def test_a_request_no_node_can_serve_is_one_status_decided_by_the_request_check() -> None:
    from shared.core.model import RequestError
    from shared.core.request import REQUEST_CHECK, refused, rejection

    errors = [
        RequestError(field="nvidia.com/gpucores (container main)", message="150 is above 100"),
        RequestError(field="nvidia.com/gpumem (container main)", message="-1 is negative"),
    ]
    status = refused(errors)
    assert status.unresolvable
    assert {r.plugin for r in status.reasons} == {REQUEST_CHECK}
    assert rejection(errors) == (
        "invalid device request: nvidia.com/gpucores (container main): 150 is above 100; "
        "nvidia.com/gpumem (container main): -1 is negative"
    )


# --- Tessera's own points: device families and node policies ------------------------------


def profile_of(**points: PluginSet) -> Profile:
    return Profile.build(Plugins(**points))


def off(*names_: str) -> PluginSet:
    return PluginSet(disabled=[PluginRef(name=n) for n in names_])


def test_device_families_and_node_policies_are_plugins_of_the_profile() -> None:
    default = Profile.build()
    assert [d.name for d in default.devices] == list(DEFAULT_DEVICES)
    assert [(k.name, w) for k, w in default.policies] == [
        ("Binpack", 5),
        ("Spread", 5),
        ("FGD", 0),
        ("FragmentationGuard", 0),
    ]
    changed = profile_of(
        filter=off("MIGInstances"),
        score=PluginSet(
            enabled=[PluginRef(name="Spread", weight=9)], disabled=[PluginRef(name="FGD")]
        ),
    )
    assert [d.name for d in changed.devices] == ["DeviceShare", "AscendTemplates", "AscendCores"]
    assert [(k.name, w) for k, w in changed.policies] == [
        ("Binpack", 5),
        ("Spread", 9),
        ("FragmentationGuard", 0),
    ]
    assert [p.name for p in default.post_filters] == [
        "Consolidation",
        "DefaultPreemption",
        "StarvationHold",
    ]
    assert [p.name for p in profile_of(post_filter=off("DefaultPreemption")).post_filters] == [
        "Consolidation",
        "StarvationHold",
    ]
    with pytest.raises(ProfileError, match="'NodePorts' has no postFilter extension point"):
        profile_of(post_filter=PluginSet(enabled=[PluginRef(name="NodePorts")]))
    with pytest.raises(ProfileError, match="'FGD' chooses by its own measure"):
        profile_of(score=PluginSet(enabled=[PluginRef(name="FGD", weight=2)]))
    with pytest.raises(ProfileError, match="'DeviceShare' has no score extension point"):
        profile_of(score=PluginSet(enabled=[PluginRef(name="DeviceShare")]))
    with pytest.raises(ProfileError, match="'Binpack' has no filter extension point"):
        profile_of(filter=PluginSet(enabled=[PluginRef(name="Binpack")]))


def test_a_request_whose_family_the_profile_leaves_out_is_told_so() -> None:
    pl = placer({"n": [npu()], "g": [gpu(0)]})
    limits = {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 10000}
    assert isinstance(pl.place(ref(), request(limits)), Placement)
    pl.ledger.hosts.profile = profile_of(filter=off("AscendTemplates"))
    refused = pl.place(ref(), request(limits))
    assert isinstance(refused, Failure)
    assert refused.unresolvable
    assert refused.status.reasons[0].plugin == "AscendTemplates"
    assert refused.message == (
        "0/2 nodes are available: 2 huawei.com/Ascend910B3: plugin AscendTemplates is not "
        "enabled in scheduler.plugins."
    )
    # the other families still serve theirs
    assert isinstance(pl.place(ref(), request({"nvidia.com/gpu": 1})), Placement)


def test_a_node_policy_the_profile_leaves_out_is_refused_by_name() -> None:
    pl = placer({"n": [gpu(0)]})
    pl.ledger.hosts.profile = profile_of(score=off("FGD"))
    fgd = {"hami.io/node-scheduler-policy": "fgd"}
    refused = pl.place(ref(), request({"nvidia.com/gpu": 1}, annotations=fgd))
    assert isinstance(refused, Failure)
    assert refused.unresolvable
    assert refused.message == "node policy fgd: plugin FGD is not enabled in scheduler.plugins"
    assert isinstance(pl.place(ref(), request({"nvidia.com/gpu": 1})), Placement)


def test_leaving_the_fragmentation_guard_out_is_binpacks_first_fit() -> None:
    # test_pace.py's pair: weighed, a 40 % pod goes where its rest stays usable ("roomy");
    # binpack's first fit takes the tightest card ("tight").
    workload = Workload.of([(Shape(1, 0.4), 1.0)])

    def chosen(profile: Profile, config: PlacementConfig | None = None) -> str:
        pl = Placer(
            policy_cluster({"tight": ("64", gpus(1)), "roomy": ("64", gpus(1))}), config, workload
        )
        pl.ledger.hosts.profile = profile
        pinned(pl, "1", share(50), "tight")
        pinned(pl, "1", share(20), "roomy")
        return put(pl, "1", share(40)).node

    assert chosen(Profile.build()) == "roomy"
    assert chosen(profile_of(score=off("FragmentationGuard"))) == "tight"
    assert chosen(Profile.build(), PlacementConfig(fragmentation_guard=0)) == "tight"


def test_the_walk_orders_weight_comes_from_the_profile() -> None:
    # Two nodes fit a pod with a preferred node affinity for the second in the walk:
    # binpack's order (weight 5: 500 points to the first) outweighs NodeAffinity's 200,
    # weight 1 does not.
    def chosen(weight: int) -> str:
        pl = Placer(policy_cluster({"a": ("64", gpus(1)), "b": ("64", gpus(1))}))
        pl.ledger.hosts.profile = profile_of(
            score=PluginSet(enabled=[PluginRef(name="Binpack", weight=weight)])
        )
        pinned(pl, "1", share(50), "a")  # the tighter card: first in binpack's walk
        affinity = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["b"]}
                            ]
                        },
                    }
                ]
            }
        }
        return put(pl, "1", share(20), affinity=affinity).node

    assert chosen(5) == "a"
    assert chosen(1) == "b"


def test_a_dropped_placer_frees_its_ledger_without_the_cycle_collector() -> None:
    # The per-placer plugins and FGD's memo keep no reference to the placer: a cycle
    # would keep every dropped ledger (10,000 nodes in bench/core.py) until a full
    # collection, and slow every later allocation while it waits.
    pl = placer({"n": gpus(2)})
    assert isinstance(pl.place(ref(), request({"nvidia.com/gpu": 1})), Placement)
    assert pl.policies
    assert pl.families
    dropped = weakref.ref(pl.ledger)
    gc.disable()
    try:
        del pl
        assert dropped() is None
    finally:
        gc.enable()
