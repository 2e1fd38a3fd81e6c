"""The device-allocator: the single writer of the device ledger.

Only the replica holding the ``device-allocator`` lease acts; others wait as standbys.
On taking the lease it rebuilds the ledger from what is durable: node inventories (KV),
the grant annotations of bound pods, and its own reservations of decided-but-not-yet-bound
pods (KV ``tessera-reservations``), so a restart never double-books.

Assume, then bind (kube-scheduler's cache)::

    GangReady --place--> reserved (ledger + reservation KV) --AllocationDecided--> binder
        reserved --PodUpdated(bound)--> granted (reservation dropped: the pod holds it)
        reserved --BindFailed / pod deleted / bind timed out--> released
        granted  --PodDeleted--> released

A reservation the binder has not confirmed within ``bind_timeout_s`` is checked against
the API server: bound there, it becomes a grant; otherwise it is released and the pod is
retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
import nats.js.errors
from kubernetes_asyncio.client import ApiClient, ApiException
from nats.js.kv import KeyValue

from shared import events as ev
from shared import kube
from shared.bus import Delivery, Lease
from shared.core import annotations as ann
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import NodeName, PodRef, PodUID
from shared.core.placement import Failure, GangMember, PlacementConfig, Placer
from shared.core.request import GROUP_NAME
from shared.runtime import Runtime
from shared.telemetry import tracer

log = logging.getLogger(__name__)

RESERVATIONS = "tessera-reservations"
BIND_TIMEOUT_S = 30.0

SUBJECTS = [
    "tessera.v1.node.>",
    "tessera.v1.gang.ready",
    "tessera.v1.pod.updated.>",
    "tessera.v1.pod.deleted.>",
    "tessera.v1.allocation.bind-failed",
]


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A decided placement not yet confirmed bound (the KV record)."""

    grant: PodGrant
    attempt: int
    at: float


_reservation_decoder = msgspec.json.Decoder(Reservation)


def placement_config(rt: Runtime) -> PlacementConfig:
    s = rt.cfg.scheduler
    return PlacementConfig(
        node_policy=s.node_policy,
        device_policy=s.device_policy,
        allow_more_devices_than_cards=s.allow_more_devices_than_cards,
        memory_larger_than_card=s.memory_larger_than_card,
        fgd_candidates=s.fgd_candidates,
    )


class Allocator:
    def __init__(self, rt: Runtime, api: ApiClient, ledger: Ledger, kv: KeyValue) -> None:
        self.rt = rt
        self.api = api
        self.ledger = ledger
        self.placer = Placer(ledger, placement_config(rt))
        self.kv = kv
        self.reserved: dict[PodUID, Reservation] = {}
        self.refused: dict[NodeName, str] = {}
        self.cordons: dict[NodeName, tuple[str, ...]] = {}
        self.applied: dict[NodeName, ev.NodeInventory] = {}

    # --- start-up ---------------------------------------------------------------------

    @classmethod
    async def rebuild(cls, rt: Runtime, api: ApiClient) -> Allocator:
        """The ledger from node inventories, bound pods' grants and open reservations."""
        overrides = {o.name: o for o in rt.cfg.node_configs}
        ledger = Ledger(rt.cfg.devices, overrides)
        kv = await rt.bus.bucket(RESERVATIONS)
        self = cls(rt, api, ledger, kv)
        nodes, _ = await kube.list_all(api, "/api/v1/nodes")
        for node in nodes:
            self.cordons[NodeName(node["metadata"]["name"])] = ann.cordoned_devices(
                node["metadata"].get("annotations") or {}
            )
        for inventory in (await rt.bus.inventories()).values():
            self.on_inventory(inventory)
        pods, _ = await kube.list_all(
            api,
            "/api/v1/pods",
            {
                "fieldSelector": "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            },
        )
        bound = 0
        for pod in pods:
            grant = _bound_grant(pod)
            if grant is not None:
                ledger.grant(grant)
                bound += 1
        reserved = 0
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        for key in keys:
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue
            if not entry.value:
                continue
            r = _reservation_decoder.decode(entry.value)
            if r.grant.pod.uid in ledger.pods:
                await self._forget_reservation(r.grant.pod.uid)  # bound meanwhile
                continue
            ledger.grant(r.grant)
            self.reserved[r.grant.pod.uid] = r
            reserved += 1
        log.info(
            "ledger rebuilt: %d nodes, %d devices, %d bound pods, %d reservations",
            len(ledger.nodes),
            ledger.device_count(),
            bound,
            reserved,
        )
        return self

    # --- events -----------------------------------------------------------------------

    async def handle(self, event: ev.AnyEvent, _delivery: Delivery) -> None:
        match event:
            case ev.NodeInventory():
                self.on_inventory(event)
            case ev.NodeUpdated():
                self.cordons[event.node] = event.cordoned_devices
                self.ledger.set_cordoned(event.node, event.cordoned_devices)
            case ev.NodeDeleted():
                self.ledger.remove_node(event.node)
                self.applied.pop(event.node, None)
                self.refused.pop(event.node, None)
            case ev.GangReady():
                await self.on_gang(event)
            case ev.PodUpdated():
                await self.on_bound(event)
            case ev.PodDeleted():
                await self.release(event.pod, event.node, "pod deleted")
            case ev.BindFailed():
                await self.release(event.pod, event.node, f"bind failed: {event.error}")

    async def reconcile_loop(self) -> None:
        """Every heartbeat, apply any node whose KV inventory differs from what the ledger
        has: a missed or lost inventory event heals within one heartbeat."""
        while True:
            await asyncio.sleep(self.rt.cfg.scheduler.heartbeat_s)
            for inv in (await self.rt.bus.inventories()).values():
                known = self.applied.get(inv.node)
                if (
                    known is None
                    or known.devices != inv.devices
                    or (known.config_hash != inv.config_hash)
                ):
                    log.info("inventory of %s taken from the KV (its event was missed)", inv.node)
                    self.on_inventory(inv)

    def on_inventory(self, inv: ev.NodeInventory) -> None:
        self.applied[inv.node] = inv
        if inv.config_hash != self.rt.config_hash:
            if self.refused.get(inv.node) != inv.config_hash:
                log.error(
                    "node %s runs config %s, this allocator %s: no placement there until "
                    "both load the same tessera.yaml",
                    inv.node,
                    inv.config_hash,
                    self.rt.config_hash,
                )
            self.refused[inv.node] = inv.config_hash
            self.ledger.remove_node(inv.node)
            return
        self.refused.pop(inv.node, None)
        self.ledger.set_node(inv.node, inv.devices, self.cordons.get(inv.node, ()))

    async def on_gang(self, gang: ev.GangReady) -> None:
        members = []
        replay = []
        for p in gang.members:
            held = self.ledger.pods.get(p.pod.uid)
            if held is not None:
                replay.append(held)  # decided before (a redelivery): say it again
            else:
                members.append(GangMember(pod=p.pod, request=p.request, group=p.group))
        decided: list[ev.Event] = [self._decided(g, gang, gang.attempt) for g in replay]
        failed: list[ev.AllocationFailed] = []
        if members:
            with tracer().start_as_current_span(
                f"place {gang.gang.namespace}/{gang.gang.name}"
            ) as span:
                span.set_attribute("tessera.service", self.rt.service)
                span.set_attribute("tessera.gang.size", len(members))
                errors = [(m, self.placer.check(m.request)) for m in members]
                invalid = [(m, e) for m, e in errors if e]
                if invalid:
                    m, errs = invalid[0]
                    text = "; ".join(f"{e.field}: {e.message}" for e in errs)
                    if len(members) > 1:
                        text = f"{m.pod}: {text}"
                    failed.append(
                        self._failed(
                            gang,
                            [x.pod for x in members],
                            text,
                            (),
                            unresolvable=True,
                        )
                    )
                else:
                    result = self.placer.place_gang(members, gang.min_member)
                    if result.ok:
                        for placement in result.placed:
                            grant = self.ledger.pods[placement.pod.uid]
                            await self._reserve(grant, gang.attempt)
                            decided.append(self._decided(grant, gang, gang.attempt))
                            span.add_event(
                                "placed",
                                {"k8s.pod.uid": placement.pod.uid, "k8s.node.name": placement.node},
                            )
                        for f in result.failures:  # extras beyond min_member
                            failed.append(self._failure(gang, [f.pod], f))
                    else:
                        first = result.failures[-1]
                        failed.append(
                            self._failed(
                                gang,
                                [m.pod for m in members],
                                result.message if gang.min_member > 1 else first.message,
                                first.reasons,
                                unresolvable=first.unresolvable,
                            )
                        )
        for no in failed:
            log.info(
                "not placed (%s): %s: %s",
                "unresolvable" if no.unresolvable else "waits",
                ", ".join(str(p) for p in no.pods),
                no.message,
            )
        await self.rt.bus.publish_many([*decided, *failed])

    def _decided(self, grant: PodGrant, gang: ev.GangReady, attempt: int) -> ev.Event:
        lone = gang.min_member <= 1 and len(gang.members) == 1
        return ev.AllocationDecided(
            pod=grant.pod,
            node=grant.node,
            grants=grant.containers,
            gang=None if lone else gang.gang,
            attempt=attempt,
        )

    def _failure(self, gang: ev.GangReady, pods: list[PodRef], f: Failure) -> ev.AllocationFailed:
        return self._failed(gang, pods, f.message, f.reasons, unresolvable=f.unresolvable)

    def _failed(
        self,
        gang: ev.GangReady,
        pods: list[PodRef],
        message: str,
        reasons: tuple[tuple[str, int], ...],
        *,
        unresolvable: bool,
    ) -> ev.AllocationFailed:
        refused = len(self.refused)
        if refused:
            message += f" ({refused} node(s) refused: they run another config)"
        return ev.AllocationFailed(
            pods=tuple(pods),
            message=message,
            attempt=gang.attempt,
            reasons=tuple(ev.ReasonCount(reason=r, nodes=n) for r, n in reasons),
            gang=gang.gang,
            unresolvable=unresolvable,
        )

    async def _reserve(self, grant: PodGrant, attempt: int) -> None:
        r = Reservation(grant=grant, attempt=attempt, at=time.time())
        self.reserved[grant.pod.uid] = r
        await self.kv.put(grant.pod.uid, msgspec.json.encode(r))

    async def _forget_reservation(self, uid: PodUID) -> None:
        self.reserved.pop(uid, None)
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.kv.delete(uid)

    async def on_bound(self, event: ev.PodUpdated) -> None:
        if event.node is None:
            return
        held = self.ledger.pods.get(event.pod.uid)
        if held is None and event.grants:
            # bound by an earlier leader and not yet known here
            self.ledger.grant(PodGrant(pod=event.pod, node=event.node, containers=event.grants))
        elif held is not None and (
            held.node != event.node or (event.grants and held.containers != event.grants)
        ):
            log.warning(
                "pod %s is bound to %s, not as reserved on %s; following the pod",
                event.pod,
                event.node,
                held.node,
            )
            self.ledger.release(event.pod.uid)
            if event.grants:
                self.ledger.grant(
                    PodGrant(
                        pod=event.pod, node=event.node, containers=event.grants, group=held.group
                    )
                )
        if event.pod.uid in self.reserved:
            await self._forget_reservation(event.pod.uid)

    async def release(self, pod: PodRef, node: NodeName | None, reason: str) -> None:
        grant = self.ledger.release(pod.uid)
        if pod.uid in self.reserved:
            await self._forget_reservation(pod.uid)
        if grant is not None:
            await self.rt.bus.publish(
                ev.AllocationReleased(pod=pod, node=grant.node, reason=reason)
            )

    async def expire_loop(self, timeout_s: float = BIND_TIMEOUT_S) -> None:
        """Reservations the binder never confirmed: adopt the bound ones, free the rest."""
        while True:
            await asyncio.sleep(timeout_s / 3)
            now = time.time()
            for uid, r in list(self.reserved.items()):
                if now - r.at < timeout_s or uid not in self.reserved:
                    continue
                await self._expire(r)

    async def _expire(self, r: Reservation) -> None:
        pod = r.grant.pod
        try:
            obj = await kube.request(
                self.api, "GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            )
        except ApiException as exc:
            if exc.status != 404:
                return  # try again next round
            obj = None
        bound = _bound_grant(obj) if obj and obj["metadata"]["uid"] == pod.uid else None
        if bound is not None:
            await self.on_bound(ev.PodUpdated(pod=pod, node=bound.node, grants=bound.containers))
            return
        log.warning(
            "reservation of %s on %s not bound within %.0fs: released",
            pod,
            r.grant.node,
            BIND_TIMEOUT_S,
        )
        await self.release(pod, r.grant.node, "bind timed out")
        await self.rt.bus.publish(
            ev.AllocationFailed(
                pods=(pod,),
                message="the bind did not happen in time; retrying",
                attempt=r.attempt,
            )
        )


def _bound_grant(pod: dict[str, Any]) -> PodGrant | None:
    meta = pod["metadata"]
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    grants = ann.read_grants(meta.get("annotations") or {})
    if grants is None:
        return None
    ref = PodRef(namespace=meta.get("namespace", ""), name=meta["name"], uid=PodUID(meta["uid"]))
    group = (meta.get("annotations") or {}).get(GROUP_NAME)
    return PodGrant(pod=ref, node=NodeName(node), containers=grants, group=group)


async def main(rt: Runtime) -> None:
    lease = Lease(rt.bus, "device-allocator", rt.instance, rt.cfg.scheduler.leader_lease_s)
    rt.spawn(_lead(rt, lease), "lead")


async def _lead(rt: Runtime, lease: Lease) -> None:
    """Wait for the lease, rebuild, then serve until the lease is lost (then exit)."""
    await lease.acquire()
    rt.on_stop(lease.release)
    api = await kube.connect(rt.cfg.kubernetes)
    rt.on_stop(api.close)
    allocator = await Allocator.rebuild(rt, api)
    rt.adopt(
        rt.bus.consume(
            "device-allocator", SUBJECTS, allocator.handle, deliver="new", ack_wait_s=10.0
        )
    )
    rt.spawn(allocator.expire_loop(), "expire-reservations")
    rt.spawn(allocator.reconcile_loop(), "reconcile-inventory")
    await lease.hold()
