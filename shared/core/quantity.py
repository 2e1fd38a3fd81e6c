"""Kubernetes resource quantities (``"4096"``, ``"20k"``, ``"500m"``, ``"1Gi"``) as exact numbers.

The API server canonicalises quantities: a pod written with ``nvidia.com/gpumem: 20000``
reads back as ``20k``. Device resources are whole numbers, so anything else is an error
for the caller to report.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    **{p: Fraction(1000**i) for i, p in enumerate("kMGTPE", 1)},
    **{f"{p}i": Fraction(1024**i) for i, p in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(
    r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


def parse_quantity(value: object) -> Fraction:
    """The exact value of a quantity; raises ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a quantity")
    sign, number, exponent, suffix = match.groups()
    result = Fraction(number)
    if exponent:
        result *= Fraction(10) ** int(exponent[1:])
    elif suffix:
        result *= _SUFFIX[suffix]
    return -result if sign == "-" else result


def parse_whole(value: object) -> int:
    """A quantity that must be a whole number (device counts, MiB, percent)."""
    q = parse_quantity(value)
    if q.denominator != 1:
        raise ValueError(f"{value!r} is not a whole number")
    return int(q)


_SCALE: dict[str, tuple[int, int]] = {
    "": (1, 1),
    "n": (1, 10**9),
    "u": (1, 10**6),
    "m": (1, 1000),
    **{p: (1000**i, 1) for i, p in enumerate("kMGTPE", 1)},
    **{f"{p}i": (1024**i, 1) for i, p in enumerate("KMGTPE", 1)},
}


def parse_nano(value: object) -> int:
    """A quantity in billionths, rounded up (Kubernetes keeps nine decimals), with
    integer arithmetic only: the watcher reads every container of every pod, and exact
    fractions were most of that cost. Raises ValueError on anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return value * 10**9
    if isinstance(value, float):
        return math.ceil(Fraction(value) * 10**9)
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a quantity")
    sign, number, exponent, suffix = match.groups()
    whole, _, decimals = number.partition(".")
    digits = int((whole or "0") + decimals)
    num, den = _SCALE[suffix or ""]
    den *= 10 ** len(decimals)
    if exponent:
        power = int(exponent[1:])
        scale: int = 10 ** abs(power)
        if power >= 0:
            num *= scale
        else:
            den *= scale
    nano: int = -(-digits * num * 10**9 // den)
    return -nano if sign == "-" else nano
