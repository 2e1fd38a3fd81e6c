"""The kubelet's allocation calls on a device plugin: which pod each Allocate is for, and
what its container is handed.

- ``Allocate``: for each container, the pod it is for (``Desk.claim`` on the resource's
  channel, see services/node_agent/admission.py) and exactly that container's hand-out
  (services/node_agent/isolation.py). An Allocate that cannot be resolved fails with a
  message the kubelet puts on the pod; it never hands over another pod's grant.
- ``GetPreferredAllocation``: any IDs (the placement was decided by the allocator, and
  the IDs carry no meaning beyond their count); offered only where server.py's
  ``ResourceServer.options`` says.
- ``PreStartContainer``: nothing to do.

The :class:`Desk` is shared by every resource's server: the agent's
``allocation.bound`` events come in, Allocate calls wait there for theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import grpc
import grpc.aio

from services.node_agent.admission import Admissions, AmbiguousError, Match
from services.node_agent.deviceplugin import api_pb2 as pb
from services.node_agent.isolation import Handout, HandoutError, handout
from services.node_agent.resources import CountResource
from shared.config import Config
from shared.core.admission import Channel
from shared.core.model import ContainerGrant, DeviceInfo, DeviceUUID, NodeName, PodRef, PodUID

log = logging.getLogger(__name__)


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
        """A pod bound to this node with its grants: the Allocate calls waiting look again."""
        self.admissions.bound(pod, grants)
        async with self._changed:
            self._changed.notify_all()

    def gone(self, uid: PodUID) -> None:
        """A pod released or deleted: no Allocate is for it any more."""
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


def to_proto(h: Handout) -> pb.ContainerAllocateResponse:
    """A container's hand-out as the kubelet's Allocate answer for that container."""
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
class AllocationServicer:
    """The allocation RPCs of one resource's device plugin, and what they read; server.py's
    ``ResourceServer`` is one, and serves them."""

    cfg: Config
    node: NodeName
    resource: CountResource
    desk: Desk
    devices: Callable[[], Mapping[DeviceUUID, DeviceInfo]]
    on_admitted: Callable[[PodRef], Awaitable[None]]
    record: Callable[[str, str], None] = lambda _resource, _result: None
    """Counts each Allocate answered: (resource, result)."""

    async def get_preferred_allocation(
        self, request: pb.PreferredAllocationRequest, _context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        """The IDs the kubelet must include, then any others, as many as it asks."""
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
        """Each container's hand-out, for the pod it is for (the module docstring); the
        call is refused with the reason when one container's cannot be resolved."""
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
        """Nothing to do before a container starts (not asked for in the options)."""
        return pb.PreStartContainerResponse()
