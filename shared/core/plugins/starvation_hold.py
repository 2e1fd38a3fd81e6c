"""StarvationHold: close to other gangs the nodes a long-waiting gang would fit on.

Smaller gangs are backfilled past one that does not fit; once it has waited past
``scheduler.starvationGuardS`` (the coordinator marks it ``hold``), the nodes it would
fit on after their pods finish, fewest pods first, are held for it: no other gang is
placed there until it is placed or the hold lapses (shared/core/room.py). A hold evicts
no one. Its reason, on the pods the held nodes refuse, names this plugin.
"""

from __future__ import annotations

from shared.core.framework import PostFilterPlugin
from shared.core.room import Made, Room, Unplaced
from shared.core.status import Status


class StarvationHold(PostFilterPlugin):
    """Holds nodes for a starved gang whose failure a change of load could cure."""

    name = "StarvationHold"

    def post_filter(self, room: Room, gang: Unplaced, status: Status, now: float) -> Made | None:
        """The nodes held for the gang (new, or renewed), as a note for its pods."""
        if not gang.hold or status.unresolvable:
            return None
        held, new = room.hold(gang, now)
        if not held:
            return None
        return Made(
            note=f"It has waited long: nodes {', '.join(held)} are held for it until "
            "their pods finish.",
            starved=tuple(held) if new else (),
        )
