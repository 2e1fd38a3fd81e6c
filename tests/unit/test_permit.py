"""Permit (shared/core/permit.py): parts of a gang placed across shards, held on the
pure core's ledger until allowed, rejected or timed out, with the time given."""

from __future__ import annotations

from shared.core.ledger import Ledger
from shared.core.model import GangKey
from shared.core.permit import Permits, hold_part, verdict
from shared.core.placement import GangMember
from tests.unit.corekit import gpus, place, placer, ref, request

WHOLE = {"nvidia.com/gpu": 1}
GANG = GangKey(namespace="ns", name="g")
NOW = 1_000.0


def used(ledger: Ledger) -> tuple[tuple[str, int, int], ...]:
    """Every card's memory and share count in use, and the pods held."""
    cards = tuple(
        (d.uuid, d.used_mem, d.used_slots) for n in ledger.nodes.values() for d in n.devices
    )
    return (*cards, ("pods", len(ledger.pods), 0))


def members(n: int) -> list[GangMember]:
    return [GangMember(pod=ref(), request=request(WHOLE)) for _ in range(n)]


def test_a_part_holds_what_fits_here_and_no_more() -> None:
    pl = placer({"a": gpus(2), "b": gpus(1)})
    wanted = members(5)
    grants = hold_part(pl, wanted, GANG, 16)
    assert [g.pod for g in grants] == [m.pod for m in wanted[:3]]  # three cards here
    assert hold_part(pl, wanted, GANG, 16) == []  # those held are not held twice


def test_the_shard_that_reaches_min_member_allows_the_last_rejects() -> None:
    assert verdict(4, 4, more=True) == "allow"
    assert verdict(4, 4, more=False) == "allow"
    assert verdict(3, 4, more=True) == "pass"
    assert verdict(3, 4, more=False) == "reject"
    assert verdict(1, 0, more=False) == "allow"  # a gang of no minMember needs one pod


def test_allowed_parts_keep_their_grants_rejected_ones_leave_the_ledger_as_before() -> None:
    pl = placer({"a": gpus(2)})
    place(pl, WHOLE)
    before = used(pl.ledger)
    permits: Permits[str] = Permits(pl.ledger)
    first = permits.wait((GANG, 1), hold_part(pl, members(1), GANG, 16), NOW + 10, "first")
    assert permits.part_of == {first.grants[0].pod.uid: (GANG, 1)}
    rejected = permits.reject((GANG, 1))
    assert rejected is first
    assert used(pl.ledger) == before
    assert (permits.waiting, permits.part_of) == ({}, {})
    assert permits.reject((GANG, 1)) is None  # idempotent

    second = permits.wait((GANG, 2), hold_part(pl, members(1), GANG, 16), NOW + 10, "second")
    allowed = permits.allow((GANG, 2))
    assert allowed is second
    assert allowed.about == "second"
    assert allowed.grants[0].pod.uid in pl.ledger.pods  # the caller makes it durable
    assert permits.waiting == {}


def test_a_part_not_decided_in_time_is_rejected_at_the_time_given() -> None:
    pl = placer({"a": gpus(2)})
    before = used(pl.ledger)
    permits: Permits[None] = Permits(pl.ledger)
    held = permits.wait((GANG, 1), hold_part(pl, members(2), GANG, 16), NOW + 10, None)
    gone = held.grants[0].pod.uid
    pl.ledger.release(gone)  # deleted meanwhile
    permits.forget(gone)
    assert len(held.grants) == 1
    assert gone not in {g.pod.uid for g in held.grants}
    assert permits.expire(NOW + 9.9, "late") == []
    assert permits.expire(NOW + 10, "late") == [(GANG, 1)]
    assert used(pl.ledger) == before
