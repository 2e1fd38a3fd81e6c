"""DefaultPreemption: evict the fewest, cheapest pods that let a gang fit.

kube-scheduler's PostFilter of that name, for a whole gang: the coordinator offers the
bound pods that may go (lower priority; across queues only reclaimable ones, and pods of
queues over their deserved share: shared/core/preemption.py ``victims``), and
``preemption.plan`` finds the smallest set whose eviction places the gang on the ledger.
A gang with a pod of ``preemptionPolicy: Never`` evicts no one and is told so in
kube-scheduler's words. A pod that has not run its minimum runtime (a queue's
``preemptMinRuntime`` or ``reclaimMinRuntime``, ``scheduler.preemptMinRuntimeS`` and
``reclaimMinRuntimeS`` by default, or its own ``volcano.sh/cooldown-time``) is never
offered; a gang that only such pods could make room for is told when the first may go.
Left out of the profile, no gang preempts (the coordinator then offers no victims).
"""

from __future__ import annotations

import datetime as dt
import math

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
        if status.unresolvable:
            return None
        made = room.preempt(gang, now) if gang.victims else None
        if made is None and gang.protected_s > 0:
            return Made(note=protected_note(gang.protected_s, now))
        return made


def protected_note(left_s: float, now: float) -> str:
    """What a gang is told when the pods that could make room have not run their minimum
    runtime yet (``now``: Unix seconds)."""
    ends = dt.datetime.fromtimestamp(now + left_s, dt.UTC).strftime("%H:%M:%S")
    return (
        "Pods that could make room are protected by their minimum runtime: the first may "
        f"be evicted in {math.ceil(left_s)}s (at {ends} UTC)."
    )
