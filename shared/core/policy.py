"""Placement policies as parameters: binpack, spread, and fragmentation gradient descent.

Device level (inside one node), HAMi's score decides: after adding the request, a device
scores ``slots_used/slots + cores_used/cores + mem_used/mem``; binpack takes the fullest
device, spread the emptiest.

Node level, binpack and spread are the order in which the ledger's index is walked
(tightest free memory first, or emptiest first; see shared/core/ledger.py), so the first
node that fits is the policy's choice and no node is scored at all.

``fgd`` follows Weng et al., "Beware of Fragmentation" (USENIX ATC '23): the fragmentation
of a node for a task shape is the free GPU share the shape cannot use there (all of it
when the task does not fit at all; otherwise the free share of the devices too small for
it); a node's expected fragmentation weighs that over the observed task shapes, and the
placement that increases it least is chosen, at node and at device level.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared.core.model import Policy

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Shape:
    """A task shape: ``count`` devices each needing ``fraction`` (1.0 = whole) of a device."""

    count: int
    fraction: float


@dataclass
class Workload:
    """The observed distribution of task shapes (weights need not sum to 1)."""

    weights: dict[Shape, float] = field(default_factory=dict)
    _memo: dict[tuple[float, ...], float] = field(default_factory=dict, repr=False, compare=False)
    """Expected fragmentation by a node's free shares: nodes share few states, so each
    is weighed once per distribution (this made FGD over the openb trace ~N x faster)."""

    @classmethod
    def of(cls, shapes: Iterable[tuple[Shape, float]]) -> Workload:
        w = cls()
        for shape, weight in shapes:
            w.weights[shape] = w.weights.get(shape, 0.0) + weight
        return w

    def observe(self, shape: Shape, weight: float = 1.0) -> None:
        self.weights[shape] = self.weights.get(shape, 0.0) + weight
        self._memo.clear()

    def fragmentation(self, free: Iterable[float]) -> float:
        """``fragmentation`` of a node with these free shares under this distribution."""
        key = tuple(sorted(round(f, 6) for f in free))
        known = self._memo.get(key)
        if known is None:
            known = self._memo[key] = fragmentation(key, self.normalised())
        return known

    def normalised(self) -> list[tuple[Shape, float]]:
        total = sum(self.weights.values())
        if total <= 0:
            return [(Shape(1, 1.0), 1.0)]
        return [(s, w / total) for s, w in self.weights.items()]


def shape_fraction(memory_fraction: float, core_fraction: float, exclusive: bool) -> float:
    """The share of one device a request takes, rounded to 1/20 so shapes stay few."""
    if exclusive:
        return 1.0
    raw = max(memory_fraction, core_fraction, 0.0)
    return min(1.0, max(0.05, round(raw * 20) / 20))


def fragmentation(free: Sequence[float], shapes: Sequence[tuple[Shape, float]]) -> float:
    """Expected fragmentation of one node whose devices have ``free`` shares (0..1)."""
    total_free = sum(free)
    if total_free <= EPS:
        return 0.0
    result = 0.0
    for shape, weight in shapes:
        d = shape.fraction
        if d < 1.0 - EPS:
            usable = [f for f in free if f >= d - EPS]
            if len(usable) < shape.count:
                result += weight * total_free
            else:
                result += weight * sum(f for f in free if f < d - EPS)
        else:
            whole = sum(1 for f in free if f >= 1.0 - EPS)
            if whole < shape.count:
                result += weight * total_free
            else:
                result += weight * sum(f for f in free if f < 1.0 - EPS)
    return result


def device_score(
    used_slots: int, slots: int, used_cores: int, total_cores: int, used_mem: int, total_mem: int
) -> float:
    """HAMi's device score after placement: higher is fuller."""
    score = used_slots / slots if slots else 0.0
    if total_cores:
        score += used_cores / total_cores
    if total_mem:
        score += used_mem / total_mem
    return score


def prefer_high(policy: Policy) -> bool:
    """True when the policy takes the fullest candidate (binpack), False for the emptiest."""
    return policy == "binpack"
