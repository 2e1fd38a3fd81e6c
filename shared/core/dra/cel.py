"""DRA device selectors: CEL expressions over one device, with Kubernetes' libraries.

A selector (a DeviceClass's or a request's ``selectors[].cel.expression``) sees one
variable, ``device``: ``driver``, ``allowMultipleAllocations``, ``attributes`` and
``capacity``, the last two as maps of domain to maps of name to value. An attribute or
capacity the slice names without a domain (``index``) is in the driver's domain
(``device.attributes["gpu.tessera.io"].index``), one written ``domain/name`` in that
domain. A domain the device has nothing in reads as an empty map, so
``device.attributes["other.io"].x`` fails as a missing key does, and ``has(...)`` is
false. Versions are semantic versions, capacities quantities, each with Kubernetes'
functions: ``quantity()``, ``isQuantity()``, ``semver()``, ``isSemver()``, and the
methods ``isGreaterThan``, ``isLessThan``, ``compareTo``, ``major``/``minor``/``patch``,
``add``/``sub``/``asInteger``/``isInteger``/``asApproximateFloat``/``sign``; and the
string helpers ``lowerAscii``, ``upperAscii``, ``trim``, ``split``, ``indexOf``.
Values of different types are unequal (``==`` is false) and numbers of different types
compare by value (``1 < 1.5``), as in Kubernetes' CEL.

The library is ``cel-python`` (module ``celpy``), pure Python and maintained, chosen
over the Rust-backed ``common-expression-language`` because Kubernetes' selectors call
methods on values of Kubernetes' own types (``version.isGreaterThan(semver("1.2.3"))``)
and ``celpy`` dispatches a method call to a plain Python function given the receiver,
where the Rust binding offers functions over its built-in types only. It does not
type-check: an expression Kubernetes refuses when compiling it for its types
(``device.driver + 1``) fails here when evaluated instead; both are errors that stop
the scheduling attempt (shared/core/dra/allocate.py).

Compiled expressions are cached by their text (:func:`compile_selector`), and a
selector's answer for a device by the text and the device record (:func:`selects`):
the records of a node's slices are read once per slice change and kept, so a class's
selectors run once per device, not once per pod and node.
"""

from __future__ import annotations

import functools
import operator
import re
import sys
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes

from shared.core.dra.model import Attribute, Device
from shared.core.quantity import parse_quantity

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)
"""Semantic version 2.0.0, strictly (what Kubernetes' version attributes must be)."""


class SelectorError(Exception):
    """A selector that does not compile, or fails or gives no bool on a device."""


class Semver:
    """A semantic version, ordered as semver 2.0.0 orders them (build metadata aside)."""

    __slots__ = ("core", "pre", "text")

    def __init__(self, text: str) -> None:
        match = _SEMVER.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a semantic version")
        self.text = text
        self.core = (int(match[1]), int(match[2]), int(match[3]))
        self.pre: tuple[tuple[int, int | str], ...] = tuple(
            (0, int(p)) if p.isdigit() else (1, p) for p in (match[4] or "").split(".") if p
        )

    def _key(self) -> tuple[Any, ...]:
        # A version without a pre-release ranks above any with one.
        return (self.core, not self.pre, self.pre)

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 as this version is lower, the same or higher."""
        mine, theirs = self._key(), other._key()
        return (mine > theirs) - (mine < theirs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash(self.core)


class Quantity:
    """A Kubernetes quantity, as an exact number."""

    __slots__ = ("value",)

    def __init__(self, value: Fraction) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _quantity(text: object) -> Quantity:
    try:
        return Quantity(parse_quantity(str(text)))
    except ValueError as e:
        raise ValueError(f"quantity: {e}") from None


def _is_quantity(text: object) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver(text: object, normalize: object = False) -> Semver:
    value = str(text)
    if normalize:
        # Kubernetes' normalizing parse: an optional "v", missing minor and patch as 0,
        # leading zeros dropped from the three numbers.
        value = value.removeprefix("v")
        cut = min((i for i in (value.find("-"), value.find("+")) if i >= 0), default=len(value))
        core, rest = value[:cut], value[cut:]
        parts = [str(int(p)) if p.isdigit() else p for p in core.split(".")]
        value = ".".join([*parts, "0", "0"][:3] if len(parts) <= 3 else parts) + rest
    return Semver(value)


def _is_semver(text: object, normalize: object = False) -> celtypes.BoolType:
    try:
        _semver(text, normalize)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(a: object, b: object) -> int:
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    raise TypeError(f"no such overload: compare {type(a).__name__} with {type(b).__name__}")


def _amount(b: object) -> Fraction:
    if isinstance(b, Quantity):
        return b.value
    if isinstance(b, int) and not isinstance(b, bool):
        return Fraction(int(b))
    raise TypeError(f"no such overload: quantity arithmetic with {type(b).__name__}")


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value.denominator != 1 or not -(2**63) <= q.value < 2**63:
        raise ValueError("cannot convert value to integer")
    return celtypes.IntType(int(q.value))


def _equal(a: object, b: object) -> celtypes.BoolType:
    """Equality across types is false (Kubernetes' CEL), not an error; numbers compare
    by value whatever their type. An error on either side stays an error."""
    for side in (a, b):
        if isinstance(side, Exception):
            return side  # type: ignore[return-value]
    if isinstance(a, bool) != isinstance(b, bool):
        return celtypes.BoolType(False)
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return celtypes.BoolType(_plain(a) == _plain(b))
    if type(a) is not type(b) and not (isinstance(a, str) and isinstance(b, str)):
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            return celtypes.BoolType(a == b)
        if isinstance(a, list) and isinstance(b, list):
            return celtypes.BoolType(a == b)
        return celtypes.BoolType(False)
    return celtypes.BoolType(a == b)


def _plain(number: object) -> int | float:
    """A CEL number as Python's own (celpy's refuse to compare across types)."""
    return int(number) if isinstance(number, int) else float(number)  # type: ignore[arg-type]


def _ordered(name: str) -> Callable[[object, object], object]:
    """``<``, ``<=``, ``>``, ``>=`` with numbers of different types compared by value
    (Kubernetes' CEL compares ``1 < 1.5``); anything else as celpy compares it."""
    default = celpy.evaluation.base_functions[name]
    test = {"_<_": operator.lt, "_<=_": operator.le, "_>_": operator.gt, "_>=_": operator.ge}[name]

    def compare(a: object, b: object) -> object:
        numbers = (int, float)
        if (
            isinstance(a, numbers)
            and isinstance(b, numbers)
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and type(a) is not type(b)
        ):
            return celtypes.BoolType(test(_plain(a), _plain(b)))
        return default(a, b)

    return compare


def _unequal(a: object, b: object) -> celtypes.BoolType:
    same = _equal(a, b)
    return same if isinstance(same, Exception) else celtypes.BoolType(not same)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "major": lambda v: celtypes.IntType(v.core[0]),
    "minor": lambda v: celtypes.IntType(v.core[1]),
    "patch": lambda v: celtypes.IntType(v.core[2]),
    "add": lambda a, b: Quantity(a.value + _amount(b)),
    "sub": lambda a, b: Quantity(a.value - _amount(b)),
    "asInteger": _as_integer,
    "isInteger": lambda q: celtypes.BoolType(
        q.value.denominator == 1 and -(2**63) <= q.value < 2**63
    ),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "lowerAscii": lambda s: celtypes.StringType(
        "".join(c.lower() if c.isascii() else c for c in s)
    ),
    "upperAscii": lambda s: celtypes.StringType(
        "".join(c.upper() if c.isascii() else c for c in s)
    ),
    "trim": lambda s: celtypes.StringType(s.strip()),
    "split": lambda s, sep: celtypes.ListType([celtypes.StringType(p) for p in s.split(sep)]),
    "indexOf": lambda s, sub: celtypes.IntType(s.find(sub)),
    "_==_": _equal,
    "_!=_": _unequal,
    **{name: _ordered(name) for name in ("_<_", "_<=_", "_>_", "_>=_")},
}

_LIMIT = sys.getrecursionlimit()
_ENV = celpy.Environment()
# celpy's Environment raises the interpreter's recursion limit for the whole process
# (to 2,500); every other reader of nested input (events, config, inventories:
# tests/unit/test_fuzz.py) counts on the default to refuse what nests too deep.
sys.setrecursionlimit(_LIMIT)


class Selector:
    """One compiled selector: ``error`` is why it does not compile ('' if it does)."""

    __slots__ = ("error", "program", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.error = ""
        self.program: celpy.Runner | None = None
        if not text.strip():
            self.error = "compilation failed: empty expression"
            return
        try:
            self.program = _ENV.program(_ENV.compile(text), functions=FUNCTIONS)
        except Exception as e:  # celpy's parser raises several types
            self.error = "compilation failed: " + " ".join(str(e).split())

    def matches(self, device: celtypes.MapType) -> bool:
        """The selector on one device (see :func:`activation`); raises SelectorError."""
        if self.program is None:
            raise SelectorError(f"CEL compile error: {self.error}")
        try:
            result = self.program.evaluate({"device": device})
        except Exception as e:
            raise SelectorError(f"CEL runtime error: {_brief(e)}") from None
        if isinstance(result, Exception):
            raise SelectorError(f"CEL runtime error: {_brief(result)}")
        if not isinstance(result, celtypes.BoolType):
            raise SelectorError(
                f"CEL result of type {type(result).__name__} could not be converted to bool"
            )
        return bool(result)


def _brief(error: BaseException) -> str:
    if error.args and isinstance(error.args[0], str):
        return error.args[0]
    return str(error)


@functools.lru_cache(maxsize=4096)
def compile_selector(text: str) -> Selector:
    """The compiled selector for ``text``, cached."""
    return Selector(text)


def _value(attribute: Attribute) -> Any:
    match attribute.kind:
        case "int":
            return celtypes.IntType(int(attribute.value))
        case "bool":
            return celtypes.BoolType(bool(attribute.value))
        case "version":
            return Semver(str(attribute.value))
        case _:
            return celtypes.StringType(str(attribute.value))


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, sep, rest = name.partition("/")
    return (domain, rest) if sep else (driver, name)


class _Domains(celtypes.MapType):
    """Domain → names; a domain the device lacks reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


def activation(driver: str, device: Device) -> celtypes.MapType:
    """The ``device`` variable a selector sees. Raises SelectorError on a version
    attribute that is not a semantic version (the slice is then broken)."""
    attributes: dict[str, dict[celtypes.StringType, Any]] = {}
    for name, attribute in device.attributes.items():
        domain, short = _split(name, driver)
        try:
            value = _value(attribute)
        except ValueError as e:
            raise SelectorError(
                f"CEL runtime error: attribute {name}: parse semantic version: {e}"
            ) from None
        attributes.setdefault(domain, {})[celtypes.StringType(short)] = value
    capacity: dict[str, dict[celtypes.StringType, Any]] = {}
    for name, cap in device.capacity.items():
        domain, short = _split(name, driver)
        capacity.setdefault(domain, {})[celtypes.StringType(short)] = Quantity(cap.value)
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.shared),
            celtypes.StringType("attributes"): _Domains(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in attributes.items()}
            ),
            celtypes.StringType("capacity"): _Domains(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in capacity.items()}
            ),
        }
    )


_KEPT = 1 << 18
"""How many (selector, device) answers :func:`selects` keeps before starting afresh."""
_ANSWERS: dict[tuple[str, str, int], tuple[Device, bool | str]] = {}
_VIEWS: dict[tuple[str, int], tuple[Device, celtypes.MapType | str]] = {}


def selects(text: str, driver: str, device: Device) -> bool:
    """Selector ``text`` on ``device`` of ``driver``; raises SelectorError. Answers are
    remembered per device record (kept alive by the memo, so its id is not reused)."""
    key = (text, driver, id(device))
    known = _ANSWERS.get(key)
    if known is None:
        try:
            answer: bool | str = compile_selector(text).matches(_view(driver, device))
        except SelectorError as e:
            answer = str(e)
        if len(_ANSWERS) >= _KEPT:
            _ANSWERS.clear()
        known = _ANSWERS[key] = (device, answer)
    if isinstance(known[1], str):
        raise SelectorError(known[1])
    return known[1]


def _view(driver: str, device: Device) -> celtypes.MapType:
    key = (driver, id(device))
    known = _VIEWS.get(key)
    if known is None:
        try:
            view: celtypes.MapType | str = activation(driver, device)
        except SelectorError as e:
            view = str(e)
        if len(_VIEWS) >= _KEPT:
            _VIEWS.clear()
        known = _VIEWS[key] = (device, view)
    if isinstance(known[1], str):
        raise SelectorError(known[1])
    return known[1]
