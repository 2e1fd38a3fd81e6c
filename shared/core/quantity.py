"""Kubernetes resource quantities (``"4096"``, ``"20k"``, ``"500m"``, ``"1Gi"``) as exact numbers.

The API server canonicalises quantities: a pod written with ``nvidia.com/gpumem: 20000``
reads back as ``20k``. Device resources are whole numbers, so anything else is an error
for the caller to report.

Every function here raises ValueError, saying why, on anything that is not a quantity:
a value of another type, a string outside the grammar, NaN or an infinity, or a number
out of the range Tessera reads (:data:`LIMIT`, :data:`MAX_DIGITS`, :data:`MAX_EXPONENT`).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
"""Kubernetes' quantity grammar, with ASCII digits only as Kubernetes (a Unicode digit
class would read ``١٢`` as 12)."""
_SCALE: dict[str, tuple[int, int]] = {
    "": (1, 1),
    "n": (1, 10**9),
    "u": (1, 10**6),
    "m": (1, 1000),
    **{p: (1000**i, 1) for i, p in enumerate("kMGTPE", 1)},
    **{f"{p}i": (1024**i, 1) for i, p in enumerate("KMGTPE", 1)},
}
"""Each suffix as the fraction ``(numerator, denominator)`` it multiplies by."""

LIMIT = 10**30
"""Quantities of this magnitude or more are refused. Kubernetes reads a quantity as an
int64 (``Value``, ``MilliValue``: at most about 9.2e18) and caps a binary one there
when it parses it (the apimachinery release tools/go.mod pins); this bound is far
above, and keeps an absurd number (``1e3000000``) from costing seconds of arithmetic."""
MAX_DIGITS = 64
"""The most digits a quantity's number may have (Kubernetes keeps nine decimals)."""
MAX_EXPONENT = 64
"""The largest decimal exponent a quantity may have, either sign (``1e64``, ``1e-64``)."""


def _shown(value: object) -> str:
    """``value`` as an error message names it: a string or a number by its repr (cut to
    40 characters; an integer beyond :data:`LIMIT` by its size, as repr refuses a very
    long one), anything else by its type."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if abs(value) >= LIMIT:
            return f"an integer of {value.bit_length()} bits"
        return repr(value)
    if isinstance(value, float | str):
        text = repr(value)
        return text if len(text) <= 40 else text[:36] + "..." + text[0]
    return f"a value of type {type(value).__name__}"


def _fraction(value: object) -> tuple[int, int]:
    """The exact value of a quantity as ``(numerator, denominator)``, the sign on the
    numerator, with integer arithmetic only (the watcher reads every container of every
    pod: exact fractions were most of that cost). Raises ValueError saying why on
    anything else, or on a number out of range."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{_shown(value)} is not a quantity")
    if isinstance(value, int):
        num, den = value, 1
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a quantity: not a finite number")
        num, den = value.as_integer_ratio()
    else:
        match = _QUANTITY.match(value.strip())
        if match is None:
            raise ValueError(f"{_shown(value)} is not a quantity")
        sign, number, exponent, suffix = match.groups()
        whole, _, decimals = number.partition(".")
        if len(whole) + len(decimals) > MAX_DIGITS:
            raise ValueError(f"{_shown(value)} has more digits than a quantity may ({MAX_DIGITS})")
        num, den = _SCALE[suffix or ""]
        den *= 10 ** len(decimals)
        if exponent:
            power = exponent[1:].lstrip("+-").lstrip("0") or "0"
            if len(power) > 3 or int(power) > MAX_EXPONENT:
                raise ValueError(
                    f"{_shown(value)} is out of range (exponents go from -{MAX_EXPONENT} to "
                    f"{MAX_EXPONENT})"
                )
            scale: int = 10 ** int(power)
            if exponent[1] == "-":
                den *= scale
            else:
                num *= scale
        num *= int((whole or "0") + decimals)
        if sign == "-":
            num = -num
    if abs(num) >= LIMIT * den:
        raise ValueError(f"{_shown(value)} is out of range (a quantity must be below 1e30)")
    return num, den


def parse_quantity(value: object) -> Fraction:
    """The exact value of a quantity; raises ValueError on anything else."""
    num, den = _fraction(value)
    return Fraction(num, den)


def parse_whole(value: object) -> int:
    """A quantity that must be a whole number (device counts, MiB, percent)."""
    num, den = _fraction(value)
    if num % den:
        raise ValueError(f"{_shown(value)} is not a whole number")
    return num // den


_NANO: dict[str, int] = {}
"""Quantities already read (a cluster's pods repeat a few: ``500m``, ``1Gi``)."""
_NANO_KEPT = 4096


def parse_nano(value: object) -> int:
    """A quantity in billionths, rounded away from zero as Kubernetes' ``ParseQuantity``
    rounds to its nine decimals (``inf.RoundUp``, in the apimachinery release
    tools/go.mod pins: ``-1.5n`` reads as ``-2n``, and so does the JSON number
    ``-1.5e-9``). Raises ValueError on anything else."""
    if type(value) is str and (kept := _NANO.get(value)) is not None:
        return kept
    num, den = _fraction(value)
    nano = -(-abs(num) * 10**9 // den)
    nano = nano if num >= 0 else -nano
    if type(value) is str and len(_NANO) < _NANO_KEPT:
        _NANO[value] = nano
    return nano
