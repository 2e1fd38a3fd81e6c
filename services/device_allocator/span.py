"""A gang placed across allocator shards: this shard's side of the two-phase protocol.

With ``scheduler.shards`` (shared/core/shards.py), a gang no shard can place whole goes
round the shards again (:meth:`Span.onward`), to be placed across them: each shard holds
what it can of the pods left (``holding``: in the ledger, not yet reserved or published)
and passes the rest on; the shard that brings the gang to ``minMember`` publishes
``GangSpan`` to commit every part (each shard then reserves and decides its own),
the last one aborts them otherwise (and tells the pods what every shard found). A hold
that is never decided lapses after ``SPAN_HOLD_S``. A shard's part is granted in one
statement (shared/core/ledger.py), and released in one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import msgspec

from services.device_allocator.outcomes import decided, failed
from services.device_allocator.reservations import Reservations
from shared import events as ev
from shared.core.ledger import Ledger, PodGrant, Statement
from shared.core.model import GangKey, PodUID
from shared.core.placement import GangMember, Placer
from shared.core.status import Code, Status, combined
from shared.runtime import Runtime

log = logging.getLogger(__name__)

SPAN_HOLD_S = 10.0
"""A shard's uncommitted part of a gang placed across shards is released after this."""

Ident = tuple[GangKey, int]
"""A gang placed across shards and its attempt."""


@dataclass
class Held:
    """This shard's uncommitted part of a gang placed across shards."""

    gang: ev.GangReady
    grants: list[PodGrant]
    until: float
    """When it lapses (``time.monotonic()``)."""


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
        self.ledger: Ledger = placer.ledger
        self.reserved = reserved
        self.shard = shard
        self.refused = refused
        """The nodes refused for their config (services/device_allocator/nodes.py)."""
        self.holding: dict[Ident, Held] = {}
        """Parts of gangs placed across shards, by gang and attempt, not yet decided."""
        self.tentative: dict[PodUID, Ident] = {}
        """Each pod of those parts → its gang and attempt."""

    def repeat(self, gang: ev.GangReady) -> bool:
        """Is ``gang`` being placed across shards already (a repeat)? A part held for
        an earlier attempt of one of its pods is released: its gang was sent again."""
        for p in gang.members:
            part = self.tentative.get(p.pod.uid)
            if part == (gang.gang.key, gang.attempt):
                return True
            if part is not None:
                self.drop(part, "its gang was sent again")
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
        if len(gang.members) > 1 and len(gang.offered) > 1:
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

    def _hold(self, gang: ev.GangReady, guard: int, until: float) -> Held | None:
        """Place what fits here of the pods left, one pod at a time, in one statement."""
        key = gang.gang.key
        grants = []
        with Statement(self.ledger) as st:
            for p in gang.members:
                if p.pod.uid in self.ledger.pods:
                    continue
                group = GangKey(namespace=p.pod.namespace, name=p.group) if p.group else None
                member = GangMember(pod=p.pod, request=p.request, group=group, spec=p.spec)
                placed = self.placer.place_gang(
                    [member], 1, owner=key, statement=st, fragmentation_guard=guard
                )
                if placed.ok:
                    grants.append(self.ledger.pods[p.pod.uid])
            st.commit()
        if not grants:
            return None
        held = self.holding[(key, gang.attempt)] = Held(gang, grants, until)
        for g in grants:
            self.tentative[g.pod.uid] = (key, gang.attempt)
        return held

    async def place(self, gang: ev.GangReady, guard: int, now: float) -> None:
        """Second pass: hold what fits here of the pods left (``guard``: the
        fragmentation guard in force; ``now``: ``time.monotonic()``), then commit (the
        gang has its minMember), pass the rest on, or abort (the last shard)."""
        key = gang.gang.key
        held = self.holding.get((key, gang.attempt))
        if held is None:  # not a repeat: place what fits
            held = self._hold(gang, guard, now + SPAN_HOLD_S)
        here = tuple(g.pod for g in held.grants) if held is not None else ()
        assert gang.spanning is not None
        parts = gang.spanning + ((ev.SpanPart(shard=self.shard, pods=here),) if here else ())
        count = sum(len(p.pods) for p in parts)
        rest = tuple(m for m in gang.members if m.pod not in here)
        tried = gang.tried or Status(code=Code.UNSCHEDULABLE)
        out: list[ev.Event] = []

        def span_decided(commit: bool) -> ev.GangSpan:
            return ev.GangSpan(gang=gang.gang, attempt=gang.attempt, commit=commit, parts=parts)

        if count >= max(gang.min_member, 1):
            log.info(
                "gang %s placed across shards %s",
                key,
                ", ".join(f"{p.shard} ({len(p.pods)})" for p in parts),
            )
            out.append(span_decided(True))
            # Left out, as extras.
            out += [failed(gang, (m.pod,), tried, self.refused) for m in rest]
        elif gang.route:
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
        held = self.drop((event.gang.key, event.attempt), "", release=not event.commit)
        if held is None or not event.commit:
            return
        await asyncio.gather(*(self.reserved.put(g, event.attempt) for g in held.grants))
        await self.rt.bus.publish_many([decided(g, held.gang) for g in held.grants])

    def drop(self, ident: Ident, why: str, *, release: bool = True) -> Held | None:
        """Forget this shard's part of a gang placed across shards (and release it, in
        one statement)."""
        held = self.holding.pop(ident, None)
        if held is None:
            return None
        for g in held.grants:
            self.tentative.pop(g.pod.uid, None)
        if release:
            with Statement(self.ledger) as st:
                for g in held.grants:
                    st.release(g.pod.uid)
                st.commit()
        if why:
            log.warning("part of gang %s (attempt %d) on this shard released: %s", *ident, why)
        return held

    def forget(self, uid: PodUID) -> None:
        """``uid`` is released (deleted, its bind failed): no part holds it any more."""
        part = self.tentative.pop(uid, None)
        if part is not None and (holding := self.holding.get(part)) is not None:
            holding.grants = [g for g in holding.grants if g.pod.uid != uid]

    def lapse(self, now: float) -> None:
        """Release the parts not committed by ``now`` (``time.monotonic()``)."""
        for ident, held in list(self.holding.items()):
            if held.until <= now:
                self.drop(ident, f"not committed within {SPAN_HOLD_S:.0f}s")
