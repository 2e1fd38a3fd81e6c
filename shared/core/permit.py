"""Permit: parts of gangs reserved on this ledger, waiting for a decision made elsewhere.

kube-scheduler's Permit point lets a plugin answer *Wait*: the pod stays reserved while
it waits, and is then allowed (it binds) or rejected (it is unreserved), or its wait
times out (rejected). Tessera waits for one thing: a gang placed across allocator shards
(``scheduler.shards``, services/device_allocator/span.py). Each shard holds what fits
of the gang's pods left (:func:`hold_part`, one Statement) as one waiting permit
(:class:`Permits`); the shard that brings the gang to ``minMember`` allows every part
over the bus, the last shard of the route rejects them otherwise (:func:`verdict`), and a
part not decided by its deadline is rejected when the caller says the time has come
(``now`` is always given: nothing here reads a clock). Rejecting releases the part in
one Statement, so the ledger is as if it had never been held.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from shared.core.ledger import Ledger, PodGrant, Statement
from shared.core.model import GangKey, PodUID
from shared.core.placement import GangMember, Placer

log = logging.getLogger(__name__)

Ident = tuple[GangKey, int]
"""A gang placed across shards and its attempt."""

T = TypeVar("T")


@dataclass
class Waiting(Generic[T]):
    """One part of a gang, reserved here, waiting to be allowed or rejected."""

    about: T
    """What the caller keeps with it (the allocator: the gang's event)."""
    grants: list[PodGrant]
    until: float
    """When its wait times out (the caller's clock)."""


def hold_part(
    placer: Placer, members: Sequence[GangMember], owner: GangKey, guard: int
) -> list[PodGrant]:
    """Reserve what fits here of ``members`` (those not reserved already), one pod at a
    time (a part need not be whole), all in one Statement; the grants made."""
    ledger = placer.ledger
    grants = []
    with Statement(ledger) as st:
        for m in members:
            if m.pod.uid in ledger.pods:
                continue
            placed = placer.place_gang([m], 1, owner=owner, statement=st, fragmentation_guard=guard)
            if placed.ok:
                grants.append(ledger.pods[m.pod.uid])
        st.commit()
    return grants


def verdict(held: int, min_member: int, more: bool) -> Literal["allow", "pass", "reject"]:
    """What a shard does once its part is held: ``held`` pods are held across the shards
    so far; ``more``: shards are left on the gang's route. Allow every part at
    ``minMember``; else pass the rest on while a shard is left; else reject them all."""
    if held >= max(min_member, 1):
        return "allow"
    return "pass" if more else "reject"


class Permits(Generic[T]):
    """The waiting parts on one ledger, by gang and attempt."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.waiting: dict[Ident, Waiting[T]] = {}
        self.part_of: dict[PodUID, Ident] = {}
        """Each pod of a waiting part → its gang and attempt."""

    def wait(self, ident: Ident, grants: list[PodGrant], until: float, about: T) -> Waiting[T]:
        """``grants`` (reserved already) wait for ``ident``'s decision until ``until``."""
        held = self.waiting[ident] = Waiting(about, grants, until)
        for g in grants:
            self.part_of[g.pod.uid] = ident
        return held

    def allow(self, ident: Ident) -> Waiting[T] | None:
        """The part is allowed: it waits no more and its grants stay (the caller makes
        them durable and decides its pods); None if no such part waits here."""
        return self._end(ident)

    def reject(self, ident: Ident, why: str = "") -> Waiting[T] | None:
        """The part is rejected: its grants are released, in one Statement."""
        held = self._end(ident)
        if held is None:
            return None
        with Statement(self.ledger) as st:
            for g in held.grants:
                st.release(g.pod.uid)
            st.commit()
        if why:
            log.warning("part of gang %s (attempt %d) released: %s", *ident, why)
        return held

    def _end(self, ident: Ident) -> Waiting[T] | None:
        held = self.waiting.pop(ident, None)
        if held is not None:
            for g in held.grants:
                self.part_of.pop(g.pod.uid, None)
        return held

    def forget(self, uid: PodUID) -> None:
        """``uid`` was released elsewhere (deleted, its bind failed): its part no longer
        holds it."""
        ident = self.part_of.pop(uid, None)
        if ident is not None and (held := self.waiting.get(ident)) is not None:
            held.grants = [g for g in held.grants if g.pod.uid != uid]

    def expire(self, now: float, why: str) -> list[Ident]:
        """Reject every part whose wait has timed out by ``now``; their idents."""
        due = [ident for ident, held in self.waiting.items() if held.until <= now]
        for ident in due:
            self.reject(ident, why)
        return due
