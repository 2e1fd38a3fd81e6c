"""Placing a gang: the allocator's answer to ``gang.ready``.

The gang is placed all-or-nothing by the core (``Placer.place_gang``, one statement;
a gang of subgroups each subgroup whole or not at all, shared/core/subgroups.py; a gang
with ``networkTopology`` inside one HyperNode, shared/core/network.py),
its grants reserved durably (services/device_allocator/reservations.py) before one
``AllocationDecided`` per pod goes out. One that does not fit goes on to the next shard
of its route (services/device_allocator/span.py), or is refused, with room made for it
where it may (shared/core/room.py: preemption, a hold for a starved gang). A gang whose
victims are still leaving waits for them. The fragmentation guard each gang is placed
with is chosen from the load it meets (shared/core/pace.py) and passed to the core.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection

import msgspec

from services.device_allocator import extended, outcomes
from services.device_allocator.dra import PLUGIN, Dra
from services.device_allocator.fabric import Fabric
from services.device_allocator.metrics import AllocatorMetrics
from services.device_allocator.reservations import Reservations
from services.device_allocator.span import Span
from shared import events as ev
from shared.core import network, pace
from shared.core.ledger import PodGrant
from shared.core.placement import GangMember, Placer
from shared.core.room import Room
from shared.core.status import Code, Reason, Status, combined
from shared.runtime import Runtime
from shared.telemetry import span

log = logging.getLogger(__name__)

SPANNING = (
    "a gang placed across allocator shards cannot allocate ResourceClaims yet: "
    "keep a gang with claims within one shard"
)


class Gangs:
    """Places the gangs offered to this allocator and says what came of each."""

    def __init__(
        self,
        rt: Runtime,
        placer: Placer,
        room: Room,
        reserved: Reservations,
        spans: Span,
        stats: AllocatorMetrics,
        refused: Collection[str],
        fabric: Fabric,
        dra: Dra,
    ) -> None:
        self.rt = rt
        self.placer = placer
        self.ledger = placer.ledger
        self.room = room
        self.reserved = reserved
        self.spans = spans
        self.stats = stats
        self.refused = refused
        """The nodes refused for their config (services/device_allocator/nodes.py)."""
        self.fabric = fabric
        """The HyperNodes, for gangs with ``networkTopology`` (fabric.py)."""
        self.dra = dra
        """The pods' ResourceClaims, allocated where the pods go (dra.py)."""
        self.window = rt.cfg.scheduler.guard_window()
        """The configured window (0 without FragmentationGuard in the profile)."""
        self.guard = self.window
        """The fragmentation guard in force: the last gang's (``pace.fragmentation_guard``)."""

    async def ready(self, gang: ev.GangReady) -> None:
        """Place the gang all-or-nothing, reserve it, and publish a decision per pod (or
        why not, with room made for it where it may). Sharded, a gang this shard cannot
        place goes on to the next."""
        if gang.spanning is not None:
            if any(p.spec and p.spec.claims and p.spec.claims.allocate for p in gang.members):
                # Placed across shards, claims would go unallocated: refused, said why.
                why = Reason(kind="claim-allocate", detail=SPANNING, nodes=0, plugin=PLUGIN)
                across = Status(code=Code.UNRESOLVABLE, reasons=(why,))
                pods = tuple(p.pod for p in gang.members)
                await self.rt.bus.publish(outcomes.failed(gang, pods, across, self.refused))
                return
            await self.spans.place(gang, self.guard, time.monotonic())
            return
        if self.spans.repeat(gang):
            return  # the gang is being placed across shards
        key = gang.gang.key
        members = []
        decided: list[ev.Event] = []
        for p in gang.members:
            held = self.ledger.pods.get(p.pod.uid)
            if held is not None:  # decided before (a redelivery): say it again
                decided.append(outcomes.decided(held, gang, self.dra.decided(held.pod.uid)))
            else:
                members.append(outcomes.member(p))
        failed: list[ev.AllocationFailed] = []
        if members:
            with span(f"place {key}") as current:
                current.set_attribute("tessera.service", self.rt.service)
                current.set_attribute("tessera.gang.size", len(members))
                started = time.perf_counter()
                placed, failed, status, final = self._place(gang, members)
                onward = None if status is None or final else self.spans.onward(gang, status)
                if onward is not None:
                    decided.append(onward)
                elif status is not None:
                    room, refusal = self._refuse(gang, members, status)
                    decided.extend(room)
                    failed.append(refusal)
                self._count(gang, placed, decided, failed, time.perf_counter() - started)
                if placed:
                    # Durable before any decision goes out (a restart rebuilds them).
                    await asyncio.gather(
                        *(
                            self.reserved.put(g, gang.attempt, self.dra.decided(g.pod.uid))
                            for g in placed
                        )
                    )
                    for grant in placed:
                        claims = self.dra.decided(grant.pod.uid)
                        decided.append(outcomes.decided(grant, gang, claims))
                        current.add_event(
                            "placed", {"k8s.pod.uid": grant.pod.uid, "k8s.node.name": grant.node}
                        )
        for no in failed:
            log.info(
                "not placed (%s): %s: %s",
                "unresolvable" if no.unresolvable else "waits",
                ", ".join(str(p) for p in no.pods),
                no.message,
            )
        await self.rt.bus.publish_many([*decided, *failed])

    def _keep_up(self, gang: ev.GangReady) -> int:
        """The fragmentation guard for ``gang``, from the load it meets now."""
        wanted = pace.fragmentation_guard(
            self.window,
            now=time.time(),
            emitted_at=gang.emitted_at,
            attempt=gang.attempt,
            newest_created=max((p.created_at for p in gang.members), default=0.0),
            open_binds=len(self.reserved.open),
        )
        if self.guard != wanted:
            log.debug(
                "fragmentation guard: %d nodes per pod (%s)",
                wanted,
                "behind" if wanted == pace.NARROW_GUARD else "caught up",
            )
            self.guard = wanted
        return wanted

    def _place(
        self, gang: ev.GangReady, members: list[GangMember]
    ) -> tuple[list[PodGrant], list[ev.AllocationFailed], Status | None, bool]:
        """The ledger work of one gang: the grants placed, refusals of members left out
        (the gang placed without them), why it was not placed (None: it was) and
        whether that is final (no other shard may try: it waits for its victims).
        Where the device plugin's nodes have no room, members asking extended resources
        that a DeviceClass maps are tried through DRA (extended.py)."""
        placed = self._place_once(gang, members)
        if placed[2] is None or placed[3]:
            return placed
        swapped = extended.variants(members, self.ledger.hosts)
        if swapped is None:
            return placed
        again = self._place_once(gang, swapped)
        if again[2] is None:
            return again
        return placed[0], placed[1], extended.told(placed[2], again[2]), placed[3]

    def _place_once(
        self, gang: ev.GangReady, members: list[GangMember]
    ) -> tuple[list[PodGrant], list[ev.AllocationFailed], Status | None, bool]:
        """One try of :meth:`_place`, the members as given."""
        key = gang.gang.key
        guard = self._keep_up(gang)
        waiting = self.room.waiting(key, time.time())
        if waiting:
            return [], [], Status(reasons=(Reason(kind="waiting", detail=waiting),)), True
        # Sharded, "larger than any card" would speak of this shard's cards only: each
        # node says it instead ("larger than the card"), counted over every shard.
        for m in members if not self.spans.shard else ():
            checked = self.placer.check(m.request)
            if not checked.ok:
                context = str(m.pod) if len(members) > 1 else ""
                return [], [], checked.with_context(context), False
        self.dra.begin()  # the core's search allocates ResourceClaims (dra.py)
        gone, _ = self.room.released.get(key, ((), 0.0))
        for uid in gone:  # its evicted pods' claims, not deallocated yet, are its to take
            self.dra.claimed.leave(uid)
        spot = self._spot(gang)
        if spot is not None:  # a moved pod's recreated self: the place kept for it
            self.room.placed(key)
            return [spot], [], None, False
        if gang.network_topology is not None:  # inside one HyperNode
            result = network.place_gang(
                self.placer,
                self.fabric.tree(),
                gang.network_topology,
                members,
                gang.min_member,
                owner=key,
                fragmentation_guard=guard,
                subgroups=gang.subgroups,
            )
        else:
            result = self.placer.place_gang(
                members,
                gang.min_member,
                owner=key,
                fragmentation_guard=guard,
                subgroups=gang.subgroups,
            )
        if result.ok:
            grants = [self.ledger.pods[p.pod.uid] for p in result.placed]
            self.dra.assume(grants)  # what the search took for their claims
            self.room.placed(key)
            extras = [
                outcomes.failed(gang, (f.pod,), f.status, self.refused) for f in result.failures
            ]
            return grants, extras, None, False
        last = result.failures[-1].status
        return [], [], result.status if gang.min_member > 1 else last, False

    def _spot(self, gang: ev.GangReady) -> PodGrant | None:
        """For a lone pod that replaces one moved by consolidation (same controller,
        same request): the place reserved for it, now its grant (shared/core/room.py)."""
        if len(gang.members) != 1 or not self.room.spots:
            return None
        p = gang.members[0]
        grant = self.room.take_spot(p.pod, p.owner, p.request, p.spec)
        if grant is not None:
            log.info("%s takes the place reserved on %s for the pod it replaces", p.pod, grant.node)
        return grant

    def _refuse(
        self, gang: ev.GangReady, members: list[GangMember], status: Status
    ) -> tuple[list[ev.Event], ev.AllocationFailed]:
        """The gang is not placed (by any shard it was offered to): room made for it on
        this shard's nodes where it may, and the refusal that tells its pods why."""
        if gang.tried is not None:
            status = combined([gang.tried, status])
        pods = tuple(m.pod for m in members)
        made = self.room.make_room(
            outcomes.unplaced(gang, members, self.guard),
            status,
            now=time.time(),
        )
        failed = outcomes.failed(gang, pods, status.with_note(made.note), self.refused)
        failed = msgspec.structs.replace(failed, nominated=made.nominated)
        return outcomes.room_made(gang, members, made, self.room.reserve_s), failed

    def _count(
        self,
        gang: ev.GangReady,
        placed: list[PodGrant],
        more: list[ev.Event],
        refused: list[ev.AllocationFailed],
        took_s: float,
    ) -> None:
        """The metrics of one placement attempt."""
        stats = self.stats
        stats.place_time.record(took_s)
        if placed:
            result = "placed"
        elif any(isinstance(e, ev.GangReady) for e in more):
            result = "passed"
        else:
            result = "unresolvable" if any(r.unresolvable for r in refused) else "unschedulable"
        stats.placements.add(1, {"result": result})
        for e in more:
            if isinstance(e, ev.AllocationPreempting):
                stats.preempted.add(sum(len(v.pods) for v in e.victims))
        if not placed:
            return
        now = time.time()
        for _ in placed:
            stats.stage.record(max(0.0, now - gang.emitted_at), {"stage": "decided"})
        created = [p.created_at for p in gang.members if p.created_at]
        if not gang.gang.lone and created:
            stats.job_latency.record(max(0.0, now - min(created)) * 1000)
