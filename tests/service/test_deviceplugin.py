"""The device plugin against a real gRPC peer playing the kubelet, over unix sockets.

The test serves the kubelet's ``Registration`` service on ``kubelet.sock`` in a temp
directory, as the kubelet does, and calls the plugin's ``DevicePlugin`` service the way
the kubelet's device manager does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest

from services.node_agent.deviceplugin import api_pb2 as pb
from services.node_agent.deviceplugin.allocation import Desk
from services.node_agent.deviceplugin.server import ResourceServer, list_size
from services.node_agent.resources import count_resources
from shared.config import Config, NodeAgentConfig
from shared.config import parse as parse_config
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceInfo,
    DeviceUUID,
    MigInstance,
    NodeName,
    PodRef,
    PodUID,
)
from tests.helpers import eventually
from tests.kubelet import Kubelet, allocate, call

NODE = NodeName("gpu-0")
A100 = "NVIDIA-A100-SXM4-80GB"


def gpu(i: int, **kw: object) -> DeviceInfo:
    fields: dict[str, object] = {"memory_mib": 81920, "numa": i // 2, **kw}
    return DeviceInfo(
        uuid=DeviceUUID(f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd"),
        index=i,
        vendor="nvidia",
        model=A100,
        **fields,  # type: ignore[arg-type]
    )


def pod(name: str) -> PodRef:
    return PodRef(namespace="ml", name=name, uid=PodUID(f"uid-{name}"))


def sliced(card: DeviceInfo, memory: int, cores: int, **kw: object) -> DeviceGrant:
    return DeviceGrant(
        uuid=card.uuid,
        index=card.index,
        model=card.model,
        memory_mib=memory,
        cores=cores,
        **kw,  # type: ignore[arg-type]
    )


@dataclass
class Plugin:
    server: ResourceServer
    desk: Desk
    admitted: list[PodRef]
    channel: grpc.aio.Channel


async def start_plugin(
    kubelet: Kubelet,
    devices: tuple[DeviceInfo, ...],
    cfg: Config | None = None,
    resource: int | str = 0,
    desk: Desk | None = None,
) -> Plugin:
    cfg = cfg or Config(
        node_agent=NodeAgentConfig(device_plugin_dir=str(kubelet.directory), admission_wait_s=1.0)
    )
    desk = desk or Desk()
    admitted: list[PodRef] = []

    async def on_admitted(p: PodRef) -> None:
        admitted.append(p)

    resources = count_resources(cfg, NODE, devices)
    if isinstance(resource, str):
        [res] = [r for r in resources if r.name == resource]
    else:
        res = resources[resource]
    server = ResourceServer(cfg, NODE, res, desk, lambda: {d.uuid: d for d in devices}, on_admitted)
    await server.start()
    return Plugin(server, desk, admitted, kubelet.channel(server.socket.name))


def list_and_watch(channel: grpc.aio.Channel) -> Any:
    """The kubelet's ListAndWatch stream of a plugin: ``read()`` each device list."""
    return channel.unary_stream(
        "/v1beta1.DevicePlugin/ListAndWatch",
        request_serializer=pb.Empty.SerializeToString,
        response_deserializer=pb.ListAndWatchResponse.FromString,
    )(pb.Empty())


async def test_registers_and_streams_a_health_change(kubelet: Kubelet) -> None:
    cards = (gpu(0), gpu(1))
    plugin = await start_plugin(kubelet, cards)
    try:
        req = await asyncio.wait_for(kubelet.registered.get(), 5)
        assert (req.version, req.resource_name, req.endpoint) == (
            "v1beta1",
            "nvidia.com/gpu",
            plugin.server.socket.name,
        )
        assert req.options.get_preferred_allocation_available

        stream = list_and_watch(plugin.channel)
        first = await asyncio.wait_for(stream.read(), 5)
        assert len(first.devices) == 20  # 2 cards x deviceSplitCount 10
        assert {d.health for d in first.devices} == {"Healthy"}
        assert {d.ID.split("::")[0] for d in first.devices} == {c.uuid for c in cards}
        numa = {d.ID.split("::")[0]: d.topology.nodes[0].ID for d in first.devices}
        assert numa == {cards[0].uuid: 0, cards[1].uuid: 0}

        sick = (cards[0], gpu(1, healthy=False))
        await plugin.server.update(count_resources(plugin.server.cfg, NODE, sick)[0])
        second = await asyncio.wait_for(stream.read(), 5)
        health = {d.ID: d.health for d in second.devices}
        assert sum(h == "Unhealthy" for h in health.values()) == 10
        assert all(h == "Unhealthy" for i, h in health.items() if i.startswith(cards[1].uuid))
        stream.cancel()
    finally:
        await plugin.channel.close()
        await plugin.server.stop()


async def test_allocate_hands_a_hami_core_container_exactly_its_grant(kubelet: Kubelet) -> None:
    cards = (gpu(0), gpu(1))
    plugin = await start_plugin(kubelet, cards)
    try:
        p = pod("infer")
        grant = ContainerGrant(
            container="main",
            devices=(sliced(cards[1], 20480, 30), sliced(cards[0], 20480, 30)),
            priority=1,
        )
        await plugin.desk.bound(p, (grant,))
        got = await allocate(plugin.channel, 2)
        (c,) = got.container_responses
        assert dict(c.envs) == {
            "NVIDIA_VISIBLE_DEVICES": f"{cards[1].uuid},{cards[0].uuid}",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "20480m",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "20480m",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/uid-infer_main.cache",
            "CUDA_TASK_PRIORITY": "1",
        }
        assert [(m.container_path, m.host_path, m.read_only) for m in c.mounts] == [
            ("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
            ("/usr/local/vgpu/cache", "/usr/local/vgpu/containers/uid-infer_main", False),
            ("/tmp/vgpulock", "/tmp/vgpulock", False),
            ("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True),
        ]
        assert plugin.admitted == [p]

        # CUDA_DISABLE_CONTROL=true: the limits are still handed over, the preload is not.
        q = pod("debug")
        free = ContainerGrant(
            container="shell", devices=(sliced(cards[0], 1024, 10),), disable_isolation=True
        )
        await plugin.desk.bound(q, (free,))
        (c,) = (await allocate(plugin.channel, 1)).container_responses
        assert "/etc/ld.so.preload" not in [m.container_path for m in c.mounts]
        assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    finally:
        await plugin.channel.close()
        await plugin.server.stop()


async def test_allocate_hands_a_mig_instance_and_an_ascend_vnpu(kubelet: Kubelet) -> None:
    running = (
        MigInstance(profile="3g.40gb", memory_mib=40192, placement=0, uuid="MIG-aaaa"),
        MigInstance(profile="3g.40gb", memory_mib=40192, placement=4, uuid="MIG-bbbb"),
    )
    card = gpu(0, mode="mig", mig_geometry=running)
    plugin = await start_plugin(kubelet, (card,))
    try:
        grant = ContainerGrant(
            container="train",
            devices=(sliced(card, 40192, 50, mig_profile="3g.40gb", mig_placement=4),),
        )
        await plugin.desk.bound(pod("mig"), (grant,))
        (c,) = (await allocate(plugin.channel, 1)).container_responses
        assert dict(c.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-bbbb"}
        assert list(c.mounts) == []
    finally:
        await plugin.channel.close()
        await plugin.server.stop()

    npu = DeviceInfo(
        uuid=DeviceUUID("ASCEND-3"),
        index=3,
        vendor="ascend",
        model="Ascend910B3",
        chip="910B3",
        memory_mib=65536,
    )
    plugin = await start_plugin(kubelet, (npu,))
    try:
        assert plugin.server.resource.name == "huawei.com/Ascend910B3"
        grant = ContainerGrant(
            container="npu",
            devices=(
                DeviceGrant(
                    uuid=npu.uuid,
                    index=3,
                    vendor="ascend",
                    memory_mib=16384,
                    vnpu_template="vir05_1c_16g",
                ),
            ),
        )
        await plugin.desk.bound(pod("npu"), (grant,))
        (c,) = (await allocate(plugin.channel, 1)).container_responses
        assert dict(c.envs) == {
            "ASCEND_VISIBLE_DEVICES": "3",
            "ASCEND_VNPU_SPECS": "vir05_1c_16g",
        }
        assert [d.host_path for d in c.devices] == [
            "/dev/davinci3",
            "/dev/davinci_manager",
            "/dev/devmm_svm",
            "/dev/hisi_hdc",
        ]
    finally:
        await plugin.channel.close()
        await plugin.server.stop()


async def test_allocate_waits_for_the_grant_and_refuses_what_it_cannot_resolve(
    kubelet: Kubelet,
) -> None:
    cards = (gpu(0), gpu(1))
    plugin = await start_plugin(kubelet, cards)
    try:
        # The kubelet may call before the pod's allocation.bound reaches the node.
        early = asyncio.create_task(allocate(plugin.channel, 1))
        await asyncio.sleep(0.2)
        await plugin.desk.bound(
            pod("late"), (ContainerGrant(container="c", devices=(sliced(cards[0], 512, 5),)),)
        )
        (c,) = (await early).container_responses
        assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "512m"

        # Nobody waits for 3 devices here: refused with a reason, after admissionWaitS.
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await allocate(plugin.channel, 3)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert "was it scheduled by Tessera?" in (missing.value.details() or "")

        # Two pods of one shape with different grants: refused, never guessed.
        for name, memory in (("a", 1000), ("b", 2000)):
            await plugin.desk.bound(
                pod(name), (ContainerGrant(container="c", devices=(sliced(cards[1], memory, 5),)),)
            )
        with pytest.raises(grpc.aio.AioRpcError) as ambiguous:
            await allocate(plugin.channel, 1)
        assert ambiguous.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "refusing to guess" in (ambiguous.value.details() or "")
    finally:
        await plugin.channel.close()
        await plugin.server.stop()


async def test_a_multi_container_pod_is_served_container_after_container(kubelet: Kubelet) -> None:
    cards = (gpu(0), gpu(1))
    plugin = await start_plugin(kubelet, cards)
    try:
        p = pod("two")
        grants = (
            ContainerGrant(container="init", init=True, devices=(sliced(cards[0], 100, 5),)),
            ContainerGrant(container="a", devices=(sliced(cards[0], 300, 5),)),
            ContainerGrant(container="b", devices=(sliced(cards[1], 700, 5),)),
        )
        await plugin.desk.bound(p, grants)
        limits = []
        for _ in grants:
            (c,) = (await allocate(plugin.channel, 1)).container_responses
            limits.append(c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"])
            assert plugin.admitted == ([p] if len(limits) == 3 else [])
        assert limits == ["100m", "300m", "700m"]
    finally:
        await plugin.channel.close()
        await plugin.server.stop()


async def test_a_kubelet_restart_is_followed_by_a_new_registration(kubelet: Kubelet) -> None:
    plugin = await start_plugin(kubelet, (gpu(0),))
    supervisor = asyncio.create_task(plugin.server.supervise(interval_s=0.1))
    try:
        await asyncio.wait_for(kubelet.registered.get(), 5)
        await kubelet.restart()  # the directory is wiped, our socket with it
        again = await asyncio.wait_for(kubelet.registered.get(), 5)
        assert again.resource_name == "nvidia.com/gpu"

        async def registered_twice() -> bool:
            return plugin.server.registrations == 2 and plugin.server.socket.exists()

        await eventually(registered_twice, timeout_s=5, what="a second registration")
        # The new socket serves.
        options = await call(plugin.channel, "GetDevicePluginOptions", pb.DevicePluginOptions)(
            pb.Empty()
        )
        assert options.get_preferred_allocation_available
    finally:
        supervisor.cancel()
        await plugin.channel.close()
        await plugin.server.stop()


def agent_config(kubelet: Kubelet, **devices: object) -> Config:
    """The config of a node whose kubelet plays in ``kubelet``'s directory."""
    return parse_config(
        {
            "devices": devices,
            "nodeAgent": {"devicePluginDir": str(kubelet.directory), "admissionWaitS": 1.0},
        }
    )


async def test_gpu_share_memory_is_served_one_id_per_unit_and_allocated_by_units(
    kubelet: Kubelet,
) -> None:
    cards = (gpu(0, memory_mib=4096), gpu(1, memory_mib=2048))
    cfg = agent_config(kubelet)
    desk = Desk()
    share = await start_plugin(kubelet, cards, cfg, "volcano.sh/gpu-memory", desk)
    count = await start_plugin(kubelet, cards, cfg, "nvidia.com/gpu", desk)
    try:
        req = await asyncio.wait_for(kubelet.registered.get(), 5)
        assert req.resource_name == "volcano.sh/gpu-memory"
        # Its free IDs would not fit in a GetPreferredAllocation request: not offered.
        assert not req.options.get_preferred_allocation_available
        stream = list_and_watch(share.channel)
        listed = await asyncio.wait_for(stream.read(), 5)
        stream.cancel()
        # One ID per MiB of each card: what the Node's capacity says.
        assert len(listed.devices) == 4096 + 2048
        assert list_size(share.server.resource) == listed.ByteSize()  # weighed unbuilt
        assert listed.devices[0].ID == "0-0"
        assert {d.ID.split("-")[0] for d in listed.devices} == {"0", "1"}

        # Three gpu-share pods bound at once and a counted one of the same number: each
        # Allocate is matched by its resource and its number of IDs.
        bound = {"a": (1000, cards[0]), "b": (2000, cards[0]), "c": (1, cards[1])}
        for name, (units, card) in bound.items():
            grant = ContainerGrant(container="main", devices=(sliced(card, units, 0, units=units),))
            await desk.bound(pod(name), (grant,))
        await desk.bound(
            pod("counted"),
            (ContainerGrant(container="main", devices=(sliced(cards[1], 512, 20),)),),
        )
        (c,) = (await allocate(count.channel, 1)).container_responses
        assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "512m"
        for name in ("b", "c", "a"):
            units, card = bound[name]
            (c,) = (await allocate(share.channel, units)).container_responses
            assert c.envs["NVIDIA_VISIBLE_DEVICES"] == card.uuid
            assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{units}m"
            assert c.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].endswith(f"uid-{name}_main.cache")
        assert [p.name for p in share.admitted] == ["b", "c", "a"]
        assert [p.name for p in count.admitted] == ["counted"]
    finally:
        for plugin in (share, count):
            await plugin.channel.close()
            await plugin.server.stop()


async def test_a_gpu_share_list_the_kubelet_could_not_read_is_not_registered(
    kubelet: Kubelet, caplog: pytest.LogCaptureFixture
) -> None:
    cards = (gpu(0), gpu(1), gpu(2))  # 3 x 81920 MiB: 245760 IDs, too many
    plugin = await start_plugin(kubelet, cards, agent_config(kubelet), "volcano.sh/gpu-memory")
    try:
        assert plugin.server.registrations == 0
        assert kubelet.registered.empty()
        assert "set devices.nvidia.gpuMemoryFactor (one ID per that many MiB) to at least 2" in (
            caplog.text
        )
    finally:
        await plugin.channel.close()
        await plugin.server.stop()
    # One ID per 16 MiB: 5120 per card, registered.
    cfg = agent_config(kubelet, nvidia={"gpuMemoryFactor": 16})
    plugin = await start_plugin(kubelet, cards, cfg, "volcano.sh/gpu-memory")
    try:
        req = await asyncio.wait_for(kubelet.registered.get(), 5)
        assert req.resource_name == "volcano.sh/gpu-memory"
        assert sum(n for _, n in plugin.server.resource.devices) == 3 * 5120
    finally:
        await plugin.channel.close()
        await plugin.server.stop()


async def test_mindcluster_npu_core_is_served_one_id_per_ai_core(kubelet: Kubelet) -> None:
    cards = tuple(
        DeviceInfo(
            uuid=DeviceUUID(f"ASCEND-{i}"),
            index=i,
            vendor="ascend",
            model="Ascend310P3",
            chip="310P3",
            memory_mib=21527,
        )
        for i in range(2)
    )
    plugin = await start_plugin(kubelet, cards, agent_config(kubelet), "huawei.com/npu-core")
    try:
        req = await asyncio.wait_for(kubelet.registered.get(), 5)
        assert req.resource_name == "huawei.com/npu-core"
        assert sum(n for _, n in plugin.server.resource.devices) == 16
        template = DeviceGrant(
            uuid=cards[1].uuid, index=1, vendor="ascend", vnpu_template="vir04", units=4
        )
        await plugin.desk.bound(
            pod("vnpu"), (ContainerGrant(container="npu", devices=(template,)),)
        )
        (c,) = (await allocate(plugin.channel, 4)).container_responses
        assert dict(c.envs) == {"ASCEND_VISIBLE_DEVICES": "1", "ASCEND_VNPU_SPECS": "vir04"}
        assert plugin.admitted == [pod("vnpu")]
    finally:
        await plugin.channel.close()
        await plugin.server.stop()
