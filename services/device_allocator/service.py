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

A gang that does not fit may come with victims (the coordinator says who may go, cheapest
first; shared/core/preemption.py finds the smallest set that makes room). The allocator
publishes ``PreemptionDecided`` (the binder evicts) and *nominates* the gang: a victim's
devices stay booked after its pod is gone, until the gang is placed on them, so no other
pod takes what was freed for it. A gang that has waited past the starvation guard gets
the nodes it would fit on held for it instead (nothing evicted; others stop landing
there). Nominations and holds lapse after ``HOLD_S`` if the gang does not come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats.js.errors
from kubernetes_asyncio.client import ApiException
from nats.js.kv import KeyValue

from shared import events as ev
from shared import kube
from shared.bus import Delivery, Lease
from shared.core import annotations as ann
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import NodeName, PodRef, PodUID
from shared.core.placement import Failure, GangMember, PlacementConfig, Placer
from shared.core.preemption import Unit, plan
from shared.core.request import GROUP_NAME
from shared.runtime import Runtime
from shared.telemetry import tracer

log = logging.getLogger(__name__)

RESERVATIONS = "tessera-reservations"
BIND_TIMEOUT_S = 30.0
ALLOCATOR_CONCURRENCY = 32
"""Events whose I/O may be in flight at once (see ``_lead``)."""
HOLD_S = 120.0

"""A nomination or node hold lapses if its gang has not come back in this time (the
coordinator retries a waiting gang at least every minute)."""

SUBJECTS = [
    "tessera.v1.node.>",
    "tessera.v1.gang.ready",
    "tessera.v1.pod.updated.>",
    "tessera.v1.pod.deleted.>",
    "tessera.v1.allocation.bind-failed",
    "tessera.v1.allocation.admitted.>",
]


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A decided placement not yet confirmed bound (the KV record)."""

    grant: PodGrant
    attempt: int
    at: float


_reservation_decoder = msgspec.json.Decoder(Reservation)


@dataclass
class Nomination:
    """Pods being evicted for a gang; their devices stay booked for it once they are gone."""

    victims: set[PodUID]
    until: float
    gone: set[PodUID] = field(default_factory=set)


def gang_key(gang: ev.GangRef) -> str:
    return f"{gang.namespace}/{gang.name}"


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
    def __init__(self, rt: Runtime, api: kube.Client, ledger: Ledger, kv: KeyValue) -> None:
        self.rt = rt
        self.api = api
        self.ledger = ledger
        self.placer = Placer(ledger, placement_config(rt))
        self.kv = kv
        self.reserved: dict[PodUID, Reservation] = {}
        self.refused: dict[NodeName, str] = {}
        self.cordons: dict[NodeName, tuple[str, ...]] = {}
        self.applied: dict[NodeName, ev.NodeInventory] = {}
        self.nominations: dict[str, Nomination] = {}
        self.doomed: dict[PodUID, str] = {}
        """Pods being preempted → the gang their devices are kept for."""
        self.holds: dict[str, float] = {}
        """Gangs with nodes held for them (``placer.reserved_nodes``) → when the hold lapses."""

    # --- start-up ---------------------------------------------------------------------

    @classmethod
    async def rebuild(cls, rt: Runtime, api: kube.Client) -> Allocator:
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
                self.placer.plugin_nodes.discard(event.node)
                self.placer.admitting.pop(event.node, None)
            case ev.GangReady():
                await self.on_gang(event)
            case ev.PodUpdated():
                await self.on_bound(event)
            case ev.PodDeleted():
                await self.release(event.pod, event.node, "pod deleted")
            case ev.BindFailed():
                await self.release(event.pod, event.node, f"bind failed: {event.error}")
            case ev.AllocationAdmitted():
                self.placer.admitted(event.pod, event.node)

    async def reconcile_loop(self) -> None:
        """Every heartbeat, apply any node whose KV inventory differs from what the ledger
        has: a missed or lost inventory event heals within one heartbeat."""
        async for latest in self.rt.bus.inventory_heartbeats(self.rt.cfg.scheduler.heartbeat_s):
            for inv in latest.values():
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
        if inv.device_plugin:
            self.placer.plugin_nodes.add(inv.node)
        else:
            self.placer.plugin_nodes.discard(inv.node)
            self.placer.admitting.pop(inv.node, None)
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
        key = gang_key(gang.gang)
        if members:
            with tracer().start_as_current_span(f"place {key}") as span:
                span.set_attribute("tessera.service", self.rt.service)
                span.set_attribute("tessera.gang.size", len(members))
                errors = [(m, self.placer.check(m.request)) for m in members]
                invalid = [(m, e) for m, e in errors if e]
                waiting = self._nominated(key)
                if waiting:
                    failed.append(
                        self._failed(
                            gang, [m.pod for m in members], waiting, (), unresolvable=False
                        )
                    )
                elif invalid:
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
                    result = self.placer.place_gang(members, gang.min_member, owner=key)
                    if result.ok:
                        self._drop_hold(key)
                        grants = [self.ledger.pods[p.pod.uid] for p in result.placed]
                        # Durable before any decision goes out (a restart rebuilds them).
                        await asyncio.gather(*(self._reserve(g, gang.attempt) for g in grants))
                        for grant in grants:
                            decided.append(self._decided(grant, gang, gang.attempt))
                            span.add_event(
                                "placed",
                                {"k8s.pod.uid": grant.pod.uid, "k8s.node.name": grant.node},
                            )

                        for f in result.failures:  # extras beyond min_member
                            failed.append(self._failure(gang, [f.pod], f))
                    else:
                        first = result.failures[-1]
                        room: list[ev.Event] = []
                        note = ""
                        if not first.unresolvable:
                            room, note = self._make_room(gang, members)
                            decided.extend(room)
                        failed.append(
                            self._failed(
                                gang,
                                [m.pod for m in members],
                                (result.message if gang.min_member > 1 else first.message) + note,
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

    # --- preemption and holds ---------------------------------------------------------

    def _nominated(self, key: str) -> str | None:
        """Why the gang waits for its preemption to finish; None when it may be placed
        (its gone victims' devices are then freed for it)."""
        nom = self.nominations.get(key)
        if nom is None:
            return None
        alive = nom.victims - nom.gone
        if alive and time.time() < nom.until:
            return f"waiting for {len(alive)} preempted pod(s) to exit"
        self._end_nomination(key)
        return None

    def _end_nomination(self, key: str) -> list[PodGrant]:
        """Free the devices kept for ``key``; victims still running are no longer doomed."""
        nom = self.nominations.pop(key, None)
        if nom is None:
            return []
        freed = []
        for uid in nom.victims:
            self.doomed.pop(uid, None)
            if uid in nom.gone:
                grant = self.ledger.release(uid)
                if grant is not None:
                    freed.append(grant)
        return freed

    def _make_room(
        self, gang: ev.GangReady, members: list[GangMember]
    ) -> tuple[list[ev.Event], str]:
        """Preempt for a gang that does not fit (if it may), else hold nodes for it (if it
        has starved): the events to publish and a note for its pods' message."""
        key = gang_key(gang.gang)
        if gang.victims and self.rt.cfg.scheduler.preemption:
            offered = {
                Unit(pods=tuple(p.uid for p in v.pods), why=v.why): v
                for v in gang.victims
                if not any(p.uid in self.doomed for p in v.pods)
            }
            found = plan(self.placer, members, gang.min_member, list(offered), owner=key)
            if found is not None:
                self.nominations[key] = Nomination(
                    victims=set(found.pods), until=time.time() + HOLD_S
                )
                for uid in found.pods:
                    self.doomed[uid] = key
                nodes = tuple(sorted({p.node for p in found.placements}))
                victims = tuple(offered[u] for u in found.units)
                log.info(
                    "preempting %d pod(s) for gang %s on %s: %s",
                    len(found.pods),
                    key,
                    ", ".join(nodes),
                    "; ".join(f"{', '.join(str(p) for p in v.pods)} ({v.why})" for v in victims),
                )
                event = ev.PreemptionDecided(
                    gang=gang.gang,
                    preemptor=tuple(m.pod for m in members),
                    victims=victims,
                    nodes=nodes,
                    attempt=gang.attempt,
                )
                return [event], (
                    f" Preempting {len(found.pods)} pod(s) to make room on {', '.join(nodes)}."
                )
        if gang.hold:
            held = self._hold(key, members, gang.min_member)
            if held:
                return [], (
                    f" It has waited long: nodes {', '.join(held)} are held for it until "
                    "their pods finish."
                )
        return [], ""

    def _hold(self, key: str, members: list[GangMember], min_member: int) -> list[NodeName]:
        """Hold the nodes the gang would fit on once their pods finish (fewest pods first)."""
        reserved = self.placer.reserved_nodes
        if key in self.holds:
            self.holds[key] = time.time() + HOLD_S
            return sorted(n for n, owner in reserved.items() if owner == key)
        by_node: dict[NodeName, list[PodUID]] = {}
        for uid, grant in self.ledger.pods.items():
            if uid not in self.doomed and reserved.get(grant.node, key) == key:
                by_node.setdefault(grant.node, []).append(uid)
        units = sorted(
            (Unit(pods=tuple(uids)) for uids in by_node.values()), key=lambda u: len(u.pods)
        )
        found = plan(self.placer, members, min_member, units, owner=key)
        if found is None:
            return []
        nodes = sorted({p.node for p in found.placements})
        for node in nodes:
            reserved[node] = key
        self.holds[key] = time.time() + HOLD_S
        log.info("gang %s has starved: holding %s for it", key, ", ".join(nodes))
        return nodes

    def _drop_hold(self, key: str) -> None:
        if self.holds.pop(key, None) is not None:
            reserved = self.placer.reserved_nodes
            for node in [n for n, owner in reserved.items() if owner == key]:
                del reserved[node]

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
        owner = self.doomed.get(pod.uid)
        nom = self.nominations.get(owner) if owner is not None else None
        if nom is not None and owner is not None:
            # A preempted pod is gone: its devices stay booked for the gang it made room for.
            nom.gone.add(pod.uid)
            if nom.victims <= nom.gone:
                held = self.ledger.pods.get(pod.uid)
                await self.rt.bus.publish(
                    ev.AllocationReleased(
                        pod=pod,
                        node=held.node if held else node or NodeName(""),
                        reason=f"preempted; its devices are kept for gang {owner}",
                    )
                )
            return
        grant = self.ledger.release(pod.uid)
        if pod.uid in self.reserved:
            await self._forget_reservation(pod.uid)
        if grant is not None:
            self.placer.admitted(pod, grant.node)
            await self.rt.bus.publish(
                ev.AllocationReleased(pod=pod, node=grant.node, reason=reason)
            )

    async def expire_loop(self, timeout_s: float = BIND_TIMEOUT_S) -> None:
        """Reservations the binder never confirmed: adopt the bound ones, free the rest.
        Nominations and holds whose gang did not come back lapse."""
        while True:
            await asyncio.sleep(timeout_s / 3)
            now = time.time()
            for key in [k for k, n in self.nominations.items() if n.until <= now]:
                log.info("nomination of gang %s lapsed: its devices are free again", key)
                for grant in self._end_nomination(key):
                    await self.rt.bus.publish(
                        ev.AllocationReleased(
                            pod=grant.pod, node=grant.node, reason="preempted (nomination lapsed)"
                        )
                    )
            for key in [k for k, until in self.holds.items() if until <= now]:
                log.info("hold of gang %s lapsed", key)
                self._drop_hold(key)

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
    # Handlers overlap only in their I/O (reservation KV writes, publishing decisions):
    # each one's ledger work runs before its first await, and handlers start in stream
    # order, so the ledger sees events in order.
    rt.adopt(
        rt.bus.consume(
            "device-allocator",
            SUBJECTS,
            allocator.handle,
            deliver="new",
            ack_wait_s=10.0,
            concurrency=ALLOCATOR_CONCURRENCY,
        )
    )
    rt.spawn(allocator.expire_loop(), "expire-reservations")
    rt.spawn(allocator.reconcile_loop(), "reconcile-inventory")
    await lease.hold()
