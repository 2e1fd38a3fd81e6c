"""The watcher: the API server's pods, nodes and Volcano objects, turned into typed events.

Every pod: a pending pod of our schedulers (``scheduler.names``) has its request parsed
and validated here, once; a valid one becomes ``PodPending`` with its node-fit spec
(re-announced every ``resync_s`` so nothing is forgotten, and at once when a coordinator
asks on ``tessera.ctl.resync``); an invalid one gets a ``FailedScheduling`` Event and a
``PodScheduled=False`` condition naming the field, and ``PodRejected``. A pod with
``spec.schedulingGates`` is neither parsed nor announced nor told anything while gated
(kube-scheduler's SchedulingGates; the API server gave it the ``SchedulingGated``
condition at creation), and is announced the moment an update removes its last gate
(gates can only be removed after creation, so a pod once announced is never gated). A
pod on a node, whoever placed it, becomes ``PodUpdated`` with its spec (its requests,
ports and labels count on that node) and any grant read from its annotations; a deleted
or finished one ``PodDeleted``. Nodes: ``NodeUpdated`` with their spec and cordoned
devices, and deletions. A pending pod that claims volumes or DRA ResourceClaims is
announced with what they allow, and again when they change (claims.py).

This module owns the service: what each pod and node means, and the wiring. Beside it:
the list-watch of every pod, pending ones first at a start (pods.py); how an object
reads as an event (translate.py); namespaces, PodGroups, Queues and Jobs, one generic
mirror each (mirrors.py); PodDisruptionBudgets and what each allows now, as
``PdbUpdated`` (budgets.py).

Each pending announcement opens the root span of one scheduling attempt; the bus carries
it through coordinator, allocator and binder.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Coroutine
from typing import Any

import msgspec
from nats.aio.msg import Msg

from services.watcher.budgets import BudgetWatch
from services.watcher.claims import ClaimReader
from services.watcher.mirrors import Mirrors
from services.watcher.pods import PodWatch
from services.watcher.translate import (
    TERMINAL,
    UNREADABLE,
    object_name,
    pending_event,
    updated_event,
    volcano_job,
)
from shared import events as ev
from shared import kube
from shared.bus import Outbox
from shared.config import request_parser
from shared.core import annotations as ann
from shared.core.hosts import PodSpec, node_spec, pod_spec
from shared.core.model import NodeName, PodRef, PodRequest, PodUID, RequestError
from shared.core.request import rejection
from shared.runtime import Runtime, Service
from shared.telemetry import span

log = logging.getLogger(__name__)

INVALID = kube.Condition("PodScheduled", "False", "InvalidRequest")
SHAPES = 65536
"""The most pod shapes kept parsed (``Watcher._spec``); past it they are parsed afresh."""

_ENCODE = msgspec.json.Encoder().encode


class Watcher(Service):
    """The only service that watches the API server; owns no state others need."""

    NAME = "watcher"

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        self.parser = request_parser(rt.cfg)
        self.names = set(rt.cfg.scheduler.names)
        self.managed = frozenset(self.parser.table.by_name)
        """Tessera's device resource names: the device families fit them, not NodeResourcesFit."""
        self.pending: dict[PodUID, ev.PodPending] = {}
        """Our pods waiting for placement."""
        self.bound: dict[PodUID, tuple[NodeName, PodSpec]] = {}
        """Every pod on a node, as last announced."""
        self.specs: dict[PodUID, tuple[bytes, PodSpec]] = {}
        """Each pod's last :func:`pod_spec` and a digest of what it read (``_spec``)."""
        self.shapes: dict[bytes, PodSpec] = {}
        """:func:`pod_spec` by that digest: pods of one shape share it (``_spec``)."""
        self.rejected: dict[PodUID, str] = {}
        self.gated: set[PodUID] = set()
        """Our pending pods waiting for their scheduling gates to be removed."""
        rt.metrics.gauge(
            "tessera_gated_pods",
            "Pending pods of Tessera's schedulers held by their scheduling gates.",
            lambda: [(float(len(self.gated)), {})],
        )
        self.refs: dict[PodUID, PodRef] = {}
        """Every pod announced (pending or on a node): a relist that lacks one deletes it."""
        self.job_of: dict[PodUID, str] = {}
        """The Volcano Job of each announced pod that has one (its deletion names it)."""
        self.nodes: dict[str, ev.NodeUpdated] = {}
        self.pods = PodWatch(self.on_pod_event, self._listed, self.pending, self.bound)
        """Every pod listed and watched, the pending ones first at a start (pods.py)."""
        self.out = Outbox(rt.bus)
        """Everything it announces, in the order seen, pipelined (shared/bus.py)."""
        self.claims = ClaimReader(api, rt.spawn, self.pending, self._announce, self.out.put)
        """What our pending pods' volumes and resource claims allow (claims.py)."""
        publish = self.out.put
        self.budgets = BudgetWatch(publish)
        """PodDisruptionBudgets and the pods they count (budgets.py)."""
        self.mirrors = Mirrors.publishing(publish)
        """Namespaces, PodGroups, Queues, Jobs and HyperNodes (mirrors.py)."""

    async def start(self) -> None:
        """Answer the coordinators' resync requests (``tessera.ctl.resync``), publish what is queued
        at a stop, and start looking for Volcano's CRDs."""
        self.rt.on_stop(self.flush)
        await self.rt.bus.nc.subscribe(ev.CONTROL_RESYNC_SUBJECT, cb=self.on_resync_request)
        self.rt.spawn(
            self.mirrors.watch_volcano(self.api, self.rt.spawn), "discover-volcano", finite=True
        )
        self.rt.spawn(
            self.mirrors.watch_topology(self.api, self.rt.spawn), "discover-topology", finite=True
        )
        log.info(
            "watching every pod and node; placing the pods of schedulers %s",
            ", ".join(self.rt.cfg.scheduler.names),
        )

    async def flush(self) -> None:
        """At a stop, publish what is still queued; not once the lease is lost or while
        it is paused: another watcher may be publishing already (it relists, and
        announces it all again)."""
        if self.rt.acting:
            await self.out.flush()

    def tasks(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The publisher, the watches of pods, Nodes, namespaces and PodDisruptionBudgets, and the
        periodic resync."""
        return {
            "publish": self.out.run(),
            "watch-pods": self.pods.watch(self.api),
            "watch-nodes": kube.list_watch(
                self.api, "/api/v1/nodes", self.on_node, on_relist=self.on_node_relist
            ),
            "watch-namespaces": self.mirrors.watch_namespaces(self.api),
            "watch-pdbs": self.budgets.watch(self.api),
            "resync": self.resync_loop(),
        }

    # --- pods -------------------------------------------------------------------------

    def _spec(self, uid: PodUID, obj: dict[str, Any]) -> PodSpec:
        """``pod_spec(obj)``, kept per pod while what it reads (labels, deletion and the
        spec but for ``nodeName``) is unchanged: a pod's binding and each of its status
        updates then cost a digest of those fields, not a parse of its containers,
        affinity and spread. Pods of one shape (those fields and the namespace: the pods
        of one ReplicaSet) share one parse (``shapes``): a list of every pod parses each
        shape once."""
        meta = obj["metadata"]
        spec = obj.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        read = (meta.get("namespace"), meta.get("labels"), meta.get("deletionTimestamp"))
        rest = {k: v for k, v in spec.items() if k != "nodeName"}
        digest = hashlib.blake2b(_ENCODE((read, rest)), digest_size=16).digest()
        kept = self.specs.get(uid)
        host = kept[1] if kept is not None and kept[0] == digest else self.shapes.get(digest)
        if host is None:
            if len(self.shapes) >= SHAPES:
                self.shapes.clear()
            host = self.shapes[digest] = pod_spec(obj, self.managed)
        if host.node_name != node:
            host = msgspec.structs.replace(host, node_name=node)
        self.specs[uid] = (digest, host)
        return host

    async def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        """Every pod of the cluster: ours while pending (placed by Tessera), and every
        pod on a node (its requests, ports and labels count there, whoever placed it)."""
        ref = kube.pod_ref(obj)
        meta = obj["metadata"]
        spec = obj.get("spec") or {}
        phase = (obj.get("status") or {}).get("phase", "Pending")
        node = spec.get("nodeName") or None
        if kind == "DELETED" or phase in TERMINAL:
            grants = ann.read_grants(meta.get("annotations") or {}) or ()
            finished = phase if phase in TERMINAL else ""
            await self._gone(ref, node, grants, finished, kind, volcano_job(meta))
            return
        ours = spec.get("schedulerName", "default-scheduler") in self.names
        job = volcano_job(meta)
        if node:
            self._track(ref, job)
            self.pending.pop(ref.uid, None)
            self.pods.settled(ref.uid)
            self.claims.forget(ref.uid)
            host = self._spec(ref.uid, obj)
            if self.bound.get(ref.uid) != (node, host):
                self.bound[ref.uid] = (NodeName(node), host)
                await self.out.put(updated_event(obj, ref, NodeName(node), phase, host))
            return
        if not ours or meta.get("deletionTimestamp"):
            return
        if spec.get("schedulingGates"):
            self.gated.add(ref.uid)  # not placed, not told: announced once ungated
            return
        self.gated.discard(ref.uid)
        self._track(ref, job)
        parsed = self.parser.parse(obj)
        if not isinstance(parsed, PodRequest):
            await self._reject(ref, parsed)
            return
        self.rejected.pop(ref.uid, None)
        pending = self.claims.attach(pending_event(obj, ref, parsed, self._spec(ref.uid, obj)), obj)
        if pending is None:  # the objects it claims are being listed: announced then
            self.pending.pop(ref.uid, None)
            return
        previous = self.pending.get(ref.uid)
        self.pending[ref.uid] = pending
        if previous is None or (previous.request, previous.group, previous.spec) != (
            pending.request,
            pending.group,
            pending.spec,
        ):
            await self._announce(pending)

    def _track(self, ref: PodRef, job: str) -> None:
        """Remember an announced pod (and its Job: its deletion names it)."""
        self.refs[ref.uid] = ref
        if job:
            self.job_of[ref.uid] = job

    async def _announce(self, pending: ev.PodPending) -> None:
        with span(f"schedule {pending.pod}") as current:
            current.set_attribute("tessera.service", self.rt.service)
            current.set_attribute("k8s.pod.name", pending.pod.name)
            current.set_attribute("k8s.namespace.name", pending.pod.namespace)
            current.set_attribute("k8s.pod.uid", pending.pod.uid)
            await self.out.put(pending)

    async def _gone(
        self,
        ref: PodRef,
        node: str | None,
        grants: tuple[Any, ...],
        phase: str = "",
        kind: str = "DELETED",
        job: str = "",
    ) -> None:
        known = any(ref.uid in held for held in (self.refs, self.pending, self.bound, self.gated))
        self.pending.pop(ref.uid, None)
        self.pods.settled(ref.uid)
        self.rejected.pop(ref.uid, None)
        self.gated.discard(ref.uid)
        self.refs.pop(ref.uid, None)
        self.specs.pop(ref.uid, None)
        self.claims.forget(ref.uid)
        job = self.job_of.pop(ref.uid, "") or job
        was = self.bound.pop(ref.uid, None)
        # A finished pod seen for the first time (a relist) held nothing here.
        if known or (node and kind == "DELETED"):
            await self.out.put(
                ev.PodDeleted(
                    pod=ref,
                    node=NodeName(node) if node else (was[0] if was else None),
                    grants=grants,
                    phase=phase,
                    job=job,
                )
            )

    async def _reject(self, ref: PodRef, errors: tuple[RequestError, ...]) -> None:
        message = rejection(errors)
        self.pending.pop(ref.uid, None)
        self.pods.settled(ref.uid)
        if self.rejected.get(ref.uid) == message:
            return
        self.rejected[ref.uid] = message
        log.info("pod %s rejected: %s", ref, message)  # its user is told, on the pod
        await self.out.put(ev.PodRejected(pod=ref, errors=errors))
        await kube.tell(
            self.api,
            ref,
            reason="FailedScheduling",
            kind="Warning",
            message=message,
            component="tessera-watcher",
            condition=INVALID,
        )

    async def _listed(self, present: set[PodUID]) -> None:
        """A full list read: the pods known here that it lacks were deleted meanwhile."""
        self.gated &= present
        await self.budgets.on_pods_listed(present)
        for uid in set(self.refs) - present:
            held = self.bound.get(uid)
            await self._gone(self.refs[uid], held[0] if held else None, ())

    async def on_pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        """One pod; one that cannot be read is told so and skipped, never fatal (any user
        who can create a pod could otherwise stop scheduling for everyone)."""
        try:
            await self.budgets.on_pod(kind, obj)
            await self.on_pod(kind, obj)
        except UNREADABLE as exc:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            name = f"{(meta or {}).get('namespace')}/{(meta or {}).get('name')}"
            log.warning("pod %s cannot be read (%r); skipped until it changes", name, exc)
            if not isinstance(meta, dict) or not all(meta.get(k) for k in ("name", "uid")):
                return
            await kube.tell(
                self.api,
                kube.pod_ref(obj),
                reason="FailedScheduling",
                kind="Warning",
                message=f"Tessera cannot read this pod ({exc!r}); it waits until it changes",
                component="tessera-watcher",
                condition=INVALID,
            )

    async def resync_loop(self) -> None:
        """Re-announce everything every ``scheduler.resyncS``."""
        while True:
            await asyncio.sleep(self.rt.cfg.scheduler.resync_s)
            await self.resync()

    async def resync(self) -> None:
        """Re-announce queues, PodGroups, Jobs and every pending pod (a coordinator that
        restarted learns them all). Each gets a fresh id: JetStream would drop a repeat
        of the first announcement as a duplicate, and a coordinator whose consumer did
        not exist then would never learn of it (a Queue unknown forever)."""
        known = [*self.mirrors.known(), *self.budgets.known(), *self.pending.values()]
        for e in known:
            await self.out.put(msgspec.structs.replace(e, event_id=ev.new_id()))

    async def on_resync_request(self, msg: Msg) -> None:
        """A coordinator asked for a resync: re-announce, and answer with the number of pending
        pods."""
        await self.resync()
        if msg.reply:
            await msg.respond(str(len(self.pending)).encode())

    # --- nodes ------------------------------------------------------------------------

    async def on_node(self, kind: str, obj: dict[str, Any]) -> None:
        """A Node's spec (labels, taints, allocatable, cordon) and its cordoned devices;
        said again only when one of them changes (not on status heartbeats). A Node that
        cannot be read is logged and skipped until it changes, never fatal."""
        try:
            name = NodeName(str(obj["metadata"]["name"]))
            spec = None if kind == "DELETED" else node_spec(obj)
            cordoned = ann.cordoned_devices(obj["metadata"].get("annotations") or {})
        except UNREADABLE as exc:
            log.warning(
                "node %s cannot be read (%r); skipped until it changes", object_name(obj), exc
            )
            return
        if spec is None:
            self.nodes.pop(name, None)
            await self.out.put(ev.NodeDeleted(node=name))
            return
        update = ev.NodeUpdated(
            node=name, cordoned_devices=cordoned, unschedulable=spec.unschedulable, spec=spec
        )
        if ev.changed(self.nodes.get(name), update):
            self.nodes[name] = update
            await self.out.put(update)

    async def on_node_relist(self, items: list[dict[str, Any]]) -> None:
        """The Nodes as listed after a broken watch: those no longer listed are deleted, every
        listed one is read again (said only if changed)."""
        present = {object_name(o) for o in items}
        for name in set(self.nodes) - present:
            await self.on_node("DELETED", {"metadata": {"name": name}})
        for obj in items:
            await self.on_node("ADDED", obj)
