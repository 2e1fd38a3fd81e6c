"""The node agent of one real node: inventory out, kubelet device plugin in.

It reads the node's devices from its source (NVML, npu-smi, or a fixed list), publishes
them (event and inventory KV, with ``device_plugin`` set so the allocator keeps
admission keys unique here), serves one device plugin per count resource, and learns
the grants of the pods bound here from ``tessera.v1.allocation.bound.<node>``: an
``Allocate`` hands each container exactly its grant, and the last one for a pod
publishes ``allocation.admitted``. Health is re-read every ``healthIntervalS`` and at
once on an NVML XID event; a changed inventory is published and streamed to the kubelet.
Cards in ``mps`` mode: the agent reads each one's MPS control daemon (run by the node's
MPS supervisor, never by the agent: services/node_agent/mps/) and the inventory carries
its state and client count (published again when they change).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from pathlib import Path

from kubernetes_asyncio.client import ApiException

from services.node_agent.admission import KUBELET_CHECKPOINT, admitted_in_checkpoint
from services.node_agent.deviceplugin.allocation import Desk
from services.node_agent.deviceplugin.server import ResourceServer
from services.node_agent.dra.plugin import DraPlugin
from services.node_agent.inventory import InventorySource
from services.node_agent.metrics import NodeMetrics
from services.node_agent.mig import MigDriver, MigError, NvmlMig, changes_for, reconfigure
from services.node_agent.mps import mps_cards
from services.node_agent.mps.reader import MpsReader, with_state
from services.node_agent.nvml import NvmlSource
from services.node_agent.resources import count_resources
from shared import events as ev
from shared import kube
from shared.config import grant_key
from shared.core import annotations as ann
from shared.core.model import ContainerGrant, DeviceInfo, DeviceUUID, NodeName, PodRef, PodUID
from shared.runtime import Runtime

log = logging.getLogger(__name__)

LISTED_WAIT_S = 5.0
"""How long a starting agent waits for the kubelet to take its device IDs before it
publishes its inventory anyway (a kubelet that never asks must not keep the node out)."""

_LIST_FAILED: tuple[type[Exception], ...] = (*kube.UNREACHABLE, ApiException)
"""A list of the node's pods that failed: the API server unreachable, or refusing."""


def consumer_name(node: NodeName) -> str:
    """The durable consumer of ``node``'s agent: ``node-agent-<node>``, with each character a NATS
    name may not hold replaced by ``_``."""
    return "node-agent-" + re.sub(r"[^A-Za-z0-9_-]", "_", node)


class Agent:
    """The agent of one real node: owns its inventory, device plugins and the grants bound here."""

    def __init__(self, rt: Runtime, node: NodeName, source: InventorySource) -> None:
        self.rt = rt
        self.node = node
        self.source = source
        self.devices: tuple[DeviceInfo, ...] = ()
        self.desk = Desk()
        self.servers: dict[str, ResourceServer] = {}
        self.dra: DraPlugin | None = None
        """The DRA driver, on a node whose ``deviceApi`` is ``dra`` (no device plugin then)."""
        self.seq = 0
        self.agent = f"{socket.gethostname()}/{type(source).__name__}"
        self._dirty = asyncio.Event()
        self.pods: dict[PodUID, PodRef] = {}
        """Pods admitted here (their containers' metrics carry their names)."""
        self.held: dict[PodUID, tuple[ContainerGrant, ...]] = {}
        """The grants of the pods bound here (a MIG card one of them uses is not cut)."""
        self.mig: MigDriver | None = (
            NvmlMig(source.nvml) if isinstance(source, NvmlSource) else None
        )
        self.mps = MpsReader(rt.cfg.node_agent.mps, node)
        """The state of each card's MPS control daemon (cards in mps mode)."""
        self.metrics = NodeMetrics(
            rt.metrics,
            node,
            lambda: self.devices,
            source.usage,
            Path(rt.cfg.node_agent.isolation.cache_host_dir),
            lambda: self.pods,
            lambda: len(self.desk.admissions.waiting),
        )

    async def start(self, api: kube.Client | None = None) -> None:
        """Read the devices, recover what a previous run knew, publish, serve. The
        service's consumer of binds exists already, so none published meanwhile is lost."""
        await asyncio.to_thread(self.prepare_host)
        self.devices = await self._read()
        await self.mps.start()  # read the MPS daemons before the first publish
        self.devices = with_state(self.devices, self.mps.state())
        if api is not None:
            await self.recover(api)
            self.desk.foreign = lambda resource, count: self.foreign(api, resource, count)
        if self.rt.cfg.device_api(self.node) == "dra":
            await self._serve_dra(api)
        else:
            # The kubelet first, then the scheduler: a pod placed here before the kubelet
            # has this node's device IDs would fail its admission for good.
            await self._serve()
            await self._kubelet_listed()
            if api is not None:
                self.rt.spawn(self._withdraw_dra(api), "withdraw-dra", finite=True)
        await self._publish()
        if isinstance(self.source, NvmlSource):
            loop = asyncio.get_running_loop()

            def changed() -> None:  # in NVML's event thread
                loop.call_soon_threadsafe(self._dirty.set)

            self.source.watch_health(changed)
        self.rt.spawn(self.mps.supervise(self._mps_changed), "mps")
        log.info(
            "node agent for %s: %d devices, serving %s",
            self.node,
            len(self.devices),
            ", ".join(self.servers) or ("DRA" if self.dra else "no resources"),
        )

    async def _serve_dra(self, api: kube.Client | None) -> None:
        """Offer the devices through DRA (services/node_agent/dra/plugin.py): serve the
        driver, publish its slice once the kubelet registered it, follow the inventory."""
        dra = DraPlugin(self.rt.cfg, self.node, api, lambda: self.devices)
        self.dra = dra
        self.rt.on_stop(dra.stop)
        await dra.start()
        self.rt.spawn(dra.publisher(), "dra-slices")
        self.rt.spawn(dra.supervise(), "dra-plugin")

    async def _withdraw_dra(self, api: kube.Client) -> None:
        """The node offers its devices through the device plugin: the slices a former
        DRA run of this agent published go (one card is never offered through both)."""
        try:
            gone = await DraPlugin(self.rt.cfg, self.node, api, lambda: ()).delete_slices()
        except _LIST_FAILED as exc:
            log.warning("cannot delete this node's DRA ResourceSlices (%s)", exc)
            return
        if gone:
            log.info(
                "deleted %d DRA ResourceSlice(s) of %s: it uses the device plugin", gone, self.node
            )

    async def _kubelet_listed(self) -> None:
        """Wait (up to ``LISTED_WAIT_S``) until the kubelet has the device IDs of every
        resource registered with it (docs/architecture.md, "A real node")."""
        waits = [s.listed.wait() for s in self.servers.values() if s.registrations]
        if not waits:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*waits), LISTED_WAIT_S)
        except TimeoutError:
            log.warning(
                "the kubelet has not asked for the device IDs within %.0f s: publishing "
                "the inventory anyway",
                LISTED_WAIT_S,
            )

    async def recover(self, api: kube.Client) -> None:
        """What a restarted agent knew: the grants of the pods bound here (their events
        were consumed before), from the API server; the ones the kubelet has not given
        devices yet (its checkpoint says which it has) wait for their Allocate again."""
        items, _ = await kube.list_all(
            api, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node}"}
        )
        path = Path(self.rt.cfg.node_agent.device_plugin_dir) / KUBELET_CHECKPOINT
        try:
            text = await asyncio.to_thread(path.read_text, encoding="utf-8")
        except OSError:
            text = ""
        except UnicodeDecodeError as exc:
            log.warning("%s is not UTF-8 (%s): read as no checkpoint", path, exc.reason)
            text = ""
        allocated = admitted_in_checkpoint(text) if text else set()
        if allocated is None:
            log.warning("%s is not a kubelet checkpoint: read as none", path)
        waiting = 0
        key = grant_key(self.rt.cfg)
        for obj in items:
            meta, status = obj["metadata"], obj.get("status") or {}
            annotations = meta.get("annotations") or {}
            grants = ann.read_grants(annotations)
            if grants is None or status.get("phase") in ("Succeeded", "Failed"):
                continue
            pod = kube.pod_ref(obj)
            if not ann.signed(key, pod.uid, self.node, grants, annotations.get(ann.SIGNATURE, "")):
                log.warning("pod %s: its grant is not signed by Tessera; it gets no device", pod)
                continue
            self.held[pod.uid] = grants
            started = bool(status.get("containerStatuses") or status.get("initContainerStatuses"))
            if started or (allocated is not None and pod.uid in allocated):
                self.pods[pod.uid] = pod
            else:
                await self.desk.bound(pod, grants)
                waiting += 1
        log.info(
            "recovered %d pods bound here, %d waiting for the kubelet", len(self.held), waiting
        )

    async def foreign(self, api: kube.Client, resource: str, count: int) -> list[str]:
        """The pods bound here without a grant of Tessera's, not started yet, with a
        container asking ``count`` of ``resource`` (the kubelet would call Allocate for
        them too: docs/architecture.md, "A real node"). An unreadable API server counts
        as none (the grant rules alone then decide)."""
        try:
            items, _ = await kube.list_all(
                api, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node}"}
            )
        except _LIST_FAILED as exc:
            log.warning("cannot list the pods bound here (%s): foreign pods not checked", exc)
            return []
        found = []
        for obj in items:
            meta, status = obj["metadata"], obj.get("status") or {}
            if ann.read_grants(meta.get("annotations") or {}) is not None:
                continue
            if status.get("phase", "Pending") != "Pending" or status.get("containerStatuses"):
                continue
            spec = obj.get("spec") or {}
            containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
            for c in containers:
                res = c.get("resources") or {}
                asked = (res.get("limits") or {}).get(
                    resource, (res.get("requests") or {}).get(resource)
                )
                if asked is not None and str(asked) == str(count):
                    found.append(f"pod {meta.get('namespace')}/{meta.get('name')}")
                    break
        return found

    def prepare_host(self) -> None:
        """The host side of the isolation library: the file mounted over a container's
        ``/etc/ld.so.preload`` names the library, and the accounting directory exists."""
        iso = self.rt.cfg.node_agent.isolation
        preload = Path(iso.preload_host_path)
        wanted = iso.library_container_path + "\n"
        try:
            Path(iso.cache_host_dir).mkdir(parents=True, exist_ok=True)
            if not preload.exists() or preload.read_text() != wanted:
                preload.parent.mkdir(parents=True, exist_ok=True)
                preload.write_text(wanted)
        except OSError as exc:  # not mounted (a dry run): containers get no preload file
            log.warning("cannot prepare the isolation files on the host: %s", exc)
        if not Path(iso.library_host_path).exists():
            log.warning(
                "%s is missing: containers would run without memory and core limits",
                iso.library_host_path,
            )

    async def bound(self, event: ev.AllocationBound) -> None:
        """A pod was bound here: its Allocate calls will get this grant."""
        await self._cut_mig(event)
        self.held[event.pod.uid] = event.grants
        await self.desk.bound(event.pod, event.grants)

    def released(self, event: ev.AllocationReleased) -> None:
        """A pod of this node is gone: no Allocate is matched to it, its metrics lose its name and
        its grant no longer keeps a MIG card from being cut."""
        self.desk.gone(event.pod.uid)
        self.pods.pop(event.pod.uid, None)
        self.held.pop(event.pod.uid, None)

    async def _cut_mig(self, bound: ev.AllocationBound) -> None:
        """Dynamic MIG: cut the cards this pod's grant needs into its geometry first.
        A card that may not be changed is logged; the pod's Allocate then fails, with
        the reason, rather than handing over another instance."""
        others = [g for uid, g in self.held.items() if uid != bound.pod.uid]
        wanted = changes_for(bound.grants, self.by_uuid(), others)
        if not wanted:
            return
        if self.mig is None:
            log.error("%s needs MIG instances this node's source cannot create", bound.pod)
            return
        changed = False
        for change in wanted:
            try:
                changed |= await asyncio.to_thread(
                    reconfigure,
                    self.mig,
                    change.card,
                    change.geometry,
                    self.rt.cfg.devices.nvidia,
                    change.model,
                    change.in_use,
                )
            except MigError as exc:
                log.error("MIG for %s on %s: %s", bound.pod, change.card, exc)
        if changed:  # the new instances' UUIDs: read, publish, stream
            self.devices = await self._read()
            await self._publish()
            await self._serve()

    async def admitted(self, pod: PodRef) -> None:
        """The kubelet took the last container of ``pod``: its metrics carry its name now, and
        ``allocation.admitted`` lets the next pod of its admission key bind here."""
        self.pods[pod.uid] = pod
        await self.rt.bus.publish(ev.AllocationAdmitted(pod=pod, node=self.node))

    def _count(self, resource: str, result: str) -> None:
        self.metrics.allocations.add(1, {"resource": resource, "result": result})

    def by_uuid(self) -> dict[DeviceUUID, DeviceInfo]:
        """The node's devices as last read, by UUID."""
        return {d.uuid: d for d in self.devices}

    async def _serve(self) -> None:
        """A device plugin per count resource; new resources get one, changed ones
        stream their new device list. On a DRA node, the slice follows instead."""
        if self.dra is not None:
            self.dra.changed()
            return
        for resource in count_resources(self.rt.cfg, self.node, self.devices):
            server = self.servers.get(resource.name)
            if server is not None:
                await server.update(resource)
                continue
            server = ResourceServer(
                self.rt.cfg,
                self.node,
                resource,
                self.desk,
                self.by_uuid,
                self.admitted,
                self._count,
            )
            self.servers[resource.name] = server
            self.rt.on_stop(server.stop)
            try:
                await server.start()
            except Exception as exc:  # the kubelet may not be up: supervise retries
                log.warning("device plugin %s not registered yet: %s", resource.name, exc)
            self.rt.spawn(server.supervise(), f"device-plugin {resource.name}")

    async def _read(self) -> tuple[DeviceInfo, ...]:
        """The devices as published: read from the source, the cards in mps mode with
        their MPS daemon's state (the reader learns the cards now in mps mode)."""
        devices = await asyncio.to_thread(self.source.read)
        self.mps.set_cards(mps_cards(self.rt.cfg, self.node, devices))
        return with_state(devices, self.mps.state())

    async def _mps_changed(self) -> None:
        """An MPS daemon's state or client count changed: publish them."""
        devices = with_state(self.devices, self.mps.state())
        if devices != self.devices:
            self.devices = devices
            await self._publish()

    def _report(self) -> ev.NodeInventory:
        self.seq += 1
        return ev.NodeInventory(
            node=self.node,
            devices=self.devices,
            config_hash=self.rt.config_hash,
            agent=self.agent,
            seq=self.seq,
            device_plugin=self.dra is None,
            dra=self.dra is not None,
        )

    async def _publish(self) -> None:
        report = self._report()
        await self.rt.bus.put_inventory(report)
        await self.rt.bus.publish(report)

    async def health_loop(self) -> None:
        """Re-read the devices every ``healthIntervalS``, and at once when NVML reports."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._dirty.wait(), timeout=self.rt.cfg.node_agent.health_interval_s
                )
            self._dirty.clear()
            devices = await self._read()
            log.debug(
                "devices re-read: %d, %d unhealthy",
                len(devices),
                sum(not d.healthy for d in devices),
            )
            if devices == self.devices:
                continue
            sick = sorted(d.uuid for d in devices if not d.healthy)
            log.warning("inventory of %s changed (unhealthy: %s)", self.node, sick or "none")
            self.devices = devices
            await self._publish()
            await self._serve()

    async def heartbeat(self) -> None:
        """Re-put the inventory in the KV every ``scheduler.heartbeatS`` (unchanged, its ``seq``
        advanced): the central services' reconciliation reads it."""
        while True:
            await asyncio.sleep(self.rt.cfg.scheduler.heartbeat_s)
            await self.rt.bus.put_inventory(self._report())
