"""Properties of the ledger and placement over random clusters and request streams.

- no device is ever over its memory, cores (after scaling), split count, AI cores/CPUs,
  and MIG instances never collide;
- releasing a placement restores the exact prior state;
- a failed gang leaves the ledger unchanged;
- rebuilding from the grants equals the incrementally maintained ledger.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.ledger import Ledger
from shared.core.model import DeviceInfo, NodeName, PodRequest
from shared.core.placement import GangMember, Placement, PlacementConfig, Placer
from shared.core.spec import NodeOverride
from tests.unit.corekit import PARSER, SPECS, gpu, group, npu, pod_json, ref

DEVICE_KINDS = ["a100-80", "a100-40", "t4", "mig-a100-40", "mps", "910B3", "310P3"]


def make_device(kind: str, index: int) -> DeviceInfo:
    if kind == "a100-80":
        return gpu(index, numa=index % 2)
    if kind == "a100-40":
        return gpu(index, model="NVIDIA-A100-SXM4-40GB", memory=40960)
    if kind == "t4":
        return gpu(index, model="Tesla-T4", memory=15360)
    if kind == "mig-a100-40":
        return gpu(index, model="NVIDIA-A100-SXM4-40GB", memory=40960, mode="mig")
    if kind == "mps":
        return gpu(index, mode="mps", memory=24576)
    if kind == "910B3":
        return npu(index)
    return npu(index, "310P3", 21527)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, list[DeviceInfo]], dict[str, NodeOverride]]:
    nodes: dict[str, list[DeviceInfo]] = {}
    overrides: dict[str, NodeOverride] = {}
    for n in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(DEVICE_KINDS))
        count = draw(st.integers(1, 4))
        name = f"node-{n}"
        nodes[name] = [make_device(kind, i) for i in range(count)]
        if draw(st.booleans()):
            overrides[name] = NodeOverride(
                name=name,
                device_split_count=draw(st.integers(1, 6)),
                device_memory_scaling=draw(st.sampled_from([1.0, 1.5, 2.0])),
                device_core_scaling=draw(st.sampled_from([1.0, 2.0])),
            )
    return nodes, overrides


LIMITS = st.one_of(
    st.fixed_dictionaries(
        {
            "nvidia.com/gpu": st.integers(1, 3),
            "nvidia.com/gpumem": st.integers(1, 90000),
            "nvidia.com/gpucores": st.integers(0, 100),
        }
    ),
    st.fixed_dictionaries(
        {
            "volcano.sh/vgpu-number": st.integers(1, 2),
            "volcano.sh/vgpu-memory-percentage": st.integers(1, 100),
        }
    ),
    st.fixed_dictionaries({"nvidia.com/gpu": st.integers(1, 2)}),
    st.fixed_dictionaries({"volcano.sh/gpu-memory": st.integers(1, 40000)}),
    st.fixed_dictionaries({"volcano.sh/gpu-number": st.integers(1, 2)}),
    st.fixed_dictionaries(
        {
            "huawei.com/Ascend910B3": st.just(1),
            "huawei.com/Ascend910B3-memory": st.integers(1, 65536),
        }
    ),
    st.fixed_dictionaries({"huawei.com/npu-core": st.sampled_from([1, 2, 4, 8])}),
)
ANNOTATIONS = st.sampled_from(
    [
        {},
        {"nvidia.com/vgpu-mode": "mig"},
        {"hami.io/gpu-scheduler-policy": "binpack"},
        {"hami.io/node-scheduler-policy": "spread"},
        {"nvidia.com/numa-bind": "true"},
        {"volcano.sh/vgpu-podgroup-policy": "spread"},
    ]
)
LABELS = st.sampled_from([{}, {"vnpu-level": "high"}, {"vnpu-dvpp": "yes"}])


@st.composite
def requests(draw: st.DrawFn) -> PodRequest:
    parsed = PARSER.parse(
        pod_json(draw(LIMITS), annotations=draw(ANNOTATIONS), labels=draw(LABELS))
    )
    assert isinstance(parsed, PodRequest), parsed
    return parsed


def check_capacity(ledger: Ledger) -> None:
    for node in ledger.nodes.values():
        for d in node.devices:
            assert 0 <= d.used_mem <= d.total_mem, (d.uuid, d.used_mem, d.total_mem)
            assert 0 <= d.used_cores <= d.total_cores, (d.uuid, d.used_cores, d.total_cores)
            assert 0 <= d.used_slots <= d.slots
            assert 0 <= d.used_ai_cores <= max(d.ai_cores, 0)
            assert 0 <= d.used_ai_cpus <= max(d.ai_cpus, 0)
            if d.mig is not None and d.mig_used:
                placements = {s.placement for s in d.mig.alternatives[d.mig_alt]}
                assert d.mig_used <= placements
    # usage is exactly the sum of the grants in force
    holders: dict[str, int] = {}
    for grant in ledger.pods.values():
        for dg in grant.device_grants():
            holders[dg.uuid] = holders.get(dg.uuid, 0) + 1
    for node in ledger.nodes.values():
        for d in node.devices:
            assert d.used_slots == holders.get(d.uuid, 0)


def rebuilt(
    ledger: Ledger, inventory: dict[str, list[DeviceInfo]], overrides: dict[str, NodeOverride]
) -> Ledger:
    return Ledger.rebuild(
        SPECS, overrides, {NodeName(k): v for k, v in inventory.items()}, list(ledger.pods.values())
    )


OPS = st.lists(
    st.tuples(
        st.sampled_from(["place", "place", "place", "release", "gang", "report"]),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=40,
)

# Example counts come from the profile (tests/conftest.py): HYPOTHESIS_PROFILE=thorough for more.
SETTINGS = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@SETTINGS
@given(
    cluster=clusters(),
    ops=OPS,
    data=st.data(),
    policy=st.sampled_from(["binpack", "spread", "fgd"]),
    allow_more=st.booleans(),
)
def test_random_streams_keep_every_invariant(
    cluster: tuple[dict[str, list[DeviceInfo]], dict[str, NodeOverride]],
    ops: list[tuple[str, int]],
    data: Any,
    policy: Any,
    allow_more: bool,
) -> None:
    inventory, overrides = cluster
    ledger = Ledger(SPECS, overrides)
    for name, devices in inventory.items():
        ledger.set_node(NodeName(name), devices)
    placer = Placer(
        ledger,
        PlacementConfig(
            node_policy=policy,
            device_policy=policy,
            allow_more_devices_than_cards=allow_more,
            fgd_candidates=8,
        ),
    )
    placed: list[Placement] = []
    for op, pick in ops:
        if op == "place":
            req = data.draw(requests())
            before = ledger.snapshot()
            result = placer.place(ref(), req, group=group("g") if pick % 2 else None)
            if isinstance(result, Placement):
                # release restores the exact prior state; then keep it placed
                assert placer.release(result.pod)
                assert ledger.snapshot() == before
                again = placer.place(result.pod, req, group=group("g") if pick % 2 else None)
                assert isinstance(again, Placement)
                placed.append(again)
            else:
                assert ledger.snapshot() == before  # a failure changes nothing
        elif op == "release" and placed:
            victim = placed.pop(pick % len(placed))
            assert placer.release(victim.pod)
            assert not placer.release(victim.pod)
        elif op == "gang":
            members = [
                GangMember(pod=ref(), request=data.draw(requests()), group=group(f"gang{pick}"))
                for _ in range(data.draw(st.integers(1, 4)))
            ]
            before = ledger.snapshot()
            result = placer.place_gang(members, min_member=len(members))
            if result.ok:
                placed.extend(result.placed)
            else:
                assert result.placed == []
                assert ledger.snapshot() == before
        elif op == "report":
            name = sorted(inventory)[pick % len(inventory)]
            ledger.set_node(NodeName(name), inventory[name])  # heartbeat: same inventory
        check_capacity(ledger)
    assert rebuilt(ledger, inventory, overrides).snapshot()[:3] == ledger.snapshot()[:3]


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(cluster=clusters(), data=st.data())
def test_a_discarded_statement_restores_the_ledger_exactly(
    cluster: tuple[dict[str, list[DeviceInfo]], dict[str, NodeOverride]], data: st.DataObject
) -> None:
    """Any mix of grants, replacements, releases and trials (tentative device uses, each
    discarded) made through a Statement, nested gangs committed into it included, is
    undone exactly by discard."""
    nodes, overrides = cluster
    ledger = Ledger(SPECS, overrides)
    for name, devices in nodes.items():
        ledger.set_node(NodeName(name), devices)
    plugin = data.draw(st.sets(st.sampled_from(sorted(nodes))))
    for name in plugin:
        ledger.set_plugin_node(NodeName(name), True)
    placer = Placer(ledger)
    for _ in range(data.draw(st.integers(0, 6))):  # some pods held before
        placer.place(ref(), data.draw(requests()))
    before = ledger.snapshot()
    with ledger.statement() as st_outer:
        for _ in range(data.draw(st.integers(1, 12))):
            step = data.draw(st.sampled_from(["place", "release", "use", "nested", "regrant"]))
            held = sorted(ledger.pods)
            if step == "place":
                placer.place(ref(), data.draw(requests()), statement=st_outer)
            elif step == "release" and held:
                st_outer.release(data.draw(st.sampled_from(held)))
            elif step == "regrant" and held:
                old = ledger.pods[data.draw(st.sampled_from(held))]
                st_outer.grant(old, admitting=data.draw(st.booleans()))
            elif step == "use":
                node = ledger.nodes[NodeName(data.draw(st.sampled_from(sorted(nodes))))]
                between = ledger.snapshot()
                with ledger.statement() as trial:
                    for dev in node.devices:
                        trial.use(dev, dev.grant(memory_mib=1, cores=0, exclusive=False))
                assert ledger.snapshot() == between
            elif step == "nested":
                members = [
                    GangMember(pod=ref(), request=data.draw(requests()))
                    for _ in range(data.draw(st.integers(1, 3)))
                ]
                placer.place_gang(members, len(members), statement=st_outer)
        assert st_outer.steps or ledger.snapshot() == before
    assert ledger.snapshot() == before
