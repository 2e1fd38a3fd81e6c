"""The scheduling framework (shared/core/framework.py): plugins found by name, a
profile in kube-scheduler's shape over the defaults, every refusal naming its plugin."""

from __future__ import annotations

import pkgutil
from typing import Any

import pytest

from shared.core import plugins
from shared.core.framework import (
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
from tests.unit.corekit import MANAGED
from tests.unit.test_nodefit import bind, hosts, node, pod


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
