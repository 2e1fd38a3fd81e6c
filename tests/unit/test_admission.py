"""The node agent's admission bookkeeping, without gRPC."""

from __future__ import annotations

import json

import pytest

from services.node_agent.admission import Admissions, AmbiguousError, admitted_in_checkpoint
from shared.core.admission import keys_of_grants
from shared.core.model import ContainerGrant, DeviceGrant, DeviceUUID, PodRef, PodUID


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
