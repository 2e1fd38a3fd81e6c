"""The events the allocator publishes, built from the core's answers.

One ``AllocationDecided`` per placed pod, an ``AllocationFailed`` per refusal (with how
many nodes run another config), and, from room made for a gang that does not fit
(shared/core/room.py ``Made``), its ``AllocationPreempting``; from nominations that lapsed
(``Lapsed``), an ``AllocationReleased`` per device given back. Each is logged as it is
built; nothing here changes the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from shared import events as ev
from shared.core.ledger import PodGrant
from shared.core.model import GangKey, NodeName, PodRef
from shared.core.placement import GangMember
from shared.core.room import Lapsed, Made, Unplaced
from shared.core.status import Status

log = logging.getLogger(__name__)


def member(p: ev.PodPending) -> GangMember:
    """A pod of a gang's event, as the core places it."""
    group = GangKey(namespace=p.pod.namespace, name=p.group) if p.group else None
    return GangMember(pod=p.pod, request=p.request, group=group, spec=p.spec)


def decided(
    grant: PodGrant, gang: ev.GangReady, claims: tuple[ev.ClaimAllocation, ...] = ()
) -> ev.AllocationDecided:
    """The decision for one placed pod of ``gang``, with the ResourceClaims allocated
    for it (services/device_allocator/dra.py)."""
    lone = gang.min_member <= 1 and len(gang.members) == 1
    created = next((p.created_at for p in gang.members if p.pod.uid == grant.pod.uid), 0.0)
    return ev.AllocationDecided(
        pod=grant.pod,
        node=grant.node,
        grants=grant.containers,
        gang=None if lone else gang.gang,
        attempt=gang.attempt,
        created_at=created,
        claims=claims,
    )


def failed(
    gang: ev.GangReady, pods: tuple[PodRef, ...], status: Status, refused: Collection[str]
) -> ev.AllocationFailed:
    """``pods`` of ``gang`` are not placed, for ``status``; ``refused``: the nodes that
    run another config (counted in the message)."""
    if refused:
        status = status.with_note(f"({len(refused)} node(s) refused: they run another config)")
    return ev.AllocationFailed.of(pods, status, gang=gang.gang, attempt=gang.attempt)


def unplaced(gang: ev.GangReady, members: list[GangMember], guard: int) -> Unplaced:
    """``gang`` as making room for it reads it (``members``: its pods still to place;
    ``guard``: the fragmentation guard it was placed with)."""
    return Unplaced(
        key=gang.gang.key,
        members=members,
        min_member=gang.min_member,
        policies=tuple(p.preemption_policy for p in gang.members),
        victims=gang.victims,
        budgets=gang.budgets,
        hold=gang.hold,
        fragmentation_guard=guard,
        protected_s=gang.protected_s,
        subgroups=gang.subgroups,
        movable=gang.movable,
    )


def room_made(
    gang: ev.GangReady, members: list[GangMember], made: Made, reserved_s: float = 0.0
) -> list[ev.Event]:
    """What room made for ``gang`` publishes: its ``AllocationPreempting``, if it preempts."""
    key = gang.gang.key
    if made.starved:
        log.info("gang %s has starved: holding %s for it", key, ", ".join(made.starved))
    found = made.preempting
    if found is None:
        return []
    log.info(
        "preempting %d pod(s) for gang %s on %s: %s",
        len(found.pods),
        key,
        ", ".join(found.nodes),
        "; ".join(f"{', '.join(str(p) for p in v.pods)} ({v.why})" for v in found.victims),
    )
    return [
        ev.AllocationPreempting(
            gang=gang.gang,
            preemptor=tuple(m.pod for m in members),
            victims=found.victims,
            nodes=found.nodes,
            attempt=gang.attempt,
            moves=found.moves,
            reserved_s=reserved_s if found.moves else 0.0,
        )
    ]


def kept_for(pod: PodRef, node: NodeName, owner: GangKey) -> ev.AllocationReleased:
    """A preempted pod is gone, the last of its gang's victims: its devices on ``node``
    are kept for the gang ``owner``."""
    return ev.AllocationReleased(
        pod=pod, node=node, reason=f"preempted; its devices are kept for gang {owner}"
    )


def lapsed(ended: Lapsed) -> list[ev.AllocationReleased]:
    """The devices that lapsed nominations give back, one release each."""
    for key in ended.freed:
        log.info("nomination of gang %s lapsed: its devices are free again", key)
    for key in ended.holds:
        log.info("hold of gang %s lapsed", key)
    for grant in ended.spots:
        log.info("place reserved for moved pod %s on %s lapsed unused", grant.pod, grant.node)
    return [
        *(
            ev.AllocationReleased(
                pod=grant.pod, node=grant.node, reason="preempted (nomination lapsed)"
            )
            for grants in ended.freed.values()
            for grant in grants
        ),
        *(
            ev.AllocationReleased(
                pod=grant.pod, node=grant.node, reason="moved pod's reserved place lapsed unused"
            )
            for grant in ended.spots
        ),
    ]
