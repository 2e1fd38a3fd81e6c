"""Placement on the pure core: upstream behaviours (docs/compat.md), MIG, vNPU, gangs."""

from __future__ import annotations

from typing import Any

import pytest

from shared.config import parse as parse_config
from shared.core.ledger import PodGrant
from shared.core.model import DeviceGrant, MigInstance, NodeName
from shared.core.placement import Failure, GangMember, Placement, PlacementConfig, Placer
from shared.core.plugins.ascend_cores import MINDCLUSTER_TABLE
from shared.core.spec import FilterDevices, NodeOverride
from tests.unit import corekit
from tests.unit.corekit import gpu, gpus, ledger, npu, place, placer, ref, request


def devices_of(p: Placement) -> list[DeviceGrant]:
    return [g for c in p.grants for g in c.devices]


def fail(pl: Placer, limits: dict[str, Any], group: str | None = None, **kw: Any) -> Failure:
    result = pl.place(ref(), request(limits, **kw), corekit.group(group) if group else None)
    assert isinstance(result, Failure), result
    return result


MIB = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}


# --- device and node policies (HAMi score) ----------------------------------------------


def test_device_spread_takes_the_emptiest_card_and_binpack_the_fullest() -> None:
    pl = placer({"n": gpus(3)})
    first = devices_of(place(pl, MIB))[0].index
    second = devices_of(place(pl, MIB))[0].index
    assert first != second  # spread (default device policy)
    packed = devices_of(place(pl, MIB, annotations={"hami.io/gpu-scheduler-policy": "binpack"}))[
        0
    ].index
    assert packed in (first, second)


def test_node_binpack_fills_one_node_and_spread_alternates() -> None:
    pl = placer({"a": gpus(2), "b": gpus(2)})
    nodes = {place(pl, MIB).node for _ in range(4)}
    assert len(nodes) == 1
    pl = placer({"a": gpus(2), "b": gpus(2)}, PlacementConfig(node_policy="spread"))
    assert {place(pl, MIB).node for _ in range(2)} == {"a", "b"}
    pl = placer({"a": gpus(2), "b": gpus(2)})
    spread = {
        place(pl, MIB, annotations={"hami.io/node-scheduler-policy": "spread"}).node
        for _ in range(2)
    }
    assert spread == {"a", "b"}


def test_binpack_prefers_the_node_whose_card_fits_tightest() -> None:
    pl = placer({"roomy": gpus(1), "tight": gpus(1)})
    place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 70000}, name="filler")
    assert pl.ledger.pods[ref("filler").uid].node in ("roomy", "tight")
    busy = pl.ledger.pods[ref("filler").uid].node
    assert place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5000}).node == busy


# --- sliced devices ---------------------------------------------------------------------


def test_memory_and_cores_apply_to_each_of_count_devices() -> None:
    pl = placer({"n": gpus(4)})
    p = place(pl, {"nvidia.com/gpu": 3, "nvidia.com/gpumem": 5000, "nvidia.com/gpucores": 20})
    grants = devices_of(p)
    assert len({g.uuid for g in grants}) == 3
    assert {(g.memory_mib, g.cores) for g in grants} == {(5000, 20)}


def test_percentage_resolves_against_each_card() -> None:
    pl = placer({"n": [gpu(0, memory=40960)]})
    assert (
        devices_of(place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}))[
            0
        ].memory_mib
        == 10240
    )


def test_exclusive_takes_only_an_idle_card_and_keeps_it() -> None:
    pl = placer({"n": gpus(2)})
    place(pl, MIB)
    whole = devices_of(place(pl, {"nvidia.com/gpu": 1}))[0]
    assert whole.exclusive
    assert "no idle device for an exclusive request" in fail(pl, {"nvidia.com/gpu": 1}).message
    # nothing else fits on the exclusive card, even with cores 0
    for _ in range(9):
        g = devices_of(place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}))[0]
        assert g.uuid != whole.uuid


def test_a_cores_0_request_may_not_land_on_a_card_whose_cores_are_used_up() -> None:
    pl = placer({"n": gpus(1)})
    place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 60})
    place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 40})
    failure = fail(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    assert "insufficient nvidia.com/gpucores" in failure.message
    assert not failure.unresolvable


def test_split_count_limits_tasks_per_card() -> None:
    pl = placer({"n": gpus(1)}, overrides={"n": NodeOverride(name="n", device_split_count=2)})
    place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100})
    place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100})
    assert (
        "device split count reached"
        in fail(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}).message
    )


def test_memory_scaling_overcommits_and_core_scaling_adds_cores() -> None:
    over = NodeOverride(name="n", device_memory_scaling=2.0, device_core_scaling=2.0)
    pl = placer({"n": gpus(1)}, overrides={"n": over})
    for _ in range(2):
        place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 60000, "nvidia.com/gpucores": 100 - 1})
    fail(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 60000})


def test_filtered_devices_are_never_offered() -> None:
    devs = gpus(3)
    over = NodeOverride(name="n", filter_devices=FilterDevices(uuid=[devs[0].uuid], index=[1]))
    pl = placer({"n": devs}, overrides={"n": over})
    assert devices_of(place(pl, {"nvidia.com/gpu": 1}))[0].index == 2
    assert fail(pl, {"nvidia.com/gpu": 1}).message == (
        "0/1 nodes are available: 1 no idle device for an exclusive request."
    )


@pytest.mark.parametrize(
    ("annotations", "expected_index"),
    [
        ({"nvidia.com/use-gputype": "h100"}, 1),
        ({"nvidia.com/nouse-gputype": "A100"}, 1),
        ({"nvidia.com/use-gpuuuid": "GPU-B"}, 1),
        ({"volcano.sh/vgpu-nouse-gpuuuid": "GPU-A"}, 1),
        ({"volcano.sh/gpu-index": "1"}, 1),
    ],
)
def test_type_uuid_and_index_filters(annotations: dict[str, str], expected_index: int) -> None:
    pl = placer({"n": [gpu(0, uuid="GPU-A"), gpu(1, uuid="GPU-B", model="NVIDIA-H100-80GB-HBM3")]})
    assert devices_of(place(pl, MIB, annotations=annotations))[0].index == expected_index


def test_excluded_everywhere_is_unresolvable_with_counted_reasons() -> None:
    pl = placer({f"n{i}": gpus(2) for i in range(3)} | {"npu": [npu()]})
    failure = fail(pl, MIB, annotations={"nvidia.com/use-gputype": "V100"})
    assert failure.message.startswith(
        "0/4 nodes are available: 1 no nvidia devices in mode hami-core/mps, 3 gpu type excluded."
    )
    assert failure.unresolvable
    [excluded] = [r for r in failure.status.reasons if r.kind == "type-excluded"]
    assert excluded.nodes == 3


def test_unhealthy_and_cordoned_devices_get_no_new_work() -> None:
    pl = placer({"n": [gpu(0, healthy=False), gpu(1)]})
    assert devices_of(place(pl, MIB))[0].index == 1
    pl.ledger.set_cordoned(NodeName("n"), [pl.ledger.nodes[NodeName("n")].devices[1].uuid])
    failure = fail(pl, MIB)
    assert "unhealthy or cordoned" in failure.message
    assert not failure.unresolvable  # health comes back


def test_more_devices_than_cards_is_refused_unless_opted_in() -> None:
    limits = {"nvidia.com/gpu": 3, "nvidia.com/gpumem": 10000}
    failure = fail(placer({"n": gpus(2)}), limits)
    assert "3 devices asked, 2 eligible" in failure.message
    assert "allowMoreDevicesThanCards" in failure.message
    assert failure.unresolvable
    pl = placer({"n": gpus(2)}, PlacementConfig(allow_more_devices_than_cards=True))
    grants = devices_of(place(pl, limits))
    assert len(grants) == 3
    assert len({g.uuid for g in grants}) == 2


def test_numa_bind_keeps_a_container_on_one_numa_node() -> None:
    devs = [gpu(i, numa=i // 2) for i in range(4)]
    pl = placer({"n": devs})
    place(
        pl,
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 80000},
        annotations={"volcano.sh/gpu-index": "0"},
    )
    p = place(
        pl,
        {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000},
        annotations={"nvidia.com/numa-bind": "true"},
    )
    assert {g.index for g in devices_of(p)} == {2, 3}
    assert (
        "NUMA"
        in fail(
            pl,
            {"nvidia.com/gpu": 3, "nvidia.com/gpumem": 1000},
            annotations={"nvidia.com/numa-bind": "true"},
        ).message
    )


def test_podgroup_spread_puts_members_on_different_cards() -> None:
    pl = placer({"n": gpus(2)})
    spread = {
        "volcano.sh/vgpu-podgroup-policy": "spread",
        "hami.io/gpu-scheduler-policy": "binpack",
    }
    a = devices_of(place(pl, MIB, group="g1", annotations=spread))[0]
    b = devices_of(place(pl, MIB, group="g1", annotations=spread))[0]
    assert a.uuid != b.uuid
    failure = fail(pl, MIB, group="g1", annotations=spread)
    assert "card already used by the PodGroup" in failure.message
    assert not failure.unresolvable
    place(pl, MIB, group="g2", annotations=spread)  # another group may share


def test_modes_route_to_matching_nodes_only() -> None:
    pl = placer(
        {
            "soft": gpus(1),
            "mps": gpus(1, mode="mps"),
            "mig": gpus(1, model="NVIDIA-A100-SXM4-40GB", memory=40960, mode="mig"),
        }
    )
    for mode in ("hami-core", "mps", "mig"):
        node = place(
            pl,
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000},
            annotations={"nvidia.com/vgpu-mode": mode},
            run_as=7,
        ).node
        assert node == {"hami-core": "soft", "mps": "mps", "mig": "mig"}[mode]


def test_gpu_share_and_gpu_number_share_the_same_cards() -> None:
    pl = placer({"n": gpus(2)})
    share = devices_of(place(pl, {"volcano.sh/gpu-memory": 40000}))[0]
    assert (share.memory_mib, share.cores, share.exclusive) == (40000, 0, False)
    whole = devices_of(place(pl, {"volcano.sh/gpu-number": 1}))[0]
    assert whole.exclusive
    assert whole.uuid != share.uuid
    assert "no idle device" in fail(pl, {"volcano.sh/gpu-number": 1}).message


@pytest.mark.parametrize(
    ("vendor", "limits", "mib"),
    [
        # each vendor's memory unit (HAMi pkg/device/<vendor>/device.go)
        ("cambricon", {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 4}, 1024),
        ("hygon", {"hygon.com/dcunum": 1, "hygon.com/dcumem": 1000}, 1000),
        ("metax", {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 1}, 1024),
        ("mthreads", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 2}, 1024),
        ("enflame", {"enflame.com/gcu-memory": 1000}, 1000),
        ("kunlunxin", {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 1000}, 24576),
        ("iluvatar", {"iluvatar.ai/BI-V100-vgpu": 1, "iluvatar.ai/BI-V100.vMem": 4}, 1024),
        ("amd", {"amd.com/gpu": 1, "amd.com/gpumem": 1000}, 1000),
    ],
)
def test_other_vendors_slice_their_own_devices(
    vendor: str, limits: dict[str, int], mib: int
) -> None:
    pl = placer(
        {
            "nv": gpus(1),
            "x": [
                gpu(
                    0,
                    vendor=vendor,
                    model=f"{vendor}-BI-V100-card",  # type: ignore[arg-type]
                    memory=98304,
                )
            ],
        }
    )
    p = place(pl, limits)
    assert (p.node, devices_of(p)[0].vendor, devices_of(p)[0].memory_mib) == ("x", vendor, mib)


def test_neuron_cores_are_counted_not_percent() -> None:
    pl = placer({"inf": [gpu(0, vendor="awsneuron", model="inferentia2", memory=32768, cores=2)]})
    place(pl, {"aws.amazon.com/neuroncore": 1})
    place(pl, {"aws.amazon.com/neuroncore": 1})
    assert (
        "insufficient aws.amazon.com/neuroncore"
        in fail(pl, {"aws.amazon.com/neuroncore": 1}).message
    )
    pl = placer({"inf": [gpu(0, vendor="awsneuron", model="inferentia2", memory=32768, cores=2)]})
    assert devices_of(place(pl, {"aws.amazon.com/neuron": 1}))[0].exclusive


def test_memory_larger_than_every_card_is_found_by_check() -> None:
    pl = placer({"n": gpus(1, memory=40960)})
    checked = pl.check(request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 50000}))
    [error] = checked.reasons
    assert checked.unresolvable
    assert "larger than any nvidia card" in error.text()
    assert (error.requested, error.capacity) == (50000, 40960)
    assert pl.check(request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000})).ok
    assert fail(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 50000}).unresolvable


# --- MIG --------------------------------------------------------------------------------

A100_40 = {"model": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "mode": "mig"}


@pytest.mark.parametrize(
    ("memory", "profile", "geometry"),
    [
        (3000, "1g.5gb", "1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb"),
        (9000, "2g.10gb", "2g.10gb,2g.10gb,2g.10gb,1g.5gb"),
        (15000, "3g.20gb", "3g.20gb,3g.20gb"),
        (30000, "7g.40gb", "7g.40gb"),
    ],
)
def test_mig_idle_card_gets_the_geometry_with_the_smallest_fitting_instance(
    memory: int, profile: str, geometry: str
) -> None:
    pl = placer({"n": gpus(1, **A100_40)})
    g = devices_of(place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory}))[0]
    assert (g.mig_profile, g.mig_geometry) == (profile, geometry)


def test_mig_card_keeps_its_geometry_while_used() -> None:
    pl = placer({"n": gpus(1, **A100_40)})
    place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000})
    for placement in range(1, 7):
        g = devices_of(place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}))[0]
        assert (g.mig_profile, g.mig_placement) == ("1g.5gb", placement)
    failure = fail(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000})
    assert not failure.unresolvable
    # a request only another geometry could serve waits for the card to empty
    assert not fail(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 15000}).unresolvable


def test_mig_prefers_the_geometry_the_card_already_runs() -> None:
    running = tuple(MigInstance(profile="3g.20gb", memory_mib=19968, placement=i) for i in range(2))
    pl = placer({"n": [gpu(0, mig=running, **A100_40)]})
    g = devices_of(place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 15000}))[0]
    assert g.mig_geometry == "3g.20gb,3g.20gb"


def test_mig_request_larger_than_any_instance_is_unresolvable() -> None:
    failure = fail(
        placer({"n": gpus(1, **A100_40)}),
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40500},
        annotations={"nvidia.com/vgpu-mode": "mig"},
    )
    assert "no MIG instance large enough" in failure.message
    assert failure.unresolvable


def test_mig_whole_card_request_takes_the_largest_instance_and_several_from_one_card() -> None:
    pl = placer({"n": gpus(1, **A100_40)})
    assert (
        devices_of(place(pl, {"nvidia.com/gpu": 1}, annotations={"nvidia.com/vgpu-mode": "mig"}))[
            0
        ].mig_profile
        == "7g.40gb"
    )
    pl = placer({"n": gpus(1, **A100_40)})
    grants = devices_of(
        place(
            pl,
            {"nvidia.com/gpu": 3, "nvidia.com/gpumem": 4000},
            annotations={"nvidia.com/vgpu-mode": "mig"},
        )
    )
    assert [g.mig_placement for g in grants] == [0, 1, 2]


def test_mig_h100_profiles() -> None:
    pl = placer({"n": gpus(1, model="NVIDIA-H100-80GB-HBM3", memory=81559, mode="mig")})
    assert (
        devices_of(place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 12000}))[0].mig_profile
        == "1g.20gb"
    )


# --- Ascend templates (HAMi mode) ------------------------------------------------------

TEMPLATE_ROWS = [
    ("910B3", 65536, 10000, "vir05_1c_16g"),
    ("910B3", 65536, 20000, "vir10_3c_32g"),
    ("910B3", 65536, 40000, None),
    ("910B2", 65536, 8000, "vir03_1c_8g"),
    ("910B2", 65536, 16384, "vir06_1c_16g"),
    ("910B2", 65536, 30000, "vir12_3c_32g"),
    ("910B4", 32768, 5000, "vir05_1c_8g"),
    ("910B4", 32768, 12000, "vir10_3c_16g"),
    ("910B4", 32768, 20000, None),
    ("910A", 32768, 2000, "vir02"),
    ("910A", 32768, 3000, "vir04"),
    ("910A", 32768, 8000, "vir08"),
    ("910A", 32768, 17000, "vir16"),
    ("310P3", 21527, 3000, "vir01"),
    ("310P3", 21527, 5000, "vir02"),
    ("310P3", 21527, 12288, "vir04"),
    ("310P3", 21527, 15000, None),
    ("910C", 65536, 16384, "vir05_1c_16g"),
    ("910B4-1", 65536, 32768, "vir10_3c_32g"),
]


@pytest.mark.parametrize(("chip", "card", "memory", "template"), TEMPLATE_ROWS)
def test_ascend_memory_rounds_up_to_the_smallest_template_else_the_whole_card(
    chip: str, card: int, memory: int, template: str | None
) -> None:
    word = "Ascend310P" if chip == "310P3" else f"Ascend{chip}"
    pl = placer({"n": [npu(0, chip, card)]})
    g = devices_of(place(pl, {f"huawei.com/{word}": 1, f"huawei.com/{word}-memory": memory}))[0]
    assert g.vnpu_template == template
    assert g.exclusive == (template is None)


def test_ascend_templates_share_a_card_until_ai_cores_run_out() -> None:
    pl = placer({"n": [npu()]})
    limits = {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 10000}
    for _ in range(4):  # 4 x 16 GiB on 64 GiB, 4 x 5 of 20 AI cores
        place(pl, limits)
    failure = fail(pl, limits)
    assert "no free vir05_1c_16g vNPU template" in failure.message


def test_ascend_whole_cards_for_multi_card_requests() -> None:
    pl = placer({"n": [npu(0), npu(1), npu(2)]})
    grants = devices_of(place(pl, {"huawei.com/Ascend910B3": 2}))
    assert len(grants) == 2
    assert all(g.exclusive for g in grants)
    assert "4 NPUs asked, 3 on the node" in fail(pl, {"huawei.com/Ascend910B3": 4}).message


def test_ascend_hami_core_mode_slices_like_a_gpu_on_hami_core_nodes() -> None:
    over = {"soft": NodeOverride(name="soft", operating_mode="hami-core")}
    pl = placer({"hard": [npu()], "soft": [npu()]}, overrides=over)
    p = place(
        pl,
        {
            "huawei.com/Ascend910B3": 1,
            "huawei.com/Ascend910B3-memory": 1000,
            "huawei.com/Ascend910B3-core": 10,
        },
        annotations={"huawei.com/vnpu-mode": "hami-core"},
    )
    assert p.node == "soft"
    assert (devices_of(p)[0].memory_mib, devices_of(p)[0].cores) == (1000, 10)


# --- MindCluster -------------------------------------------------------------------------

MINDCLUSTER_ROWS = [
    (1, None, None, "vir01"),
    (2, None, "low", "vir02_1c"),
    (2, None, "high", "vir02"),
    (4, "yes", None, "vir04_4c_dvpp"),
    (4, "no", None, "vir04_3c_ndvpp"),
    (4, "null", "low", "vir04_3c"),
    (4, None, "high", "vir04"),
]


@pytest.mark.parametrize(("cores", "dvpp", "level", "template"), MINDCLUSTER_ROWS)
def test_mindcluster_templates(
    cores: int, dvpp: str | None, level: str | None, template: str
) -> None:
    labels = {k: v for k, v in (("vnpu-dvpp", dvpp), ("vnpu-level", level)) if v}
    pl = placer({"p": [npu(0, "310P3", 21527)]})
    g = devices_of(place(pl, {"huawei.com/npu-core": cores}, labels=labels))[0]
    assert g.vnpu_template == template


def test_mindcluster_high_level_degrades_when_ai_cpus_are_scarce() -> None:
    pl = placer({"p": [npu(0, "310P3", 21527)]})
    high = {"vnpu-level": "high"}
    assert (
        devices_of(place(pl, {"huawei.com/npu-core": 4}, labels=high))[0].vnpu_template == "vir04"
    )
    # 4 of 7 AI CPUs left 3: the next high 4-core request degrades to vir04_3c
    assert devices_of(place(pl, {"huawei.com/npu-core": 4}, labels=high))[0].vnpu_template == (
        "vir04_3c"
    )


def test_mindcluster_unknown_dvpp_combination_is_unschedulable_with_the_reason() -> None:
    failure = fail(
        placer({"p": [npu(0, "310P3", 21527)]}),
        {"huawei.com/npu-core": 1},
        labels={"vnpu-dvpp": "yes"},
    )
    assert "no vNPU template for 1 AI cores with vnpu-dvpp=yes" in failure.message
    assert failure.unresolvable


def test_mindcluster_whole_cards_in_multiples_of_8() -> None:
    pl = placer({"p": [npu(i, "310P3", 21527) for i in range(2)]})
    grants = devices_of(place(pl, {"huawei.com/npu-core": 16}))
    assert len(grants) == 2
    assert all(g.exclusive for g in grants)


def test_mindcluster_table_covers_every_documented_row() -> None:
    assert {k[0] for k in MINDCLUSTER_TABLE} == {1, 2, 4}


# --- gangs ------------------------------------------------------------------------------


def member(limits: dict[str, Any], group: str = "job") -> GangMember:
    return GangMember(pod=ref(), request=request(limits), group=corekit.group(group))


def test_gang_is_all_or_nothing_and_a_failed_gang_changes_nothing() -> None:
    pl = placer({"a": gpus(2), "b": gpus(1)})
    before = pl.ledger.snapshot()
    whole = {"nvidia.com/gpu": 1}
    result = pl.place_gang([member(whole) for _ in range(4)], min_member=4)
    assert not result.ok
    assert result.placed == []
    assert result.message.startswith("4/4 tasks in gang unschedulable: 0/2 nodes are available")
    assert pl.ledger.snapshot() == before
    ok = pl.place_gang([member(whole) for _ in range(3)], min_member=3)
    assert ok.ok
    assert len(ok.placed) == 3


def test_gang_extras_beyond_min_member_are_placed_if_they_fit() -> None:
    pl = placer({"a": gpus(2)})
    result = pl.place_gang([member({"nvidia.com/gpu": 1}) for _ in range(3)], min_member=2)
    assert result.ok
    assert len(result.placed) == 2
    assert len(result.failures) == 1


# --- ledger -------------------------------------------------------------------------------


def test_grant_and_release_are_idempotent_and_exact() -> None:
    pl = placer({"n": gpus(2)})
    before = pl.ledger.snapshot()
    p = place(pl, MIB, name="x")
    grant = pl.ledger.pods[p.pod.uid]
    assert pl.ledger.grant(grant) is False
    assert pl.release(p.pod) is True
    assert pl.release(p.pod) is False
    assert pl.ledger.snapshot() == before


def test_grants_wait_for_their_node_and_survive_inventory_replacement() -> None:
    devs = gpus(2)
    led = ledger({})
    grant = PodGrant(
        pod=ref("early"), node=NodeName("n"), containers=place(placer({"n": devs}), MIB).grants
    )
    led.grant(grant)
    led.set_node(NodeName("n"), devs)
    used = sum(d.used_mem for d in led.nodes[NodeName("n")].devices)
    assert used == 10000
    led.set_node(NodeName("n"), devs)  # a heartbeat with the same inventory
    assert sum(d.used_mem for d in led.nodes[NodeName("n")].devices) == 10000
    assert led.remove_node(NodeName("n")) == [grant.pod.uid]


def test_config_overrides_reach_the_ledger() -> None:
    cfg = parse_config(
        {
            "devices": {"nvidia": {"deviceSplitCount": 3}},
            "nodeConfigs": [{"name": "m", "operatingMode": "mig"}],
        }
    )
    led = ledger(
        {"n": gpus(1), "m": gpus(1, model="NVIDIA-A100-SXM4-40GB", memory=40960)},
        overrides={o.name: o for o in cfg.node_configs},
        specs=cfg.devices,
    )
    assert led.nodes[NodeName("n")].devices[0].slots == 3
    assert led.nodes[NodeName("m")].devices[0].mode == "mig"


def test_memory_larger_than_the_card_clamps_when_configured() -> None:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100000}
    strict = placer({"n": gpus(1, memory=40960)})
    assert strict.check(request(limits)).unresolvable
    clamp = placer({"n": gpus(1, memory=40960)}, PlacementConfig(memory_larger_than_card="clamp"))
    assert clamp.check(request(limits)).ok
    assert devices_of(place(clamp, limits))[0].memory_mib == 40960


# --- fragmentation gradient descent ------------------------------------------------------


def test_fgd_keeps_whole_cards_whole_where_spread_breaks_them() -> None:
    from shared.core.policy import Shape, Workload

    # the workload mostly wants whole cards; a half-card task arrives
    workload = Workload.of([(Shape(1, 1.0), 8.0), (Shape(1, 0.5), 2.0)])
    half = {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 50}
    for policy, expect_shared in (("fgd", True), ("spread", False)):
        pl = Placer(
            ledger({"n": gpus(2)}),
            PlacementConfig(node_policy=policy, device_policy=policy),
            workload,
        )
        first = devices_of(place(pl, half))[0].uuid
        second = devices_of(place(pl, half))[0].uuid
        assert (first == second) is expect_shared, policy


def test_fgd_at_node_level_picks_the_node_it_fragments_least() -> None:
    from shared.core.policy import Shape, Workload

    workload = Workload.of([(Shape(1, 1.0), 1.0)])
    pl = Placer(
        ledger({"empty": gpus(2), "partial": gpus(2)}),
        PlacementConfig(node_policy="fgd", device_policy="fgd"),
        workload,
    )
    place(
        pl,
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 50},
        annotations={"volcano.sh/gpu-index": "0"},
    )
    busy = next(iter(pl.ledger.pods.values())).node
    p = place(
        pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 50}
    )
    assert p.node == busy  # completes the broken card instead of breaking a new one


def test_gpu_types_match_with_spaces_or_dashes() -> None:
    pl = placer(
        {
            "v100": [gpu(0, model="Tesla-V100-PCIE-32GB", memory=32768)],
            "t4": [gpu(0, model="Tesla T4")],
        }
    )
    nvml = place(pl, MIB, annotations={"nvidia.com/use-gputype": "Tesla V100-PCIE-32GB"})
    assert nvml.node == "v100"
    dashes = place(pl, MIB, annotations={"nvidia.com/use-gputype": "tesla-t4"})
    assert dashes.node == "t4"


# --- init containers: max(init, app), as the kubelet's device manager hands them on ---


def _used(pl: Placer) -> list[int]:
    return [d.used_mem for d in pl.ledger.nodes[NodeName("n")].devices]


def _container(name: str, limits: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits}, **extra}


def test_an_init_containers_slice_reuses_the_app_containers_card() -> None:
    pl = placer({"n": gpus(2)})
    p = place(
        pl,
        {},
        containers=[_container("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000})],
        init=[_container("fetch", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000})],
    )
    [init, main] = p.grants
    assert init.init
    assert init.reuses
    assert not main.reuses
    assert init.devices[0].uuid == main.devices[0].uuid
    assert sorted(_used(pl)) == [0, 40000]  # max(init, app), not their sum
    pl.ledger.release(p.pod.uid)
    assert _used(pl) == [0, 0]


def test_an_init_container_larger_than_the_app_is_booked_beside_it() -> None:
    """It cannot run inside what the app holds: it gets (and keeps) its own share."""
    pl = placer({"n": gpus(2)})
    p = place(
        pl,
        {},
        containers=[_container("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000})],
        init=[_container("fetch", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 60000})],
    )
    assert not any(g.reuses for g in p.grants)
    assert sum(_used(pl)) == 80000


def test_a_sidecar_runs_beside_the_app_so_its_slice_adds_to_theirs() -> None:
    pl = placer({"n": gpus(1)})
    p = place(
        pl,
        {},
        containers=[_container("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000})],
        init=[
            _container(
                "proxy", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}, restartPolicy="Always"
            )
        ],
    )
    assert not any(g.reuses for g in p.grants)
    assert _used(pl) == [50000]


def test_a_card_too_small_for_init_plus_app_still_takes_the_pod() -> None:
    """Booked as their sum, 70 GiB would not fit a 48 GiB card; booked as the kubelet
    runs them (one after the other), the pod fits."""
    pl = placer({"n": gpus(1, memory=49152)})
    p = place(
        pl,
        {},
        containers=[_container("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000})],
        init=[_container("fetch", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000})],
    )
    assert p.grants[0].reuses
    assert _used(pl) == [40000]
