"""The node agent as the kubelet's DRA driver: registration, prepare and unprepare, and
the node's ResourceSlice.

- **Registration**: the kubelet's plugin watcher finds ``<driver>-reg.sock`` in its
  ``plugins_registry`` directory and calls ``GetInfo`` on it: a ``DRAPlugin`` named
  after the driver, its service on ``<pluginsDir>/<driver>/dra.sock``, speaking
  ``v1.DRAPlugin`` (the one version served here; the 1.36 kubelet takes the first it
  knows of the list). ``NotifyRegistrationStatus`` tells whether it took it: the slice is
  published then (the kubelet deletes a node's slices when it starts, and a driver's
  when it goes away), and again whenever the inventory changes.
- **NodePrepareResources**: each claim prepared by services/node_agent/dra/prepare.py
  (its allocation read, its devices' hand-out written as a CDI spec, the CDI IDs
  answered; idempotent across restarts).
- **NodeUnprepareResources**: the claim's spec is removed (already gone: done).

Every claim of a request is answered: one that cannot be prepared carries its error,
the others are prepared all the same. Calls are served one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from kubernetes_asyncio.client import ApiException

from services.node_agent.dra import api_pb2 as pb
from services.node_agent.dra import cdi
from services.node_agent.dra import registration_pb2 as reg
from services.node_agent.dra.prepare import ClaimReader, Driver, message, prepare, read_claim
from services.node_agent.dra.slices import resource_slice, slice_name
from shared import kube
from shared.config import Config
from shared.core.model import DeviceInfo, NodeName

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SERVICE_VERSIONS = ("v1.DRAPlugin",)
"""The DRA gRPC services served, most preferred first (the kubelet of 1.36 knows
``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``; only v1 is implemented)."""
RETRY_S = 2.0
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_WRITE_FAILED: tuple[type[Exception], ...] = (*kube.UNREACHABLE, ApiException)
"""A write to the API server that failed: out of reach, or refused."""


class DraPlugin:
    """The DRA driver of one node: its sockets, its claims' CDI specs, its slice."""

    def __init__(
        self,
        cfg: Config,
        node: NodeName,
        api: kube.Client | None,
        devices: Callable[[], tuple[DeviceInfo, ...]],
    ) -> None:
        dra = cfg.node_agent.dra
        self.cfg, self.node, self.api, self.devices = cfg, node, api, devices
        self.driver = dra.driver_name
        self.endpoint = Path(dra.plugins_dir) / self.driver / "dra.sock"
        self.registration = Path(dra.registry_dir) / f"{self.driver}-reg.sock"
        self.cdi_dir = Path(dra.cdi_dir)
        self.server: grpc.aio.Server | None = None
        self.registered = asyncio.Event()
        """The kubelet took the registration (``NotifyRegistrationStatus``)."""
        self.registrations = 0
        self.published = 0
        """ResourceSlice writes that succeeded (tests wait on it)."""
        self._lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._last: dict[str, Any] | None = None
        self.read_claim: ClaimReader = functools.partial(read_claim, api)

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Serve the DRA service and the registration service on fresh sockets (the
        kubelet's plugin watcher then registers the driver)."""
        await self.stop()
        for path in (self.endpoint, self.registration):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(self._handlers())
        server.add_insecure_port(f"unix://{self.endpoint}")
        server.add_insecure_port(f"unix://{self.registration}")
        await server.start()
        self.server = server
        log.info(
            "DRA driver %s serving on %s (registration %s)",
            self.driver,
            self.endpoint,
            self.registration,
        )

    async def stop(self) -> None:
        """Stop serving and remove the registration socket, so the kubelet unregisters
        the driver (its slices then go after the kubelet's grace period)."""
        if self.server is not None:
            await self.server.stop(grace=0.5)
            self.server = None
            self.registration.unlink(missing_ok=True)

    async def supervise(self, interval_s: float = 1.0) -> None:
        """Serve again when a socket was removed (a kubelet that cleaned its directories)."""
        while True:
            await asyncio.sleep(interval_s)
            if self.endpoint.exists() and self.registration.exists():
                continue
            log.info("DRA socket of %s gone: serving again", self.driver)
            try:
                await self.start()
            except OSError as exc:
                log.warning("serving DRA driver %s failed (%s); retrying", self.driver, exc)

    def changed(self) -> None:
        """The inventory changed: the slice is published again (once registered)."""
        self._dirty.set()

    async def publisher(self) -> None:
        """Keep the node's ResourceSlice as the inventory says, from the first
        registration on; retry while the API server refuses or is away."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if not self.registered.is_set() or self.api is None:
                continue
            try:
                await self.publish()
            except _WRITE_FAILED as exc:
                log.warning(
                    "publishing the ResourceSlice of %s failed (%s); retrying", self.node, exc
                )
                await asyncio.sleep(RETRY_S)
                self._dirty.set()

    # --- the ResourceSlice --------------------------------------------------------------

    async def publish(self, force: bool = False) -> None:
        """Create or update the node's ResourceSlice; an update bumps the pool's
        generation. Nothing is written when the devices are as last written."""
        assert self.api is not None
        body = resource_slice(self.cfg, self.node, self.devices(), generation=1)
        if not force and self._last == body["spec"]["devices"]:
            return
        path = f"{SLICES}/{slice_name(self.cfg, self.node)}"
        try:
            current = await kube.request(self.api, "GET", path)
        except ApiException as exc:
            if exc.status != 404:
                raise
            current = None
        if current is None:
            await kube.request(self.api, "POST", SLICES, body)
        else:
            pool = current["spec"]["pool"]
            body["spec"]["pool"]["generation"] = int(pool.get("generation", 0)) + 1
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await kube.request(self.api, "PUT", path, body)
        self._last = body["spec"]["devices"]
        self.published += 1
        log.info(
            "ResourceSlice %s: %d devices (pool %s generation %d)",
            body["metadata"]["name"],
            len(body["spec"]["devices"]),
            self.node,
            body["spec"]["pool"]["generation"],
        )

    async def delete_slices(self) -> int:
        """Delete every ResourceSlice of this driver for this node (the node offers its
        devices through the device plugin now); how many were deleted."""
        assert self.api is not None
        items, _ = await kube.list_all(
            self.api,
            SLICES,
            {"fieldSelector": f"spec.nodeName={self.node},spec.driver={self.driver}"},
        )
        for item in items:
            with contextlib.suppress(ApiException):
                await kube.request(self.api, "DELETE", f"{SLICES}/{item['metadata']['name']}")
        self._last = None
        return len(items)

    # --- gRPC services ----------------------------------------------------------------

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        def unary(method: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                method,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        return (
            grpc.method_handlers_generic_handler(
                "pluginregistration.Registration",
                {
                    "GetInfo": unary(self.get_info, reg.InfoRequest, reg.PluginInfo),
                    "NotifyRegistrationStatus": unary(
                        self.notify_registration_status,
                        reg.RegistrationStatus,
                        reg.RegistrationStatusResponse,
                    ),
                },
            ),
            grpc.method_handlers_generic_handler(
                "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
                {
                    "NodePrepareResources": unary(
                        self.node_prepare_resources,
                        pb.NodePrepareResourcesRequest,
                        pb.NodePrepareResourcesResponse,
                    ),
                    "NodeUnprepareResources": unary(
                        self.node_unprepare_resources,
                        pb.NodeUnprepareResourcesRequest,
                        pb.NodeUnprepareResourcesResponse,
                    ),
                },
            ),
        )

    async def get_info(self, _request: reg.InfoRequest, _context: Any) -> reg.PluginInfo:
        """Who this plugin is: a DRA driver, its name, its endpoint, its versions."""
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SERVICE_VERSIONS),
        )

    async def notify_registration_status(
        self, request: reg.RegistrationStatus, _context: Any
    ) -> reg.RegistrationStatusResponse:
        """The kubelet's verdict: registered (publish the slice, again: it may have
        deleted it), or refused with its reason."""
        if request.plugin_registered:
            self.registrations += 1
            self.registered.set()
            self._last = None
            self._dirty.set()
            log.info("the kubelet registered DRA driver %s", self.driver)
        else:
            log.error("the kubelet refused DRA driver %s: %s", self.driver, request.error)
        return reg.RegistrationStatusResponse()

    async def node_prepare_resources(
        self, request: pb.NodePrepareResourcesRequest, _context: Any
    ) -> pb.NodePrepareResourcesResponse:
        """Prepare every claim (the module docstring); each is answered."""
        out = pb.NodePrepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                answer = out.claims[claim.uid]
                try:
                    answer.devices.extend(await self.prepare(claim))
                except Exception as exc:  # every claim is answered, whatever went wrong
                    answer.error = message(claim, exc)
                    log.error("NodePrepareResources: %s", answer.error)
        return out

    async def node_unprepare_resources(
        self, request: pb.NodeUnprepareResourcesRequest, _context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        """Remove every claim's CDI spec; each is answered."""
        out = pb.NodeUnprepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                answer = out.claims[claim.uid]
                try:
                    path = cdi.spec_path(self.cdi_dir, self.driver, claim.uid)
                    await asyncio.to_thread(path.unlink, missing_ok=True)
                    log.info("unprepared claim %s/%s (%s)", claim.namespace, claim.name, claim.uid)
                except Exception as exc:  # every claim is answered
                    answer.error = message(claim, exc)
                    log.error("NodeUnprepareResources: %s", answer.error)
        return out

    # --- one claim ----------------------------------------------------------------------

    async def prepare(self, claim: pb.Claim) -> list[pb.Device]:
        """Prepare one claim (services/node_agent/dra/prepare.py)."""
        driver = Driver(self.cfg, self.node, self.driver, self.cdi_dir, self.devices())
        return await prepare(driver, claim, self.read_claim)

    def spec_of(self, claim_uid: str) -> Path:
        """The CDI spec file of a claim (prepared or not)."""
        return cdi.spec_path(self.cdi_dir, self.driver, claim_uid)
