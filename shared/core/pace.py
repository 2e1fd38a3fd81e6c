"""How many nodes the fragmentation guard weighs per pod, given how far behind the
scheduler is: a choice that depends on load, made here from its inputs alone (no clock
is read), so a placement can be replayed from what it was given.

The allocator (services/device_allocator/gangs.py) asks before each gang and passes the
answer to ``Placer.place_gang`` (``fragmentation_guard``).
"""

from __future__ import annotations

BEHIND_S = 1.0
"""A gang that reaches the allocator this long after it was sent finds it behind: the
fragmentation guard's window narrows to ``NARROW_GUARD`` until it catches up."""
LATE_S = 3.0
"""So does a gang whose newest pod was created this long before (``creationTimestamp``
has one-second resolution): pods queue before the allocator too, in the API server,
the watcher or the coordinator, and CPU spent weighing nodes is taken from them."""
OPEN_BEHIND = 256
"""So does holding more reservations than this that no binder has confirmed: the pods
wait downstream (the binder, the API server), and the allocator's CPU is theirs."""
NARROW_GUARD = 0
"""Behind, no window at all: binpack's first fit and HAMi's device choice (a window of 2
still weighed each node's cards by FGD and cost 4 times a first fit, bench/RESULTS.md)."""


def fragmentation_guard(
    configured: int,
    *,
    now: float,
    emitted_at: float,
    attempt: int,
    newest_created: float,
    open_binds: int,
) -> int:
    """The guard to place a gang with. Behind a burst, pack a little less well and keep
    up: ``configured`` (``scheduler.fragmentationGuard``, 16: some 20 times the cost of
    a first fit for pods with cpu and memory, bench/RESULTS.md) while gangs come in
    time, and ``NARROW_GUARD`` while they wait in the stream (sent at ``emitted_at``),
    reach it late after their newest pod was created (``newest_created``, 0 when
    unknown; a first ``attempt`` only: a retried pod is old), or while more than
    ``OPEN_BEHIND`` decisions (``open_binds``) wait to be bound. Times are seconds
    since the epoch."""
    if (
        now - emitted_at > BEHIND_S
        or (attempt == 1 and newest_created and now - newest_created > LATE_S)
        or open_binds > OPEN_BEHIND
    ):
        return min(configured, NARROW_GUARD)
    return configured
