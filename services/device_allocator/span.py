"""A gang placed across allocator shards: this shard's side, over the bus.

With ``scheduler.shards`` (shared/core/shards.py), a gang no shard can place whole goes
round the shards again (:meth:`Span.onward`), to be placed across them. The decisions
are the core's Permit (shared/core/permit.py): each shard holds what it can of the pods
left as a waiting permit (in the ledger, not yet durable or published) and, as
``permit.verdict`` says, passes the rest on, or publishes ``GangSpan`` to allow every
part (each shard then makes its own durable and decides its pods), or, on the last
shard, to reject them (and tells the pods what every shard found). A part never decided
is rejected after ``SPAN_HOLD_S``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

import msgspec

from services.device_allocator.outcomes import decided, failed, member
from services.device_allocator.reservations import Reservations
from shared import events as ev
from shared.core.model import PodUID
from shared.core.permit import Permits, hold_part, verdict
from shared.core.placement import Placer
from shared.core.status import Code, Status, combined
from shared.runtime import Runtime

log = logging.getLogger(__name__)

SPAN_HOLD_S = 10.0
"""A shard's uncommitted part of a gang placed across shards is released after this."""


class Span:
    """This shard's parts of gangs placed across shards, held until decided."""

    def __init__(
        self,
        rt: Runtime,
        placer: Placer,
        reserved: Reservations,
        shard: str,
        refused: Collection[str],
    ) -> None:
        self.rt = rt
        self.placer = placer
        self.reserved = reserved
        self.shard = shard
        self.refused = refused
        """The nodes refused for their config (services/device_allocator/nodes.py)."""
        self.permits: Permits[ev.GangReady] = Permits(placer.ledger)
        """This shard's parts of gangs placed across shards, waiting (deadlines in
        ``time.monotonic()``)."""

    def repeat(self, gang: ev.GangReady) -> bool:
        """Is ``gang`` being placed across shards already (a repeat)? A part held for
        an earlier attempt of one of its pods is released: its gang was sent again."""
        for p in gang.members:
            part = self.permits.part_of.get(p.pod.uid)
            if part == (gang.gang.key, gang.attempt):
                return True
            if part is not None:
                self.permits.reject(part, "its gang was sent again")
        return False

    def onward(self, gang: ev.GangReady, status: Status) -> ev.GangReady | None:
        """The gang passed on to the next shard of its route; or, past the last one, a
        gang of several pods goes round the shards again to be placed across them
        (starting here); None when there is nowhere left to try."""
        if not self.shard:
            return None
        tried = status if gang.tried is None else combined([gang.tried, status])
        if gang.route:
            return self._pass(gang, gang.route, tried=tried)
        # A gang of subgroups is not split across shards: a part would not know
        # which of its subgroups the other parts hold whole.
        if len(gang.members) > 1 and len(gang.offered) > 1 and gang.subgroups is None:
            rest = tuple(s for s in gang.offered if s != self.shard)
            return self._pass(gang, (self.shard, *rest), tried=tried, spanning=())
        return None

    def _pass(self, gang: ev.GangReady, route: tuple[str, ...], **changes: Any) -> ev.GangReady:
        """``gang`` for the first shard of ``route``, a new event. Passed on again after
        a redelivery, it is stored once: its ``dedup_id`` names the gang, attempt,
        members, shard and parts held (shared/events.py), not its event id."""
        return msgspec.structs.replace(
            gang, event_id=ev.new_id(), shard=route[0], route=route[1:], **changes
        )

    async def place(self, gang: ev.GangReady, guard: int, now: float) -> None:
        """Second pass: hold what fits here of the pods left (``guard``: the
        fragmentation guard in force; ``now``: ``time.monotonic()``), then commit (the
        gang has its minMember), pass the rest on, or abort (the last shard)."""
        key = gang.gang.key
        ident = (key, gang.attempt)
        held = self.permits.waiting.get(ident)
        if held is None:  # not a repeat: hold what fits
            members = [member(p) for p in gang.members]
            grants = hold_part(self.placer, members, key, guard)
            if grants:
                held = self.permits.wait(ident, grants, now + SPAN_HOLD_S, gang)
        here = tuple(g.pod for g in held.grants) if held is not None else ()
        assert gang.spanning is not None
        parts = gang.spanning + ((ev.SpanPart(shard=self.shard, pods=here),) if here else ())
        count = sum(len(p.pods) for p in parts)
        rest = tuple(m for m in gang.members if m.pod not in here)
        tried = gang.tried or Status(code=Code.UNSCHEDULABLE)
        out: list[ev.Event] = []

        def span_decided(commit: bool) -> ev.GangSpan:
            return ev.GangSpan(gang=gang.gang, attempt=gang.attempt, commit=commit, parts=parts)

        step = verdict(count, gang.min_member, bool(gang.route))
        if step == "allow":
            log.info(
                "gang %s placed across shards %s",
                key,
                ", ".join(f"{p.shard} ({len(p.pods)})" for p in parts),
            )
            out.append(span_decided(True))
            # Left out, as extras.
            out += [failed(gang, (m.pod,), tried, self.refused) for m in rest]
        elif step == "pass":
            out.append(self._pass(gang, gang.route, members=rest, spanning=parts))
        else:
            out.append(span_decided(False))
            pods = (*(p for part in parts for p in part.pods), *(m.pod for m in rest))
            note = (
                f"Placed across every shard, {count} of its pods fit; minMember is "
                f"{gang.min_member}."
            )
            refusal = failed(gang, pods, tried.with_note(note), self.refused)
            log.info("not placed (waits): %s: %s", ", ".join(map(str, pods)), refusal.message)
            out.append(refusal)
        await self.rt.bus.publish_many(out)

    async def decide(self, event: ev.GangSpan) -> None:
        """A gang placed across shards is committed (this shard reserves its part and
        decides its pods) or aborted (its part is released)."""
        ident = (event.gang.key, event.attempt)
        if not event.commit:
            self.permits.reject(ident)
            return
        held = self.permits.allow(ident)
        if held is None:
            return
        await asyncio.gather(*(self.reserved.put(g, event.attempt) for g in held.grants))
        await self.rt.bus.publish_many([decided(g, held.about) for g in held.grants])

    def forget(self, uid: PodUID) -> None:
        """``uid`` is released (deleted, its bind failed): no part holds it any more."""
        self.permits.forget(uid)

    def lapse(self, now: float) -> None:
        """Reject the parts not decided by ``now`` (``time.monotonic()``)."""
        self.permits.expire(now, f"not committed within {SPAN_HOLD_S:.0f}s")
