"""The device plugin the kubelet talks to: one gRPC server per count resource.

Each server listens on its own unix socket in the kubelet's device-plugin directory and
registers its resource (``nvidia.com/gpu``, ``huawei.com/Ascend910B3``...) with the
kubelet's ``Registration`` service. This module owns that life and the device list:

- ``ListAndWatch``: the resource's device IDs (a sliced card offers ``deviceSplitCount``
  IDs, ``<uuid>::<slot>``; a resource counted in units one per unit, ``<index>-<unit>``,
  short because a card has tens of thousands), each with its health and NUMA node, and
  the list again whenever health changes; a list heavier than the kubelet reads is not
  registered at all;
- ``GetDevicePluginOptions``: whether ``GetPreferredAllocation`` is offered.

``Allocate`` and ``GetPreferredAllocation`` are allocation.py's. The kubelet removes every
socket in the directory when it restarts; ``supervise`` notices (our socket gone, or
``kubelet.sock`` replaced) and serves and registers again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from services.node_agent.deviceplugin import api_pb2 as pb
from services.node_agent.deviceplugin.allocation import AllocationServicer
from services.node_agent.resources import CountResource
from shared.core.model import DeviceInfo

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
KUBELET_MAX_MESSAGE = 4 << 20
"""The largest message the kubelet's device-plugin client reads (gRPC's default: it
sets no other), so the most a ListAndWatch answer may weigh."""


def device_ids(resource: CountResource) -> list[pb.Device]:
    """The resource's device IDs as the kubelet lists them (see the module docstring)."""
    return [
        _device_id(resource, device, slot)
        for device, slots in resource.devices
        for slot in range(slots)
    ]


def list_size(resource: CountResource) -> int:
    """The bytes of the resource's ListAndWatch answer, without building it: IDs whose
    slot numbers have as many digits weigh the same."""
    total = 0
    for device, slots in resource.devices:
        start = 0
        while start < slots:
            end = min(slots, 10 ** len(str(start)))
            one = pb.ListAndWatchResponse(devices=[_device_id(resource, device, start)])
            total += (end - start) * one.ByteSize()
            start = end
    return total


def _device_id(resource: CountResource, device: DeviceInfo, slot: int) -> pb.Device:
    prefix = f"{device.index}-" if resource.units else f"{device.uuid}::"
    return pb.Device(
        ID=f"{prefix}{slot}",
        health=HEALTHY if device.healthy else UNHEALTHY,
        topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa)]),
    )


def socket_name(resource: str) -> str:
    """The file name of a resource's socket in the kubelet's device-plugin directory."""
    return "tessera-" + resource.replace("/", "-").replace(".", "_") + ".sock"


@dataclass(eq=False)
class ResourceServer(AllocationServicer):
    """The device plugin of one resource on one node: its socket, its registration and
    its device list, beside the allocation RPCs and what they read (its fields are
    AllocationServicer's)."""

    def __post_init__(self) -> None:
        cfg, resource = self.cfg, self.resource
        self.directory = Path(cfg.node_agent.device_plugin_dir)
        self.socket = self.directory / socket_name(resource.name)
        self.server: grpc.aio.Server | None = None
        self._version = 0
        self._updated = asyncio.Condition()
        self._kubelet_inode = 0
        self.registrations = 0
        self.listed = asyncio.Event()
        """The kubelet has the device IDs (one ListAndWatch answer was sent): a pod bound
        before that fails its admission for good ("no healthy devices present")."""

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Serve on a fresh socket, then register with the kubelet."""
        await self.stop()
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self._handlers(),))
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self.server = server
        await self.register()

    def options(self) -> pb.DevicePluginOptions:
        """What the kubelet may call: GetPreferredAllocation, except for a resource
        counted in units (its request would list every free unit of the node)."""
        return pb.DevicePluginOptions(get_preferred_allocation_available=not self.resource.units)

    def too_large(self) -> str | None:
        """Why the kubelet could not read this resource's device list, or None."""
        size = list_size(self.resource)
        if size <= KUBELET_MAX_MESSAGE:
            return None
        ids = sum(s for _, s in self.resource.devices)
        spec = self.cfg.devices.vendor(self.resource.vendor)
        factor = spec.gpu_memory_factor if spec is not None else 1
        return (
            f"{ids} device IDs of {self.resource.name} weigh {size} bytes, more than the "
            f"{KUBELET_MAX_MESSAGE} the kubelet reads, so no pod asking it can start here: "
            f"set devices.{self.resource.vendor}.gpuMemoryFactor (one ID per that many MiB) "
            f"to at least {factor * -(-size // KUBELET_MAX_MESSAGE)}, or gpuShareMemoryName "
            '"" to turn gpu-share off'
        )

    async def register(self) -> None:
        """Register the resource with the kubelet (not when its device list is
        ``too_large``)."""
        kubelet = self.directory / KUBELET_SOCKET
        self._kubelet_inode = _inode(kubelet)
        refused = self.too_large()
        if refused is not None:
            log.warning("not registering %s: %s", self.resource.name, refused)
            return
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            register = channel.unary_unary(
                "/v1beta1.Registration/Register",
                request_serializer=pb.RegisterRequest.SerializeToString,
                response_deserializer=pb.Empty.FromString,
            )
            await register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource.name,
                    options=self.options(),
                ),
                timeout=10,
            )
        self.registrations += 1
        log.info(
            "registered %s with the kubelet (%d device IDs, socket %s)",
            self.resource.name,
            sum(s for _, s in self.resource.devices),
            self.socket,
        )

    async def stop(self) -> None:
        """Stop serving (the socket stays until the next ``start``)."""
        if self.server is not None:
            await self.server.stop(grace=0.5)
            self.server = None

    async def supervise(self, interval_s: float = 1.0) -> None:
        """Serve and register again after a kubelet restart (it wipes the directory and
        recreates its socket); retry while the kubelet is away."""
        while True:
            await asyncio.sleep(interval_s)
            kubelet = self.directory / KUBELET_SOCKET
            restarted = _inode(kubelet) != self._kubelet_inode or not self.socket.exists()
            if not restarted or not kubelet.exists():
                continue
            log.info("the kubelet restarted: serving and registering %s again", self.resource.name)
            try:
                await self.start()
            except (grpc.aio.AioRpcError, OSError) as exc:
                log.warning("registering %s failed (%s); retrying", self.resource.name, exc)
                self._kubelet_inode = 0

    async def update(self, resource: CountResource) -> None:
        """New devices or health: every ListAndWatch stream sends the list again."""
        if resource == self.resource:
            return
        self.resource = resource
        async with self._updated:
            self._version += 1
            self._updated.notify_all()

    # --- the DevicePlugin service -----------------------------------------------------

    def _handlers(self) -> grpc.GenericRpcHandler:
        def unary(method: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                method,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        return grpc.method_handlers_generic_handler(
            "v1beta1.DevicePlugin",
            {
                "GetDevicePluginOptions": unary(self.get_options, pb.Empty, pb.DevicePluginOptions),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self.list_and_watch,
                    request_deserializer=pb.Empty.FromString,
                    response_serializer=pb.ListAndWatchResponse.SerializeToString,
                ),
                "GetPreferredAllocation": unary(
                    self.get_preferred_allocation,
                    pb.PreferredAllocationRequest,
                    pb.PreferredAllocationResponse,
                ),
                "Allocate": unary(self.allocate, pb.AllocateRequest, pb.AllocateResponse),
                "PreStartContainer": unary(
                    self.pre_start_container,
                    pb.PreStartContainerRequest,
                    pb.PreStartContainerResponse,
                ),
            },
        )

    async def get_options(
        self, _request: pb.Empty, _context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        """GetDevicePluginOptions: :meth:`options`."""
        return self.options()

    async def list_and_watch(
        self, _request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        """The device IDs now, and again after each :meth:`update` that changed them."""
        while True:
            sent = self._version
            yield pb.ListAndWatchResponse(devices=device_ids(self.resource))
            self.listed.set()
            async with self._updated:
                while self._version == sent:
                    await self._updated.wait()


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return 0
