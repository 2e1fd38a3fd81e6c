"""What a container is handed, as the node's config shapes it."""

from __future__ import annotations

import msgspec

from services.node_agent.isolation import handout
from shared.config import Config
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceInfo,
    DeviceUUID,
    NodeName,
    PodRef,
    PodUID,
)

NODE = NodeName("gpu-0")
POD = PodRef(namespace="ml", name="p", uid=PodUID("u"))
CARD = DeviceInfo(
    uuid=DeviceUUID("GPU-a"), index=0, vendor="nvidia", model="NVIDIA-A100", memory_mib=81920
)


def cfg(**top: object) -> Config:
    return msgspec.convert(top, Config)


def grant(**kw: object) -> ContainerGrant:
    d = DeviceGrant(uuid=CARD.uuid, memory_mib=kw.pop("memory", 4096), cores=30, **kw)  # type: ignore[arg-type]
    return ContainerGrant(container="main", devices=(d,))


def test_a_node_set_to_mps_hands_mps_client_limits_not_the_library() -> None:
    c = cfg(nodeConfigs=[{"name": "gpu-0", "operatingMode": "mps"}])
    out = handout(c, NODE, POD, grant(), {CARD.uuid: CARD})
    assert out.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
    }
    assert out.mounts == []


def test_scaling_core_policy_and_log_level_reach_the_library() -> None:
    c = cfg(
        devices={"nvidia": {"gpuCorePolicy": "force", "libCudaLogLevel": 3}},
        nodeConfigs=[{"name": "gpu-0", "deviceMemoryScaling": 1.5}],
    )
    envs = handout(c, NODE, POD, grant(), {CARD.uuid: CARD}).envs
    assert envs["CUDA_OVERSUBSCRIBE"] == "true"
    assert envs["GPU_CORE_UTILIZATION_POLICY"] == "force"
    assert envs["LIBCUDA_LOG_LEVEL"] == "3"
    # The container's own policy wins over the node's.
    own = msgspec.structs.replace(grant(), core_policy="disable")
    assert (
        handout(c, NODE, POD, own, {CARD.uuid: CARD}).envs["GPU_CORE_UTILIZATION_POLICY"]
        == "disable"
    )


def test_a_whole_card_needs_no_limits() -> None:
    out = handout(Config(), NODE, POD, grant(exclusive=True, memory=81920), {CARD.uuid: CARD})
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}
    assert out.mounts == []
