"""Admission: the allocator's keys (shared/core/admission.py) and the node agent's
bookkeeping that matches each kubelet Allocate to its pod, without gRPC."""

from __future__ import annotations

import json

import pytest

from services.node_agent.admission import Admissions, AmbiguousError, admitted_in_checkpoint
from shared.core.admission import keys_of_grants
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceUUID,
    NodeName,
    PodRef,
    PodUID,
)
from shared.core.placement import Failure, Placement
from tests.unit.corekit import gpus, npu, placer, ref, request


def pod(name: str) -> PodRef:
    return PodRef(namespace="ns", name=name, uid=PodUID(name))


def grants(*counts: int, memory: int = 1000) -> tuple[ContainerGrant, ...]:
    return tuple(
        ContainerGrant(
            container=f"c{i}",
            devices=tuple(
                DeviceGrant(uuid=DeviceUUID(f"GPU-{j}"), memory_mib=memory) for j in range(n)
            ),
        )
        for i, n in enumerate(counts)
    )


def test_the_kubelet_checkpoint_names_the_pods_it_gave_devices() -> None:
    text = json.dumps(
        {
            "Data": {
                "PodDeviceEntries": [
                    {"PodUID": "a", "ContainerName": "c", "ResourceName": "nvidia.com/gpu"},
                    {"PodUID": "b", "ContainerName": "c", "ResourceName": "nvidia.com/gpu"},
                ],
                "RegisteredDevices": {"nvidia.com/gpu": ["x"]},
            },
            "Checksum": 1,
        }
    )
    assert admitted_in_checkpoint(text) == {"a", "b"}
    assert admitted_in_checkpoint('{"Data": {"PodDeviceEntries": null}}') == set()
    assert admitted_in_checkpoint("not json") is None


def test_a_pods_later_containers_follow_its_first_and_keys_match_the_allocator() -> None:
    desk = Admissions()
    desk.bound(pod("two"), grants(1, 2))
    desk.bound(pod("one"), grants(2, memory=7))
    assert keys_of_grants(grants(1, 2)) == {("nvidia", 1)}
    first = desk.match("nvidia", 1)
    assert first is not None
    assert (first.pod.name, first.grant.container, first.admitted) == ("two", "c0", False)
    # The next call is for "two"'s second container, though "one" also waits for 2.
    second = desk.match("nvidia", 2)
    assert second is not None
    assert (second.pod.name, second.grant.container, second.admitted) == ("two", "c1", True)
    third = desk.match("nvidia", 2)
    assert third is not None
    assert third.pod.name == "one"
    assert desk.match("nvidia", 2) is None  # nobody left


def test_two_waiting_pods_of_one_shape_are_refused_unless_interchangeable() -> None:
    desk = Admissions()
    desk.bound(pod("a"), grants(1, memory=1000))
    desk.bound(pod("b"), grants(1, memory=1000))  # the same devices and limits
    first = desk.match("nvidia", 1)
    assert first is not None
    assert first.pod.name == "a"  # identical hand-outs: the oldest
    desk.bound(pod("c"), grants(1, memory=2000))
    with pytest.raises(AmbiguousError, match="refusing to guess"):
        desk.match("nvidia", 1)


def share(units: int, card: int = 0, container: str = "c0", factor: int = 1) -> ContainerGrant:
    """A Volcano gpu-share container's grant: one card, ``units`` memory units."""
    return ContainerGrant(
        container=container,
        devices=(
            DeviceGrant(uuid=DeviceUUID(f"GPU-{card}"), memory_mib=units * factor, units=units),
        ),
    )


def test_a_gpu_share_container_is_keyed_by_its_memory_units_on_its_own_channel() -> None:
    assert keys_of_grants((share(2000),)) == {("gpu-share", 2000)}
    # a pod asking a count and a share: one key per channel, never confused
    both = (grants(1)[0], share(512, container="c1"))
    assert keys_of_grants(both) == {("nvidia", 1), ("gpu-share", 512)}
    npu_core = ContainerGrant(
        container="c",
        devices=(
            DeviceGrant(uuid=DeviceUUID("NPU-0"), vendor="ascend", units=8),
            DeviceGrant(uuid=DeviceUUID("NPU-1"), vendor="ascend", units=8),
        ),
    )
    assert keys_of_grants((npu_core,)) == {("npu-core", 16)}


def test_gpu_share_pods_bound_at_once_each_get_their_own_allocate() -> None:
    desk = Admissions()
    sizes = {"small": 1000, "medium": 2000, "large": 4000, "counted": 0}
    for name, units in sizes.items():
        desk.bound(pod(name), (share(units, card=units),) if units else grants(1, memory=units))
    # The kubelet admits them in any order; each call carries the container's units.
    for name, units in (("large", 4000), ("counted", 0), ("small", 1000), ("medium", 2000)):
        found = desk.match("gpu-share", units) if units else desk.match("nvidia", 1)
        assert found is not None
        assert (found.pod.name, found.admitted) == (name, True)
        if units:
            assert found.grant.devices[0].memory_mib == units
    assert desk.waiting == {}
    # A count call never takes a share pod, nor the other way round.
    desk.bound(pod("s"), (share(1),))
    assert desk.match("nvidia", 1) is None
    assert desk.match("gpu-share", 1) is not None


def test_two_gpu_share_pods_of_one_size_are_interchangeable_only_when_alike() -> None:
    desk = Admissions()
    desk.bound(pod("a"), (share(3000, card=0),))
    desk.bound(pod("b"), (share(3000, card=0),))  # the same card and memory
    first = desk.match("gpu-share", 3000)
    assert first is not None
    assert first.pod.name == "a"
    desk.bound(pod("c"), (share(3000, card=1),))  # another card: another hand-out
    with pytest.raises(AmbiguousError, match="3000 gpu-share device ID"):
        desk.match("gpu-share", 3000)


def test_a_container_of_two_channels_is_handed_its_whole_grant_on_each_call() -> None:
    desk = Admissions()
    mixed = ContainerGrant(
        container="main",
        devices=(
            DeviceGrant(uuid=DeviceUUID("GPU-0"), memory_mib=100),
            DeviceGrant(uuid=DeviceUUID("NPU-0"), vendor="ascend"),
        ),
    )
    after = share(700, container="after")
    desk.bound(pod("p"), (mixed, after))
    # The kubelet walks a container's resources in map order: Ascend first here.
    on_npu = desk.match("ascend", 1)
    assert on_npu is not None
    on_gpu = desk.match("nvidia", 1)
    assert on_gpu is not None
    assert on_npu.grant == on_gpu.grant == mixed
    assert not on_gpu.admitted
    last = desk.match("gpu-share", 700)
    assert last is not None
    assert (last.grant, last.admitted) == (after, True)


def test_the_allocator_keeps_one_pod_per_gpu_share_key_in_flight_to_a_node() -> None:
    pl = placer({"n": gpus(2)})
    pl.ledger.set_plugin_node(NodeName("n"), True)
    first = pl.place(ref("first"), request({"volcano.sh/gpu-memory": 2000}))
    assert isinstance(first, Placement)
    assert first.grants[0].devices[0].units == 2000
    same = pl.place(ref("same"), request({"volcano.sh/gpu-memory": 2000}))
    assert isinstance(same, Failure)
    assert "another pod asking 2000 gpu-share device(s) is being admitted" in same.status.message()
    # Another size, or a count of the same number, binds meanwhile.
    assert isinstance(pl.place(ref("other"), request({"volcano.sh/gpu-memory": 1000})), Placement)
    count = request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000})
    assert isinstance(pl.place(ref("count"), count), Placement)
    # Once the first is admitted by its kubelet, the second of its size binds.
    assert pl.ledger.admitted(first.pod.uid, NodeName("n"))
    assert isinstance(pl.place(ref("same"), request({"volcano.sh/gpu-memory": 2000})), Placement)


def test_mindcluster_cores_are_keyed_on_the_npu_core_channel() -> None:
    pl = placer({"p": [npu(0, chip="310P3", memory=21527), npu(1, chip="310P3", memory=21527)]})
    pl.ledger.set_plugin_node(NodeName("p"), True)
    whole = pl.place(ref("whole"), request({"huawei.com/npu-core": 8}))
    assert isinstance(whole, Placement)
    assert keys_of_grants(whole.grants) == {("npu-core", 8)}
    refused = pl.place(ref("again"), request({"huawei.com/npu-core": 8}))
    assert isinstance(refused, Failure)
    assert "another pod asking 8 npu-core device(s)" in refused.status.message()
    template = pl.place(ref("small"), request({"huawei.com/npu-core": 2}))
    assert isinstance(template, Placement)
    assert keys_of_grants(template.grants) == {("npu-core", 2)}
