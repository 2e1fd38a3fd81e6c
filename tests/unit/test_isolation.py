"""What a container is handed, as the node's config shapes it."""

from __future__ import annotations

import msgspec
import pytest

from services.node_agent.isolation import HandoutError, handout
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


MPS_NODE = [{"name": "gpu-0", "operatingMode": "mps"}]
RUNNING = msgspec.structs.replace(CARD, mps="running")


def test_an_mps_card_hands_its_own_daemon_pipe_shm_the_client_limits_and_the_library() -> None:
    c = cfg(nodeConfigs=MPS_NODE)
    out = handout(c, NODE, POD, grant(), {CARD.uuid: RUNNING})
    assert out.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        # HAMi-core for memory only (the container sees 4096 MiB as the card's size);
        # MPS limits the SMs, so no CUDA_DEVICE_SM_LIMIT.
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/u_main.cache",
    }
    mounts = {m.container_path: (m.host_path, m.read_only) for m in out.mounts}
    # The card's own daemon (one per card, services/node_agent/mps/): its pipes, and the
    # shared memory its server uses as /dev/shm.
    assert mounts["/tmp/nvidia-mps"] == ("/run/tessera/mps/GPU-a/pipe", False)
    assert mounts["/dev/shm"] == ("/run/tessera/mps/GPU-a/shm", False)
    assert mounts["/etc/ld.so.preload"] == ("/usr/local/vgpu/ld.so.preload", True)
    # Without the library: the MPS client limits alone; cores not asked: all of them.
    bare = cfg(nodeConfigs=MPS_NODE, nodeAgent={"mps": {"hamiCore": False, "hostDir": "/var/mps"}})
    whole = ContainerGrant(container="main", devices=(DeviceGrant(uuid=CARD.uuid, memory_mib=8),))
    out = handout(bare, NODE, POD, whole, {CARD.uuid: RUNNING})
    assert out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in out.envs
    assert [(m.container_path, m.host_path) for m in out.mounts] == [
        ("/tmp/nvidia-mps", "/var/mps/GPU-a/pipe"),
        ("/dev/shm", "/var/mps/GPU-a/shm"),
    ]


def test_the_pinned_memory_limit_names_the_one_device_the_container_sees() -> None:
    """The fourth card of the node is device 0 in its container (NVIDIA_VISIBLE_DEVICES),
    and the client's own daemon serves that card alone."""
    fourth = msgspec.structs.replace(RUNNING, uuid=DeviceUUID("GPU-d"), index=3)
    d = DeviceGrant(uuid=fourth.uuid, index=3, memory_mib=2048, cores=20)
    out = handout(
        cfg(nodeConfigs=MPS_NODE),
        NODE,
        POD,
        ContainerGrant(container="main", devices=(d,)),
        {fourth.uuid: fourth},
    )
    assert out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert out.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-d"


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


@pytest.mark.parametrize("state", ["unavailable", ""])
def test_an_mps_card_whose_daemon_is_not_known_to_run_is_not_handed_over(state: str) -> None:
    """``""``: the agent never read the card's daemon; the container would run without its
    core limit either way."""
    c = cfg(nodeConfigs=MPS_NODE)
    down = msgspec.structs.replace(CARD, mps=state)
    with pytest.raises(HandoutError, match="no MPS daemon is known to run for GPU-a"):
        handout(c, NODE, POD, grant(), {CARD.uuid: down})


def test_one_container_is_never_handed_two_mps_cards() -> None:
    """A client reaches one daemon, so one card (the scheduler never grants two)."""
    other = msgspec.structs.replace(RUNNING, uuid=DeviceUUID("GPU-b"), index=1)
    two = ContainerGrant(
        container="main",
        devices=tuple(
            DeviceGrant(uuid=u, memory_mib=1024, cores=10) for u in (CARD.uuid, other.uuid)
        ),
    )
    with pytest.raises(HandoutError, match="a client reaches one card's MPS daemon"):
        handout(cfg(nodeConfigs=MPS_NODE), NODE, POD, two, {CARD.uuid: RUNNING, other.uuid: other})
