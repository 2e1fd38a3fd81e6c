"""Shared counters (partitionable devices): what a pool's counter sets have left for one
node attempt.

A pool may publish counter sets (``sharedCounters``), and each of its devices may draw
on them while allocated (``consumesCounters``): the partitions of one card draw on the
card's memory slices, so two overlapping partitions cannot both be allocated. What is
left is each counter's value less what every allocated device of the pool draws (on
this node's slices or another's), less what the devices chosen in this attempt draw;
the allocator refuses a device when any counter of its pool would go below zero. A
shared device already holding a share draws nothing more (its first share drew it).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from shared.core.dra.model import Device, InUse, Pool

Sets = dict[str, dict[str, Fraction]]


class Counters:
    """One node attempt's counter bookkeeping, pool by pool (pools by their index in
    the search's order)."""

    def __init__(self, pools: list[Pool], in_use: InUse) -> None:
        self.pools, self.in_use = pools, in_use
        self.left: dict[int, Sets] = {}
        self.drawn: dict[int, Sets] = {}

    def _available(self, p: int) -> Sets:
        if p in self.left:
            return self.left[p]
        pool = self.pools[p]
        left = {name: dict(counters) for name, counters in pool.counter_sets.items()}
        devices = [d for s in pool.slices for d in s.devices] + list(pool.elsewhere)
        for device in devices:
            if not self.in_use.holds((pool.driver, pool.name, device.name)):
                continue
            for name, amounts in device.counters:
                into = left.get(name)
                for counter, amount in amounts.items():
                    if into is not None and counter in into:
                        into[counter] -= amount
        self.left[p] = left
        return left

    def reserve(self, p: int, device: Device) -> bool:
        """Draws ``device``'s counters for this attempt; False (nothing drawn) when a
        counter of the pool would go below zero."""
        left = self._available(p)
        drawn = self.drawn.setdefault(p, {})
        _draw(drawn, device.counters, +1)
        for name, counters in left.items():
            taken = drawn.get(name, {})
            if any(value < taken.get(counter, 0) for counter, value in counters.items()):
                _draw(drawn, device.counters, -1)
                return False
        return True

    def release(self, p: int, device: Device) -> None:
        """Gives back what :meth:`reserve` drew for ``device``."""
        _draw(self.drawn[p], device.counters, -1)


def _draw(into: Sets, counters: tuple[tuple[str, Mapping[str, Fraction]], ...], sign: int) -> None:
    for name, amounts in counters:
        target = into.setdefault(name, {})
        for counter, amount in amounts.items():
            target[counter] = target.get(counter, Fraction(0)) + sign * amount
