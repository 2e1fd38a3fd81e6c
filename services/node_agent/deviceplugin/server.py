"""The device plugin the kubelet talks to: one gRPC server per count resource.

Each server listens on its own unix socket in the kubelet's device-plugin directory and
registers its resource (``nvidia.com/gpu``, ``huawei.com/Ascend910B3``...) with the
kubelet's ``Registration`` service. It then serves:

- ``ListAndWatch``: the resource's device IDs (a sliced card offers ``deviceSplitCount``
  IDs, ``<uuid>::<slot>``; a resource counted in units one per unit, ``<index>-<unit>``,
  short because a card has tens of thousands), each with its health and NUMA node, and
  the list again whenever health changes;
- ``GetPreferredAllocation``: any IDs (the placement was decided by the allocator, and
  the IDs carry no meaning beyond their count); not offered for a resource counted in
  units, whose free IDs would not fit in the kubelet's request;
- ``Allocate``: for each container, the pod it is for (``Desk.claim`` on the resource's
  channel, see services/node_agent/admission.py) and exactly that container's hand-out
  (services/node_agent/isolation.py). An Allocate that cannot be resolved fails with a
  message the kubelet puts on the pod; it never hands over another pod's grant.

The kubelet removes every socket in the directory when it restarts; ``supervise``
notices (our socket gone, or ``kubelet.sock`` replaced) and serves and registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import grpc.aio

from services.node_agent.admission import Admissions, AmbiguousError, Match
from services.node_agent.deviceplugin import api_pb2 as pb
from services.node_agent.isolation import Handout, HandoutError, handout
from services.node_agent.resources import CountResource
from shared.config import Config
from shared.core.admission import Channel
from shared.core.model import (
    ContainerGrant,
    DeviceInfo,
    DeviceUUID,
    NodeName,
    PodRef,
    PodUID,
)

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
KUBELET_MAX_MESSAGE = 4 << 20
"""The largest message the kubelet's device-plugin client reads (gRPC's default: it
sets no other), so the most a ListAndWatch answer may weigh."""


class Desk:
    """The pods bound to this node and not yet admitted, shared by every resource's
    server: ``allocation.bound`` events come in, Allocate calls wait here for theirs."""

    def __init__(self) -> None:
        self.admissions = Admissions()
        self._changed = asyncio.Condition()
        self.foreign: Callable[[str, int], Awaitable[list[str]]] = _none_foreign
        """The pods bound to this node by another scheduler, not admitted yet, with a
        container asking ``count`` of ``resource`` (the agent reads them from the API
        server): an Allocate of that shape may be theirs, so it takes no grant."""

    async def bound(self, pod: PodRef, grants: tuple[ContainerGrant, ...]) -> None:
        self.admissions.bound(pod, grants)
        async with self._changed:
            self._changed.notify_all()

    def gone(self, uid: PodUID) -> None:
        self.admissions.gone(uid)

    async def claim(self, channel: Channel, count: int, timeout_s: float) -> Match:
        """The pod and container grant this Allocate is for, waiting up to ``timeout_s``
        for its ``allocation.bound`` (the kubelet may see the pod first)."""
        deadline = time.monotonic() + timeout_s
        async with self._changed:
            while True:
                found = self.admissions.match(channel, count)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=left)


async def _none_foreign(_resource: str, _count: int) -> list[str]:
    return []


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


def to_proto(h: Handout) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=h.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in h.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in h.devices
        ],
    )


def socket_name(resource: str) -> str:
    return "tessera-" + resource.replace("/", "-").replace(".", "_") + ".sock"


WRITABLE_MODE = 0o777
"""The directories a container writes through the isolation library (its accounting
file's, the lock directory) are open to every user, as HAMi's plugin makes them: the
container's user is whoever its image says."""


def make_writable_dirs(given: Handout) -> None:
    """Create, on the host, every directory the container gets writable (its accounting
    directory, the lock directory) before the kubelet mounts them; OSError when one
    cannot be made (the Allocate is then refused with the reason)."""
    for mount in given.mounts:
        if mount.read_only:
            continue
        path = Path(mount.host_path)
        path.mkdir(parents=True, exist_ok=True)
        if path.stat().st_mode & 0o777 != WRITABLE_MODE:
            path.chmod(WRITABLE_MODE)  # mkdir's mode is cut by the umask


@dataclass(eq=False)
class ResourceServer:
    """The device plugin of one resource on one node."""

    cfg: Config
    node: NodeName
    resource: CountResource
    desk: Desk
    devices: Callable[[], Mapping[DeviceUUID, DeviceInfo]]
    on_admitted: Callable[[PodRef], Awaitable[None]]
    record: Callable[[str, str], None] = lambda _resource, _result: None
    """Counts each Allocate answered: (resource, result)."""

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
        return self.options()

    async def list_and_watch(
        self, _request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        while True:
            sent = self._version
            yield pb.ListAndWatchResponse(devices=device_ids(self.resource))
            self.listed.set()
            async with self._updated:
                while self._version == sent:
                    await self._updated.wait()

    async def get_preferred_allocation(
        self, request: pb.PreferredAllocationRequest, _context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        out = []
        for c in request.container_requests:
            must = list(c.must_include_deviceIDs)
            rest = [i for i in c.available_deviceIDs if i not in set(must)]
            out.append(
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=(must + rest)[: c.allocation_size]
                )
            )
        return pb.PreferredAllocationResponse(container_responses=out)

    async def allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        responses = []
        channel = self.resource.channel
        for c in request.container_requests:
            count = len(c.devices_ids)
            log.debug("%s: an Allocate of %d ID(s) looks for its pod", self.resource.name, count)
            foreign = await self.desk.foreign(self.resource.name, count)
            if foreign:  # the kubelet may be admitting one of them: never hand it a grant
                await self._refuse(
                    context,
                    "foreign-pod",
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{', '.join(foreign)} bound to {self.node} by another scheduler "
                    f"ask(s) for {count} {self.resource.name}: Tessera hands its devices only "
                    "to pods it placed, and cannot tell this Allocate from theirs",
                )
            try:
                match = await self.desk.claim(channel, count, self.cfg.node_agent.admission_wait_s)
                given = handout(self.cfg, self.node, match.pod, match.grant, self.devices())
                await asyncio.to_thread(make_writable_dirs, given)
                responses.append(to_proto(given))
            except TimeoutError:
                await self._refuse(
                    context,
                    "unknown-pod",
                    grpc.StatusCode.NOT_FOUND,
                    f"no pod bound to {self.node} by Tessera waits for {count} device ID(s) "
                    f"of {self.resource.name} (waited "
                    f"{self.cfg.node_agent.admission_wait_s:.0f}s): was it scheduled by Tessera?",
                )
            except (AmbiguousError, HandoutError, OSError) as exc:
                await self._refuse(
                    context, type(exc).__name__, grpc.StatusCode.FAILED_PRECONDITION, str(exc)
                )
            self.record(self.resource.name, "ok")
            log.info(
                "Allocate %s x%d: %s container %s (%s)",
                self.resource.name,
                count,
                match.pod,
                match.grant.container,
                ", ".join(f"{k}={v}" for k, v in sorted(responses[-1].envs.items())),
            )
            if match.admitted:
                await self.on_admitted(match.pod)
        return pb.AllocateResponse(container_responses=responses)

    async def _refuse(
        self,
        context: grpc.aio.ServicerContext,
        result: str,
        code: grpc.StatusCode,
        message: str,
    ) -> NoReturn:
        """Answer the kubelet with ``message`` (it fails the pod with it), counted as
        ``result``."""
        self.record(self.resource.name, result)
        log.error("Allocate on %s refused: %s", self.node, message)
        await context.abort(code, message)  # raises
        raise AssertionError("unreachable")

    async def pre_start_container(
        self, _request: pb.PreStartContainerRequest, _context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return 0
