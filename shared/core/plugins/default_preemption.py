"""DefaultPreemption: evict the fewest, cheapest pods that let a gang fit.

kube-scheduler's PostFilter of that name, for a whole gang: the coordinator offers the
bound pods that may go (lower priority; across queues only reclaimable ones, and pods of
queues over their deserved share: shared/core/preemption.py ``victims``), and
``preemption.plan`` finds the smallest set whose eviction places the gang on the ledger.
A gang with a pod of ``preemptionPolicy: Never`` evicts no one and is told so in
kube-scheduler's words. Left out of the profile, no gang preempts (the coordinator then
offers no victims).
"""

from __future__ import annotations

from shared.core.framework import PostFilterPlugin
from shared.core.preemption import NOT_ELIGIBLE, eligible
from shared.core.room import Made, Room, Unplaced
from shared.core.status import Status


class DefaultPreemption(PostFilterPlugin):
    """Preempts for a gang whose failure a change of load could cure."""

    name = "DefaultPreemption"

    def post_filter(self, room: Room, gang: Unplaced, status: Status, now: float) -> Made | None:
        """Pods to evict for the gang, or the note that it may evict no one."""
        if not eligible(gang.policies):
            return Made(note=NOT_ELIGIBLE)
        if not gang.victims or status.unresolvable:
            return None
        return room.preempt(gang, now)
