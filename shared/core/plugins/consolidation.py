"""Consolidation: move shared-GPU pods elsewhere so that a gang fits, before preempting.

A PostFilter ahead of DefaultPreemption: for a gang that no change of load could not
cure, with movable pods offered by the coordinator (shared/core/consolidation.py
``movable``), ``Room.consolidate`` plans the moves and reserves each moved pod's new
place before any is evicted (shared/core/room.py). A move restarts a pod but keeps it
running somewhere, so it is preferred to an eviction for good: preemption runs only
when no move makes room. A gang refused for a reason the moves cannot cure (its request,
a selector) moves no one; one that would not fit even after the moves, or whose moved pods
would have nowhere to go, moves no one and is told why. Left out of the profile
(``scheduler.consolidation.enabled: false``, the default), no pod is moved.
"""

from __future__ import annotations

from shared.core.framework import PostFilterPlugin
from shared.core.preemption import eligible
from shared.core.room import Made, Room, Unplaced
from shared.core.status import Status


class Consolidation(PostFilterPlugin):
    """Moves shared-GPU pods for a gang whose failure a change of load could cure."""

    name = "Consolidation"

    def post_filter(self, room: Room, gang: Unplaced, status: Status, now: float) -> Made | None:
        """Pods to move for the gang (with their new places reserved), a note on why
        none can, or None when none is offered."""
        if status.unresolvable or not gang.movable or not eligible(gang.policies):
            return None
        return room.consolidate(gang, now)
