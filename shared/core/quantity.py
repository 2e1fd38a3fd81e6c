"""Kubernetes resource quantities (``"4096"``, ``"20k"``, ``"500m"``, ``"1Gi"``) as exact numbers.

The API server canonicalises quantities: a pod written with ``nvidia.com/gpumem: 20000``
reads back as ``20k``. Device resources are whole numbers, so anything else is an error
for the caller to report.
"""

from __future__ import annotations

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
