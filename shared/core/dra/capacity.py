"""Consumable capacity: what a request consumes of a device, and whether it fits.

The pinned release's structured allocator (tools/go.mod: k8s.io/dynamic-resource-
allocation, the variant the scheduler picks when ``DRAConsumableCapacity`` is on, as it
is by default in 1.36) rounds each capacity a request asks for up by the capacity's
request policy, refuses a device whose policy the rounded amount breaks, and counts
what every share of a shared device consumes. The rules, as that release applies them:

- a capacity the request does not name consumes the policy's ``default``, else the
  whole ``value``;
- with a ``validRange``: below ``min`` rounds to ``min``; with a ``step``, up to the
  next ``min + k * step`` (on whole numbers: a fraction is first rounded up to one);
  above ``max`` breaks the policy;
- with ``validValues``: up to the first value not below it; above the last breaks it;
- the amount equal to the ``default`` never breaks the policy;
- a request naming a capacity the device lacks does not fit the device;
- what is consumed already, what this pod's other claims take and this amount must
  stay within ``value``.

:func:`refusal` says in words why a request breaks a policy, for people.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from shared.core.dra.model import Capacity

Amounts = Mapping[str, Fraction]


def _whole(value: Fraction) -> int:
    """A quantity as a whole number, rounded up (what Kubernetes' ``Value()`` gives)."""
    return math.ceil(value)


def _trunc_mod(a: int, b: int) -> int:
    """``a % b`` with the sign of ``a`` (Go's remainder)."""
    return a - b * int(a / b) if b else 0


def consumed(requested: Fraction | None, cap: Capacity) -> Fraction:
    """What a request for ``requested`` (None: not named) consumes of ``cap``."""
    if requested is None:
        return cap.default if cap.default is not None else cap.value
    if cap.range is not None:
        low = cap.range.min
        if requested < low:
            return low
        if cap.range.step is None:
            return requested
        step, base = _whole(cap.range.step), _whole(low)
        added = _whole(requested) - base
        n = int(added / step)
        if _trunc_mod(added, step):
            n += 1
        return Fraction(base + step * n)
    if cap.values:
        for value in cap.values:
            if requested <= value:
                return value
    return requested


def breaks_policy(amount: Fraction, cap: Capacity) -> bool:
    """``amount`` (already rounded) is outside ``cap``'s request policy."""
    if cap.default is not None and amount == cap.default:
        return False
    if cap.range is not None:
        if cap.range.max is not None and amount > cap.range.max:
            return True
        if cap.range.step is not None:
            added = _whole(amount) - _whole(cap.range.min)
            return _trunc_mod(added, _whole(cap.range.step)) != 0
        return False
    if cap.values:
        return amount not in cap.values
    return False


def demand(
    requests: Amounts | None, capacity: Mapping[str, Capacity]
) -> dict[str, Fraction] | None:
    """What a request consumes of each of a device's capacities, or None when no amount
    of free capacity would do: a capacity the device lacks, or a policy broken."""
    if requests and any(name not in capacity for name in requests):
        return None
    out = {}
    for name, cap in capacity.items():
        amount = consumed(None if requests is None else requests.get(name), cap)
        if breaks_policy(amount, cap):
            return None
        out[name] = amount
    return out


def room(
    need: Mapping[str, Fraction],
    capacity: Mapping[str, Capacity],
    used: Amounts | None,
    allocating: Amounts | None,
) -> bool:
    """``need`` (from :func:`demand`) fits beside what is ``used`` already and what the
    claims being allocated with it take (``allocating``)."""
    for name, amount in need.items():
        total = amount
        if used and name in used:
            total += used[name]
        if allocating and name in allocating:
            total += allocating[name]
        if total > capacity[name].value:
            return False
    return True


def fits(
    requests: Amounts | None,
    capacity: Mapping[str, Capacity],
    used: Amounts | None,
    allocating: Amounts | None,
) -> bool:
    """A request's capacities fit a device that has ``used`` consumed already and
    ``allocating`` taken by the claims being allocated with it."""
    need = demand(requests, capacity)
    return need is not None and room(need, capacity, used, allocating)


def consumption(requests: Amounts | None, capacity: Mapping[str, Capacity]) -> dict[str, Fraction]:
    """What a share consumes of each of a shared device's capacities."""
    return {
        name: consumed(None if requests is None else requests.get(name), cap)
        for name, cap in capacity.items()
    }


def shown(value: Fraction | None) -> str:
    """An amount as people write quantities: ``4Gi``, ``1500k``... (exact)."""
    if value is None:
        return "none"
    if value.denominator != 1:
        milli = value * 1000
        return f"{milli.numerator}m" if milli.denominator == 1 else str(float(value))
    whole = value.numerator
    for suffix, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if whole and whole % size == 0:
            return f"{whole // size}{suffix}"
    for suffix, size in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if whole and whole % size == 0:
            return f"{whole // size}{suffix}"
    return str(whole)


def refusal(requests: Amounts | None, capacity: Mapping[str, Capacity]) -> str:
    """Why a request cannot be served by a device whatever is free ('' if it can be):
    a capacity the device lacks, an amount its request policy refuses, more than the
    device has."""
    for name in requests or {}:
        if name not in capacity:
            return f"capacity {name!r} is not one of the device's ({', '.join(sorted(capacity))})"
    for name, cap in capacity.items():
        asked = None if requests is None else requests.get(name)
        amount = consumed(asked, cap)
        what = shown(amount) if asked in (None, amount) else f"{shown(asked)} (rounded up to "
        what = what if asked in (None, amount) else what + f"{shown(amount)})"
        if breaks_policy(amount, cap):
            if cap.range is not None:
                low, high = shown(cap.range.min), shown(cap.range.max)
                step = f", step {shown(cap.range.step)}" if cap.range.step else ""
                return (
                    f"capacity {name!r}: {what} is outside the request policy's range "
                    f"({low} to {high}{step})"
                )
            valid = ", ".join(shown(v) for v in cap.values)
            return f"capacity {name!r}: {what} is not one of the valid values ({valid})"
        if amount > cap.value:
            return f"capacity {name!r}: {what} is more than the device has ({shown(cap.value)})"
    return ""
