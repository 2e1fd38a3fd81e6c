"""Fair share by weighted water-filling, with capability, demand and guarantee."""

from __future__ import annotations

import pytest

from shared.core.queues import (
    QueueShare,
    add,
    deserved,
    request_vector,
    resource_vector,
    within,
)
from shared.core.request import ResourceTable
from shared.core.spec import DeviceSpecs
from tests.unit.corekit import request

TOTAL = {"nvidia.memory": 400.0, "nvidia.cores": 800.0}


def test_weights_split_a_contended_cluster_1_to_3() -> None:
    want = {"nvidia.memory": 1000.0}
    d = deserved(TOTAL, [QueueShare("a", 1, want), QueueShare("b", 3, want)])
    assert d["a"]["nvidia.memory"] == pytest.approx(100)
    assert d["b"]["nvidia.memory"] == pytest.approx(300)


def test_a_queue_wanting_little_returns_the_rest_to_the_others() -> None:
    d = deserved(
        TOTAL,
        [QueueShare("a", 1, {"nvidia.memory": 50}), QueueShare("b", 1, {"nvidia.memory": 1000})],
    )
    assert d["a"]["nvidia.memory"] == pytest.approx(50)
    assert d["b"]["nvidia.memory"] == pytest.approx(350)


def test_capability_caps_and_guarantee_floors() -> None:
    d = deserved(
        TOTAL,
        [
            QueueShare("capped", 3, {"nvidia.memory": 1000}, capability={"nvidia.memory": 60}),
            QueueShare("other", 1, {"nvidia.memory": 1000}),
            QueueShare("idle", 1, {}, guarantee={"nvidia.memory": 20}),
        ],
    )
    assert d["capped"]["nvidia.memory"] == pytest.approx(60)
    assert d["other"]["nvidia.memory"] == pytest.approx(340)
    assert d["idle"]["nvidia.memory"] == 20


def test_one_queue_alone_may_use_everything() -> None:
    d = deserved(TOTAL, [QueueShare("solo", 1, {"nvidia.memory": 1000, "nvidia.cores": 50})])
    assert d["solo"] == {"nvidia.memory": pytest.approx(400), "nvidia.cores": pytest.approx(50)}


def test_vectors_from_pods_and_from_queue_resources_share_dimensions() -> None:
    table = ResourceTable.build(DeviceSpecs())
    hami = resource_vector(
        table, {"nvidia.com/gpumem": "20k", "cpu": "4", "volcano.sh/vgpu-cores": 50}
    )
    assert hami == {"nvidia.memory": 20000, "nvidia.cores": 50}
    pod = request_vector(
        request({"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 4000}), {"nvidia": 81920}
    )
    assert pod == {"nvidia.count": 2, "nvidia.memory": 8000}
    whole = request_vector(request({"nvidia.com/gpu": 1}), {"nvidia": 81920})
    assert whole == {"nvidia.count": 1, "nvidia.memory": 81920, "nvidia.cores": 100}
    assert within(pod, add(pod, hami))
    assert not within(add(pod, pod), pod)
    cap = {"nvidia.memory": 10000.0}  # names memory only: count is not capped
    assert within(pod, cap, absent=float("inf"))
    assert not within(pod, cap)


def test_a_pods_vector_counts_init_containers_as_kubernetes_does() -> None:
    """max(each init container with the sidecars before it, app containers + sidecars)."""

    def box(name: str, mem: int, **extra: object) -> dict[str, object]:
        return {
            "name": name,
            "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem}},
            **extra,
        }

    pod = request(
        {},
        containers=[box("main", 20000)],
        init=[box("proxy", 5000, restartPolicy="Always"), box("fetch", 30000)],
    )
    vector = request_vector(pod, {"nvidia": 81920})
    assert vector["nvidia.memory"] == 35000  # fetch 30000 beside proxy 5000 > 25000
    assert vector["nvidia.count"] == 2
