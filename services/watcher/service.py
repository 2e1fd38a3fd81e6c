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
devices, and deletions; namespaces, PodGroups, Queues and Jobs are mirrored by one
generic :class:`Mirror` each. A pending pod that claims volumes or DRA ResourceClaims is
announced with what they allow, and again when they change (claims.py).
PodDisruptionBudgets: what each allows now, as ``BudgetUpdated`` (budgets.py).

Each pending announcement opens the root span of one scheduling attempt; the bus carries
it through coordinator, allocator and binder.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec
from kubernetes_asyncio.client import ApiException
from nats.aio.msg import Msg

from services.watcher.budgets import BudgetWatch
from services.watcher.claims import ClaimReader
from shared import events as ev
from shared import kube
from shared.aio import raise_if_cancelling
from shared.bus import Outbox
from shared.config import request_parser
from shared.core import annotations as ann
from shared.core.hosts import PodSpec, node_spec, pod_spec
from shared.core.model import NodeName, PodRef, PodRequest, PodUID, RequestError
from shared.core.request import GROUP_NAME, TASK_SPEC, rejection
from shared.runtime import Runtime, Service
from shared.telemetry import span

log = logging.getLogger(__name__)

VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
VOLCANO_BATCH = "/apis/batch.volcano.sh/v1alpha1"
DISCOVERY_RETRY_S = 30.0
TERMINAL = ("Succeeded", "Failed")
INVALID = kube.Condition("PodScheduled", "False", "InvalidRequest")

K = TypeVar("K")
U = TypeVar("U", bound=ev.Event)

UNREADABLE = (
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
    msgspec.ValidationError,
    msgspec.EncodeError,
)
"""What reading one object of the API server may raise when the object is not as its
schema says: the object is logged (and told, where there is someone to tell) and
skipped, never fatal (any user who can create it could otherwise stop scheduling for
everyone)."""
PODS = "/api/v1/pods"
FULL_LIST_WAIT_S = 30.0
"""At start, the longest the list of every pod waits for the backlog (``watch_pods``)."""
WAIT_WATCH_S = 5
"""Meanwhile, the watch is renewed this often (it ends at once on the bind that empties
the backlog)."""
YIELD_EVERY = 256
"""Pods of a list announced between two yields to the event loop: the next page, asked
for already, is read from its socket meanwhile (the API server goes on writing it)."""
SHAPES = 65536
"""The most pod shapes kept parsed (``Watcher._spec``); past it they are parsed afresh."""
MAX_DEPTH = 100
"""How deep lists and mappings may nest in a Job's spec, which the bus carries as is (a
real one nests about 15 deep; one nested close to Python's recursion limit could be
decoded by no consumer)."""


_ENCODE = msgspec.json.Encoder().encode


def _timestamp(text: str | None) -> float:
    if not text:
        return 0.0
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


VOLCANO_JOBS = "batch.volcano.sh/"


def volcano_job(meta: dict[str, Any]) -> str:
    """The Volcano Job that controls a pod (its controller ``ownerReference``), or ''."""
    for owner in meta.get("ownerReferences") or ():
        if (
            owner.get("controller")
            and owner.get("kind") == "Job"
            and str(owner.get("apiVersion", "")).startswith(VOLCANO_JOBS)
        ):
            return str(owner.get("name", ""))
    return ""


def updated_event(
    obj: dict[str, Any], ref: PodRef, node: NodeName, phase: str, host: PodSpec
) -> ev.PodUpdated:
    """A pod on a node, as the watcher announces it (its grants and their signature)."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    return ev.PodUpdated(
        pod=ref,
        node=node,
        phase=phase,
        grants=ann.read_grants(annotations) or (),
        resource_version=meta.get("resourceVersion", ""),
        spec=host,
        scheduler_name=spec.get("schedulerName", ""),
        signature=annotations.get(ann.SIGNATURE, ""),
        job=volcano_job(meta),
    )


def pending_event(
    obj: dict[str, Any], ref: PodRef, request: PodRequest, host: PodSpec
) -> ev.PodPending:
    """A pod waiting for Tessera, as the watcher announces it."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    return ev.PodPending(
        pod=ref,
        request=request,
        scheduler_name=spec.get("schedulerName", ""),
        group=annotations.get(GROUP_NAME) or None,
        task=annotations.get(TASK_SPEC) or None,
        priority=int(spec.get("priority") or 0),
        created_at=_timestamp(meta.get("creationTimestamp")),
        resource_version=meta.get("resourceVersion", ""),
        spec=host,
        preemption_policy=str(spec.get("preemptionPolicy") or ""),
    )


def _name(obj: Any) -> str:
    """``namespace/name`` (or ``name``) of an object, for a log line, whatever its shape."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return "/".join(str(meta[k]) for k in ("namespace", "name") if meta.get(k)) or "?"


@dataclass
class Mirror(Generic[K, U]):
    """One kind of object as its last announced event: a change is published, a repeat
    is not, a deletion (seen, or missed while relisting) publishes ``deleted(key)``. An
    object that cannot be read is logged and skipped (no pod to tell: the Kubernetes
    Events of shared/kube.py are written on pods)."""

    bus_publish: Callable[[ev.Event], Coroutine[Any, Any, None]]
    key: Callable[[dict[str, Any]], K]
    update: Callable[[dict[str, Any]], U]
    deleted: Callable[[K, dict[str, Any]], ev.Event]
    known: dict[K, U] = field(default_factory=dict)
    what: str = "object"
    """What the objects are, for log lines (``Job``)."""

    async def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            key = self.key(obj)
            update = None if kind == "DELETED" else self.update(obj)
        except UNREADABLE as exc:
            log.warning(
                "%s %s cannot be read (%r); skipped until it changes", self.what, _name(obj), exc
            )
            return
        if update is None:
            if self.known.pop(key, None) is not None:
                await self.bus_publish(self.deleted(key, obj))
            return
        if ev.changed(self.known.get(key), update):
            self.known[key] = update
            await self.bus_publish(update)

    async def on_relist(self, items: list[dict[str, Any]]) -> None:
        present = set()
        for obj in items:
            try:
                present.add(self.key(obj))
            except UNREADABLE:
                continue  # on_event says why
        for key in set(self.known) - present:
            await self.bus_publish(self.deleted(key, {}))
            del self.known[key]
        for obj in items:
            await self.on_event("ADDED", obj)


def _namespaced(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def podgroup_event(obj: dict[str, Any]) -> ev.PodGroupUpdated:
    namespace, name = _namespaced(obj)
    spec = obj.get("spec") or {}
    return ev.PodGroupUpdated(
        namespace=namespace,
        name=name,
        uid=obj["metadata"].get("uid", ""),
        min_member=max(int(spec.get("minMember") or 1), 1),
        min_task_member={
            str(k): max(int(v), 0) for k, v in (spec.get("minTaskMember") or {}).items()
        },
        queue=spec.get("queue") or "default",
        priority_class=spec.get("priorityClassName") or "",
        min_resources={str(k): str(v) for k, v in (spec.get("minResources") or {}).items()},
    )


def queue_event(obj: dict[str, Any]) -> ev.QueueUpdated:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    guarantee = (spec.get("guarantee") or {}).get("resource") or {}
    return ev.QueueUpdated(
        name=obj["metadata"]["name"],
        weight=max(int(spec.get("weight") or 1), 0),
        capability={str(k): str(v) for k, v in (spec.get("capability") or {}).items()},
        guarantee={str(k): str(v) for k, v in guarantee.items()},
        reclaimable=bool(spec.get("reclaimable", True)),
        priority=int(spec.get("priority") or 0),
        state=str(status.get("state") or spec.get("state") or "Open"),
    )


def _depth(value: Any) -> int:
    """How deep lists and mappings nest in ``value``, up to just past :data:`MAX_DEPTH`
    (walked without recursion: the value may nest deeper than the stack allows)."""
    deepest = 0
    todo = [(value, 0)]
    while todo and deepest <= MAX_DEPTH:
        item, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            todo += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            todo += [(v, depth + 1) for v in item]
    return deepest


def job_event(obj: dict[str, Any]) -> ev.JobUpdated:
    """A Job's event; ValueError when its spec nests deeper than :data:`MAX_DEPTH`."""
    namespace, name = _namespaced(obj)
    spec = obj.get("spec") or {}
    if _depth(spec) > MAX_DEPTH:
        raise ValueError(f"its spec nests more than {MAX_DEPTH} levels deep")
    return ev.JobUpdated(
        namespace=namespace,
        name=name,
        uid=obj["metadata"].get("uid", ""),
        spec=spec,
    )


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
        self.relisted = False
        """Whether every pod has been listed once (``relist_pods``)."""
        self.backlog: set[PodUID] = set()
        """At start, the pods pending then and not bound or gone since (``watch_pods``)."""
        self.placed: asyncio.Event | None = None
        """Set once the backlog is empty (``watch_pods``)."""
        self.out = Outbox(rt.bus)
        """Everything it announces, in the order seen, pipelined (shared/bus.py)."""
        self.claims = ClaimReader(api, rt.spawn, self.pending, self._announce)
        """What our pending pods' volumes and resource claims allow (claims.py)."""
        publish = self.out.put
        self.budgets = BudgetWatch(publish)
        """PodDisruptionBudgets and the pods they count (budgets.py)."""
        self.namespaces = Mirror(
            publish,
            lambda o: str(o["metadata"]["name"]),
            lambda o: ev.NamespaceUpdated(
                name=str(o["metadata"]["name"]),
                labels={str(k): str(v) for k, v in (o["metadata"].get("labels") or {}).items()},
            ),
            lambda k, _: ev.NamespaceUpdated(name=k),
            what="Namespace",
        )
        self.podgroups = Mirror(
            publish,
            _namespaced,
            podgroup_event,
            lambda k, _: ev.PodGroupDeleted(namespace=k[0], name=k[1]),
            what="PodGroup",
        )
        self.queues = Mirror(
            publish,
            lambda o: str(o["metadata"]["name"]),
            queue_event,
            lambda k, _: ev.QueueDeleted(name=k),
            what="Queue",
        )
        self.jobs = Mirror(
            publish,
            _namespaced,
            job_event,
            lambda k, o: ev.JobDeleted(
                namespace=k[0], name=k[1], uid=(o.get("metadata") or {}).get("uid", "")
            ),
            what="Job",
        )

    async def start(self) -> None:
        self.rt.on_stop(self.flush)
        await self.rt.bus.nc.subscribe(ev.CONTROL_RESYNC_SUBJECT, cb=self.on_resync_request)
        self.rt.spawn(self.watch_volcano(), "discover-volcano", finite=True)
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
        return {
            "publish": self.out.run(),
            "watch-pods": self.watch_pods(),
            "watch-nodes": kube.list_watch(
                self.api, "/api/v1/nodes", self.on_node, on_relist=self.on_node_relist
            ),
            "watch-namespaces": kube.list_watch(
                self.api,
                "/api/v1/namespaces",
                self.namespaces.on_event,
                on_relist=self.namespaces.on_relist,
            ),
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
            self._placed(ref.uid)
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
        self._placed(ref.uid)
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
        self._placed(ref.uid)
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

    async def watch_pods(self) -> None:
        """Every pod, listed and watched. At start (maybe a restart, with a backlog) the
        pods on no node are listed first, alone, and the pending ones announced at once
        and watched from then on, with every change to any pod; the list of every pod
        (``relist_pods``) waits until each of them is bound or gone (the backlog is
        placed) or ``FULL_LIST_WAIT_S`` has passed, and starts at once when none waits.
        An allocator starting beside it lists every pod too, and the API server took
        twice as long to write two such lists at once (140,000 pods on 2 cores,
        bench/RESULTS.md): the backlog waited for both."""
        try:
            version = await self._list_unplaced()
        except (TimeoutError, ApiException, OSError, kube.GoneError) as exc:
            raise_if_cancelling()
            log.warning("pods on no node not listed (%r): listing every pod", exc)
            version = ""
        if version and self.pending:
            self.backlog = set(self.pending)
            self.placed = asyncio.Event()
            timer = asyncio.get_running_loop().call_later(FULL_LIST_WAIT_S, self.placed.set)
            try:
                await kube.list_watch(
                    self.api,
                    PODS,
                    self.on_pod_event,
                    relist=self.relist_pods,
                    since=version,
                    until=self.placed,
                    timeout_s=WAIT_WATCH_S,
                )
            finally:
                timer.cancel()
                self.backlog, self.placed = set(), None
        await kube.list_watch(self.api, PODS, self.on_pod_event, relist=self.relist_pods)

    def _placed(self, uid: PodUID) -> None:
        """A pod of the backlog at start is bound or gone: once none is left, every pod
        is listed (``watch_pods``)."""
        self.backlog.discard(uid)
        if self.placed is not None and not self.backlog:
            self.placed.set()

    async def relist_pods(self) -> str:
        """Every pod, a page at a time (``kube.list_pages``), each page announced while
        the API server writes the next, a pod on a node decoded only as far as it is
        read (``kube.read_pod``); then what the list lacks was deleted. Returns the
        list's resourceVersion, to watch from."""
        stats = kube.ListStats()
        present: set[PodUID] = set()
        read_s = handled_s = 0.0
        with kube.bulk():
            pages = kube.list_pages(self.api, PODS, msgspec.Raw, stats=stats)
            async for page in pages:
                for i, raw in enumerate(page):
                    if i % YIELD_EVERY == YIELD_EVERY - 1:
                        await asyncio.sleep(0)  # the next page is read meanwhile
                    began = time.monotonic()
                    obj = kube.read_pod(raw)
                    read = time.monotonic()
                    present.add(PodUID(obj.get("metadata", {}).get("uid", "")))
                    await self.on_pod_event("ADDED", obj)
                    read_s += read - began
                    handled_s += time.monotonic() - read
            await self._listed(present)
        if not self.relisted:
            log.info("startup phase pod-list: %.2f s (%s)", stats.took_s(), stats)
            log.info(
                "startup phase pod-decode: %.2f s (%d pods, between pages)", read_s, len(present)
            )
            log.info(
                "startup phase announce: %.2f s (%d on nodes, %d pending; between pages)",
                handled_s,
                len(self.bound),
                len(self.pending),
            )
        self.relisted = True
        return stats.resource_version

    async def _list_unplaced(self) -> str:
        """The pods on no node, listed alone (the API server filters them from its cache
        without writing the others) and announced; the list's resourceVersion."""
        began = time.monotonic()
        items, version = await kube.list_all(self.api, PODS, {"fieldSelector": "spec.nodeName="})
        for obj in items:
            await self.on_pod_event("ADDED", obj)
        log.info(
            "startup phase pending-list: %.2f s (%d pods on no node, %d pending announced)",
            time.monotonic() - began,
            len(items),
            len(self.pending),
        )
        return version

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
        while True:
            await asyncio.sleep(self.rt.cfg.scheduler.resync_s)
            await self.resync()

    async def resync(self) -> None:
        """Re-announce queues, PodGroups, Jobs and every pending pod (a coordinator that
        restarted learns them all). Each gets a fresh id: JetStream would drop a repeat
        of the first announcement as a duplicate, and a coordinator whose consumer did
        not exist then would never learn of it (a Queue unknown forever)."""
        known: list[ev.Event] = [
            *self.queues.known.values(),
            *self.podgroups.known.values(),
            *self.jobs.known.values(),
            *self.budgets.known(),
            *self.pending.values(),
        ]
        for e in known:
            await self.out.put(msgspec.structs.replace(e, event_id=ev.new_id()))

    async def on_resync_request(self, msg: Msg) -> None:
        await self.resync()
        if msg.reply:
            await msg.respond(str(len(self.pending)).encode())

    # --- Volcano PodGroups, Queues and Jobs --------------------------------------------

    async def watch_volcano(self) -> None:
        """Watch PodGroups, Queues and Jobs once their API is served (the CRDs may come
        later)."""
        while True:
            try:
                await kube.request(self.api, "GET", VOLCANO)
                break
            except ApiException as exc:
                if exc.status != 404:
                    raise
            await asyncio.sleep(DISCOVERY_RETRY_S)
        for path, mirror in (
            (f"{VOLCANO}/podgroups", self.podgroups),
            (f"{VOLCANO}/queues", self.queues),
            (f"{VOLCANO_BATCH}/jobs", self.jobs),
        ):
            self.rt.spawn(
                kube.list_watch(self.api, path, mirror.on_event, on_relist=mirror.on_relist),
                f"watch-{path.rsplit('/', 1)[1]}",
            )
        log.info("watching Volcano PodGroups, Queues and Jobs")

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
            log.warning("node %s cannot be read (%r); skipped until it changes", _name(obj), exc)
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
        present = {_name(o) for o in items}
        for name in set(self.nodes) - present:
            await self.on_node("DELETED", {"metadata": {"name": name}})
        for obj in items:
            await self.on_node("ADDED", obj)
