"""The fragmentation measure (shared/core/policy.py) on small nodes computed by hand, and
FGD's choices that follow from it (cpu and memory counted, GPU types, pods with no GPU)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from shared.core.hosts import node_spec, pod_spec
from shared.core.ledger import Ledger
from shared.core.model import DeviceInfo, NodeName, PodRequest
from shared.core.placement import Placement, PlacementConfig, Placer
from shared.core.policy import Shape, Workload, fragmentation, shape_fraction, usable
from tests.unit.corekit import MANAGED, PARSER, SPECS, gpus, ref

GIB = 2**30
WHOLE = Shape(1, 1.0)
HALF = Shape(1, 0.5)
FGD = PlacementConfig(node_policy="fgd", device_policy="fgd", fgd_candidates=0)


def both(w: Workload, free: list[float], **host: Any) -> float:
    """The memoised measure, checked against the definition one type at a time."""
    model = host.pop("model", "")
    fast = w.fragmentation(free, model, host.get("cpu_milli"), host.get("memory"))
    models = [model] * len(free) if model else None
    slow = fragmentation(free, w.normalised(), models=models, **host)
    assert fast == pytest.approx(slow)
    return fast


# --- the measure, by hand ------------------------------------------------------------


def test_each_type_counts_the_shares_too_small_for_it() -> None:
    w = Workload.of([(WHOLE, 1.0), (Shape(1, 0.4), 1.0)])
    # whole card: fits the idle card, cannot use 0.5 + 0.2; 0.4: cannot use the 0.2
    assert both(w, [1.0, 0.5, 0.2]) == pytest.approx(0.5 * 0.7 + 0.5 * 0.2)


def test_a_type_that_does_not_fit_at_all_counts_every_free_share() -> None:
    w = Workload.of([(Shape(2, 1.0), 1.0)])
    assert both(w, [1.0, 0.5, 1.0]) == pytest.approx(0.5)  # two idle cards: fits
    assert both(w, [1.0, 0.5]) == pytest.approx(1.5)  # one idle card: all of it
    assert usable([1.0, 0.5], 2, 1.0) == 0.0
    assert both(w, [0.0, 0.0]) == 0.0  # nothing free, nothing fragmented


def test_a_node_whose_cpu_is_exhausted_counts_all_its_free_gpus() -> None:
    w = Workload.of([(Shape(1, 1.0, cpu_milli=4000), 1.0), (Shape(1, 0.5, cpu_milli=8000), 1.0)])
    free = [1.0, 1.0, 1.0, 0.25]
    assert both(w, free, cpu_milli=64000, memory=64 * GIB) == pytest.approx(0.25)
    # 6 cores left: the half-card type no longer fits the host, all 3.25 GPUs count for
    # it; the whole-card type fits once, so one idle card is all it can use
    assert both(w, free, cpu_milli=6000, memory=64 * GIB) == pytest.approx(0.5 * 2.25 + 0.5 * 3.25)
    # 2 cores left: no GPU task fits, every free share is a fragment
    assert both(w, free, cpu_milli=2000, memory=64 * GIB) == pytest.approx(3.25)


def test_a_type_uses_only_the_devices_its_tasks_the_host_holds_can_take() -> None:
    w = Workload.of([(Shape(1, 1.0, cpu_milli=8000), 1.0)])
    eight = [1.0] * 8
    assert both(w, eight, cpu_milli=64000) == 0.0  # cores for 8 tasks: every card usable
    assert both(w, eight, cpu_milli=16000) == pytest.approx(6.0)  # 2 tasks, 2 cards
    assert both(w, eight, cpu_milli=16000, memory=10 * GIB) == pytest.approx(6.0)
    pairs = Workload.of([(Shape(2, 1.0, memory=4 * GIB), 1.0)])
    assert both(pairs, eight, memory=12 * GIB) == pytest.approx(2.0)  # 3 pairs: 6 cards
    # a share of a card: the roomiest devices, one per task
    half = Workload.of([(Shape(1, 0.5, cpu_milli=8000), 1.0)])
    assert both(half, [1.0, 0.5, 0.3], cpu_milli=8000) == pytest.approx(0.8)
    assert both(half, [1.0, 0.5, 0.3], cpu_milli=16000) == pytest.approx(0.3)
    assert usable([1.0, 0.5, 0.3], 1, 0.5) == usable([1.0, 0.5, 0.3], 1, 0.5, tasks=3) == 1.5


def test_memory_counts_as_cpu_does() -> None:
    w = Workload.of([(Shape(1, 1.0, memory=32 * GIB), 1.0)])
    assert both(w, [1.0, 1.0], cpu_milli=10**6, memory=64 * GIB) == 0.0
    assert both(w, [1.0, 1.0], cpu_milli=10**6, memory=16 * GIB) == pytest.approx(2.0)


def test_a_model_constrained_type_cannot_use_other_models() -> None:
    v100 = Shape(1, 1.0, use_types=("v100",))
    w = Workload.of([(v100, 1.0), (WHOLE, 1.0)])
    assert both(w, [1.0, 1.0], model="tesla-t4") == pytest.approx(0.5 * 2.0)
    assert both(w, [1.0, 1.0], model="tesla-v100-sxm2-16gb") == 0.0
    not_t4 = Workload.of([(Shape(1, 1.0, nouse_types=("t4",)), 1.0)])
    assert both(not_t4, [1.0], model="tesla-t4") == pytest.approx(1.0)
    assert both(not_t4, [1.0], model="a100") == 0.0


def test_on_a_node_of_two_models_each_type_uses_only_its_own() -> None:
    w = Workload.of([(Shape(1, 1.0, use_types=("v100",)), 1.0)])
    models = ("tesla-t4", "tesla-v100")
    assert w.fragmentation([1.0, 1.0], models) == pytest.approx(1.0)  # the idle T4
    assert w.fragmentation([1.0, 0.5], models) == pytest.approx(1.5)  # no idle V100


def test_the_memoised_measure_is_the_definition_on_random_nodes() -> None:
    rng = random.Random(7)
    shapes = [
        (Shape(rng.choice((1, 1, 2, 4)), 1.0, rng.choice((0, 2000, 8000)), 0), 1.0)
        for _ in range(4)
    ] + [
        (Shape(1, rng.choice((0.25, 0.5, 0.81)), rng.choice((1000, 6000)), GIB), 1.0)
        for _ in range(4)
    ]
    w = Workload.of(shapes)
    for _ in range(300):
        free = [rng.choice((0.0, 0.19, 0.5, 0.75, 1.0)) for _ in range(rng.randint(1, 8))]
        cpu = rng.choice((None, 0, 1000, 6000, 13000, 40000))
        memory = rng.choice((None, 2 * GIB, 64 * GIB))
        before = both(w, free, cpu_milli=cpu, memory=memory)
        # a pod taking no device changes the measure only where ``crosses`` says so
        if cpu is not None:
            after_cpu = max(0, cpu - rng.choice((500, 2000, 7000)))
            after = both(w, free, cpu_milli=after_cpu, memory=memory)
            crosses = w.tables().crosses("", len(free), cpu, after_cpu, memory, memory)
            assert crosses or after == pytest.approx(before)


def test_no_type_known_yet_means_whole_cards() -> None:
    assert Workload().fragmentation([1.0, 0.5]) == pytest.approx(0.5)


def test_tasks_with_no_gpu_weigh_nothing() -> None:
    w = Workload()
    w.observe(Shape(0, 0.0, cpu_milli=32000))
    w.observe(HALF)
    assert list(w.weights) == [HALF]


def test_a_learned_workload_is_reweighed_when_a_new_type_appears() -> None:
    w = Workload.of([(WHOLE, 1.0)])
    assert w.fragmentation([0.5]) == pytest.approx(0.5)
    w.observe(HALF)
    assert w.fragmentation([0.5]) == pytest.approx(0.25)


def test_shares_are_rounded_to_percent() -> None:
    assert shape_fraction(0.47, 0.47, False) == 0.47
    assert shape_fraction(0.001, 0.0, False) == 0.01
    assert shape_fraction(0.2, 0.1, True) == 1.0


# --- FGD's choices ----------------------------------------------------------------------


def node(name: str, cpu: str, memory: str = "256Gi") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "100"}},
    }


def cluster(nodes: dict[str, tuple[str, list[DeviceInfo]]]) -> Ledger:
    ledger = Ledger(SPECS)
    for name, (cpu, devices) in nodes.items():
        ledger.set_node(NodeName(name), devices)
        ledger.set_spec(node_spec(node(name, cpu)))
    return ledger


def put(pl: Placer, cpu: str, limits: dict[str, Any] | None = None, **kw: Any) -> Placement:
    """Place a one-container pod; ``annotations``, and any other keyword as a field of
    its spec (``affinity=...``)."""
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "annotations": kw.pop("annotations", {})},
        "spec": {
            **kw,
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": cpu}, "limits": limits or {}}}
            ],
        },
    }
    request = PARSER.parse(obj)
    assert isinstance(request, PodRequest), request
    result = pl.place(ref(), request, spec=pod_spec(obj, managed=MANAGED))
    assert isinstance(result, Placement), result
    return result


ONE_GPU = {"nvidia.com/gpu": 1}


def test_a_cpu_only_pod_goes_where_it_strands_fewest_gpus() -> None:
    # GPU tasks need 4 cores each. "idle" has two free cards and 8 cores; "dead" has no
    # usable card and 16 cores. 6 cores taken on "idle" would strand both its cards.
    workload = Workload.of([(Shape(1, 1.0, cpu_milli=4000), 1.0)])
    nodes = {"dead": ("16", gpus(1, healthy=False)), "idle": ("8", gpus(2))}
    assert put(Placer(cluster(nodes), FGD, workload), "6").node == "dead"
    assert put(Placer(cluster(nodes), None, workload), "6").node == "dead"  # the default
    # kube-scheduler's most-allocated score alone takes the node it fills most
    plain = PlacementConfig(fragmentation_guard=0)
    assert put(Placer(cluster(nodes), plain, workload), "6").node == "idle"


def test_the_default_guard_looks_past_a_first_fit_that_strands_gpus() -> None:
    # binpack's order starts at the tighter cards; there the pod's 3 cores would leave
    # 3 for a second card that every task type needs 4 cores to use
    workload = Workload.of([(Shape(1, 0.25, cpu_milli=4000), 1.0)])
    nodes = {"tight": ("6", gpus(2, memory=40960)), "roomy": ("64", gpus(2))}
    slice_ = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}
    plain = PlacementConfig(fragmentation_guard=0)
    assert put(Placer(cluster(nodes), plain, workload), "3", slice_).node == "tight"
    assert put(Placer(cluster(nodes), None, workload), "3", slice_).node == "roomy"
    # a pod that names its node policy gets HAMi's choice as it asked
    binpack = {"hami.io/node-scheduler-policy": "binpack"}
    pl = Placer(cluster(nodes), None, workload)
    assert put(pl, "3", slice_, annotations=binpack).node == "tight"


def test_a_cpu_only_pod_leaves_the_cores_a_node_s_idle_cards_need() -> None:
    # each GPU task needs 12 cores. "lean" has 2 idle cards and 30 cores, "rich" 4 and
    # 200. 8 cores taken on "lean" leave the cores for one task: a card stranded there,
    # though one task still fits (the paper's measure saw no change, and least free GPU
    # share left took "lean"); "rich" still holds a task for each of its cards
    workload = Workload.of([(Shape(1, 1.0, cpu_milli=12000), 1.0)])
    nodes = {"lean": ("30", gpus(2)), "rich": ("200", gpus(4))}
    assert put(Placer(cluster(nodes), FGD, workload), "8").node == "rich"
    assert put(Placer(cluster(nodes), None, workload), "8").node == "rich"  # the default


def test_a_gpu_pod_keeps_cpu_for_the_cards_it_leaves() -> None:
    # the same free cards everywhere; "lean" has just the cores for this pod, so the card
    # it leaves would be stranded: FGD takes "rich", whose remaining cores still serve it
    workload = Workload.of([(Shape(1, 1.0, cpu_milli=4000), 1.0)])
    pl = Placer(cluster({"lean": ("4", gpus(2)), "rich": ("16", gpus(2))}), FGD, workload)
    assert put(pl, "4", ONE_GPU).node == "rich"


def test_a_constrained_type_keeps_its_model_free() -> None:
    # a quarter of the work may use V100s only; an unconstrained whole-card pod goes to
    # the T4 node and leaves the V100 for it
    workload = Workload.of([(Shape(1, 1.0, use_types=("v100",)), 1.0), (WHOLE, 3.0)])
    ledger = cluster(
        {
            "v100": ("64", gpus(1, model="Tesla-V100-SXM2-16GB", memory=16384)),
            "t4": ("64", gpus(1, model="Tesla-T4", memory=16384)),
        }
    )
    pl = Placer(ledger, FGD, workload)
    assert put(pl, "1", ONE_GPU).node == "t4"


def test_the_default_window_reaches_the_larger_cards_too() -> None:
    # half the work may use T4s only. Twenty T4 nodes come first in binpack's order
    # (the tightest cards); a window from that end alone would give an unconstrained pod
    # a T4 and leave the A100 idle. The window also draws from the emptiest end.
    workload = Workload.of([(Shape(1, 1.0, use_types=("t4",)), 1.0), (WHOLE, 1.0)])
    nodes = {f"t4-{i:02}": ("64", gpus(1, model="Tesla-T4", memory=16384)) for i in range(20)}
    nodes["a100"] = ("64", gpus(1, model="A100-SXM4-40GB", memory=40960))
    assert put(Placer(cluster(nodes), None, workload), "1", ONE_GPU).node == "a100"
    binpack = PlacementConfig(fragmentation_guard=0)
    assert put(Placer(cluster(nodes), binpack, workload), "1", ONE_GPU).node.startswith("t4-")


def test_the_placer_learns_cpu_memory_and_gpu_types() -> None:
    pl = Placer(cluster({"n": ("64", gpus(2))}), FGD)
    put(pl, "3", ONE_GPU, annotations={"nvidia.com/use-gputype": "A100"})
    put(pl, "5")  # no GPU: not a type
    (shape,) = pl.workload.weights
    assert shape == Shape(1, 1.0, 3000, 0, ("a100",), ())


def test_a_pod_annotation_still_overrides_fgd() -> None:
    pl = Placer(cluster({"a": ("64", gpus(2)), "b": ("64", gpus(2))}), FGD)
    spread = {"hami.io/node-scheduler-policy": "spread"}
    nodes = {
        put(pl, "1", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, annotations=spread).node
        for _ in range(2)
    }
    assert nodes == {"a", "b"}


# --- the default guard: a window of nodes weighed by FGD ---------------------------------


def share(percent: int) -> dict[str, Any]:
    """A sharing request: ``percent`` of one card's memory and cores."""
    return {
        "nvidia.com/gpu": 1,
        "nvidia.com/gpumem-percentage": percent,
        "nvidia.com/gpucores": percent,
    }


def on(name: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": name}


def pinned(pl: Placer, cpu: str, limits: dict[str, Any], node_name: str) -> Placement:
    """A pod held to one node by its nodeSelector (to set a node's usage up)."""
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "nodeSelector": on(node_name),
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": cpu}, "limits": limits}}
            ],
        },
    }
    request = PARSER.parse(obj)
    assert isinstance(request, PodRequest), request
    result = pl.place(ref(), request, spec=pod_spec(obj, managed=MANAGED))
    assert isinstance(result, Placement), result
    return result


def test_the_default_puts_a_sharing_pod_on_the_card_it_completes() -> None:
    # half-card and whole-card tasks alike; a node with a half-used card and an idle one.
    # Spread (the default device policy) took the idle card, leaving two halves no
    # whole-card task can use; the guard weighs the devices too and fills the half card.
    workload = Workload.of([(HALF, 1.0), (WHOLE, 1.0)])
    pl = Placer(cluster({"n": ("64", gpus(2))}), None, workload)
    first = put(pl, "1", share(50)).grants[0].devices[0].uuid
    second = put(pl, "1", share(50)).grants[0].devices[0].uuid
    assert second == first
    # HAMi's choice with the guard off, and for a pod that names its device policy
    plain = Placer(cluster({"n": ("64", gpus(2))}), PlacementConfig(fragmentation_guard=0))
    a = put(plain, "1", share(50)).grants[0].devices[0].uuid
    assert put(plain, "1", share(50)).grants[0].devices[0].uuid != a
    spread = {"hami.io/gpu-scheduler-policy": "spread"}
    pl = Placer(cluster({"n": ("64", gpus(2))}), None, workload)
    a = put(pl, "1", share(50), annotations=spread).grants[0].devices[0].uuid
    assert put(pl, "1", share(50), annotations=spread).grants[0].devices[0].uuid != a


def test_the_default_weighs_past_the_tightest_card_when_it_leaves_a_useless_rest() -> None:
    # every task asks 40 % of a card. "tight" has half a card free, "roomy" 80 %:
    # binpack's first fit, "tight", would leave 10 % no task can use; on "roomy" the
    # 40 % left still serves one. Nothing here is about cpu or memory: the old guard
    # took the first fit.
    workload = Workload.of([(Shape(1, 0.4), 1.0)])
    nodes = {"tight": ("64", gpus(1)), "roomy": ("64", gpus(1))}
    pl = Placer(cluster(nodes), None, workload)
    pinned(pl, "1", share(50), "tight")
    pinned(pl, "1", share(20), "roomy")
    assert put(pl, "1", share(40)).node == "roomy"
    plain = Placer(cluster(nodes), PlacementConfig(fragmentation_guard=0), workload)
    pinned(plain, "1", share(50), "tight")
    pinned(plain, "1", share(20), "roomy")
    assert put(plain, "1", share(40)).node == "tight"


def test_the_guard_weighs_only_its_window() -> None:
    # the same choice with a window of one node is binpack's first fit
    workload = Workload.of([(Shape(1, 0.4), 1.0)])
    nodes = {"tight": ("64", gpus(1)), "roomy": ("64", gpus(1))}
    pl = Placer(cluster(nodes), PlacementConfig(fragmentation_guard=1), workload)
    pinned(pl, "1", share(50), "tight")
    pinned(pl, "1", share(20), "roomy")
    assert put(pl, "1", share(40)).node == "tight"


def test_the_first_pod_is_weighed_against_its_own_type_not_whole_cards_only() -> None:
    # A fresh allocator knows no task type yet. Weighed against whole cards alone, a
    # 20 GB / 30 % pod left no fragment on an idle A100-40GB in MIG mode (its smallest
    # instance of 20,000 MiB is the whole card, 7g.40gb) and took it, core limit lost.
    mig = gpus(1, model="NVIDIA-A100-SXM4-40GB", memory=40960, mode="mig")
    pl = Placer(cluster({"a100": ("64", gpus(1)), "mig": ("64", mig)}))
    placed = put(
        pl, "1", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}
    )
    assert placed.node == "a100"
    [grant] = placed.grants[0].devices
    assert (grant.memory_mib, grant.cores, grant.mig_profile) == (20000, 30, None)


def test_a_mig_instance_larger_than_asked_counts_what_it_wastes() -> None:
    from shared.core.plugins.fgd import _over_granted

    mig = gpus(1, model="NVIDIA-A100-SXM4-40GB", memory=40960, mode="mig")
    pl = Placer(cluster({"mig": ("64", mig), "a100": ("64", gpus(1))}))
    asked = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}
    whole = pinned(pl, "1", asked, "mig")
    assert whole.grants[0].devices[0].mig_profile == "7g.40gb"
    request = PARSER.parse(
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": asked}}]},
        }
    )
    assert isinstance(request, PodRequest)
    node = pl.ledger.nodes[NodeName("mig")]
    assert _over_granted(node, request, whole.grants) == pytest.approx(40192 / 40960 - 0.49)
    sliced = pinned(pl, "1", asked, "a100")
    assert _over_granted(pl.ledger.nodes[NodeName("a100")], request, sliced.grants) == 0.0


def test_the_guards_kept_results_change_no_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The placer keeps a node's FGD result for pods whose cpu and memory leave the node
    holding as many tasks of each type (``_host_after``), not only for the same figures.
    Over 400 pods of mixed cpu, memory and shares on 24 nodes of two cpu sizes, every
    choice (node and cards) is the one made with nothing kept, or kept by the exact
    figures; and fewer nodes are weighed than with either."""
    from shared.core.plugins import fgd

    def run(keep: str) -> tuple[list[tuple[str, tuple[int, ...]]], int]:
        rng = random.Random(7)
        nodes = {f"n{i:02d}": ("96" if i % 3 else "32", gpus(8)) for i in range(24)}
        pl = Placer(cluster(nodes), PlacementConfig(fragmentation_guard=16))
        weighed = 0
        real = pl.fgd.delta

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal weighed
            weighed += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(pl.fgd, "delta", counted)
        if keep == "nothing":
            monkeypatch.setattr(fgd, "MEMO_LIMIT", 0)  # cleared at every pod
        elif keep == "by the exact figures":
            monkeypatch.setattr(fgd, "_host_after", lambda _t, _n, c, m: (c, m))
        chosen = []
        for _ in range(400):
            limits = {
                "nvidia.com/gpu": 1,
                "nvidia.com/gpumem-percentage": rng.choice((10, 20, 25, 50)),
                "nvidia.com/gpucores": rng.choice((10, 25, 50)),
            }
            placed = put(pl, rng.choice(("250m", "500m", "1", "2", "3", "6")), limits)
            cards = tuple(d.index for c in placed.grants for d in c.devices)
            chosen.append((placed.node, cards))
        monkeypatch.undo()
        return chosen, weighed

    kept, weighed_kept = run("by tasks held")
    exact, weighed_exact = run("by the exact figures")
    fresh, weighed_fresh = run("nothing")
    assert kept == exact == fresh
    assert weighed_kept < weighed_exact < weighed_fresh


# --- the guard's window on a cluster of several node kinds -------------------------------

T4 = {"model": "Tesla-T4", "memory": 16384}
V100 = {"model": "Tesla-V100-SXM2-32GB", "memory": 32768}
A100 = {"model": "A100-SXM4-80GB", "memory": 81920}


def kinds_cluster(t4: int, a100: int) -> Ledger:
    """``t4`` one-card T4 nodes (the tightest cards: first in binpack's order), ``a100``
    one-card A100 nodes (the roomiest: first from the other end) and one V100 node
    between them in both orders."""
    nodes = {f"t4-{i:02}": ("64", gpus(1, **T4)) for i in range(t4)}
    nodes |= {f"a100-{i:02}": ("64", gpus(1, **A100)) for i in range(a100)}
    nodes["v100"] = ("64", gpus(1, **V100))
    return cluster(nodes)


def test_the_pool_counts_its_nodes_by_kind() -> None:
    ledger = kinds_cluster(3, 2)
    [index] = ledger.pools.values()
    t4, v100, a100 = "tesla-t4", "tesla-v100-sxm2-32gb", "a100-sxm4-80gb"
    assert index.kinds == {(t4, 1): 3, (a100, 1): 2, (v100, 1): 1}
    ledger.set_node(NodeName("t4-00"), gpus(2, **T4))  # a new inventory: another kind
    assert index.kinds == {(t4, 1): 2, (t4, 2): 1, (a100, 1): 2, (v100, 1): 1}
    ledger.remove_node(NodeName("v100"))
    assert index.kinds == {(t4, 1): 2, (t4, 2): 1, (a100, 1): 2}


def test_the_window_is_not_filled_by_one_kind_of_node() -> None:
    # A third of the work may use T4s only, a third A100s only: the V100 is the card an
    # unconstrained pod takes from nobody (FGD's measure). Both ends of binpack's order
    # start with six nodes of one kind, and the window of 4 held only those, which the
    # pod would have taken from the typed work. One kind now fills a quarter of the
    # window; the next nodes of a kind already there are passed, unfitted.
    t4_only, a100_only = Shape(1, 1.0, use_types=("t4",)), Shape(1, 1.0, use_types=("a100",))
    workload = Workload.of([(t4_only, 1.0), (a100_only, 1.0), (WHOLE, 1.0)])
    guard = PlacementConfig(fragmentation_guard=4)
    assert put(Placer(kinds_cluster(6, 6), guard, workload), "1", ONE_GPU).node == "v100"
    assert put(Placer(kinds_cluster(6, 6), FGD, workload), "1", ONE_GPU).node == "v100"
    # the walk passes at most 4 x the window (16) nodes: farther away, the window is
    # filled as before, from both ends
    far = put(Placer(kinds_cluster(12, 12), guard, workload), "1", ONE_GPU).node
    assert far != "v100"


def test_on_a_cluster_of_one_kind_the_window_passes_no_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = {f"n{i:02}": ("64", gpus(2)) for i in range(8)}
    pl = Placer(cluster(nodes), PlacementConfig(fragmentation_guard=4))
    asked: list[int] = []
    real = pl.fgd.best

    def best(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("per_kind", 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(pl.fgd, "best", best)
    put(pl, "1", ONE_GPU)
    assert asked == [0]
    pl = Placer(kinds_cluster(2, 2), PlacementConfig(fragmentation_guard=4))
    monkeypatch.setattr(pl.fgd, "best", best)
    put(pl, "1", ONE_GPU)
    assert asked == [0, 1]
