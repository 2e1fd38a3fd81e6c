"""``resource.k8s.io/v1`` objects (decoded JSON) in and out of the DRA records.

In: a node's pools from the cluster's ResourceSlices (:func:`node_pools`), a
DeviceClass (:func:`class_record`), a ResourceClaim (:func:`claim_record`), and what
the allocated claims hold (:func:`in_use`). Out: an allocation as ``status.allocation``
(:func:`allocation_json`). A malformed quantity raises ValueError naming it
(shared/core/quantity.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any

from shared.core.dra.model import (
    Allocation,
    Attribute,
    AttributeKind,
    Capacity,
    Claim,
    Constraint,
    Device,
    DeviceClass,
    DeviceKey,
    DeviceRequest,
    InUse,
    Pool,
    Range,
    Request,
    Slice,
    Taint,
    Toleration,
)
from shared.core.hosts import node_terms
from shared.core.quantity import parse_quantity

_KINDS: tuple[tuple[str, AttributeKind], ...] = (
    ("int", "int"),
    ("bool", "bool"),
    ("string", "string"),
    ("version", "version"),
)


def _q(value: object) -> Fraction:
    return parse_quantity(value)


def _capacity(raw: Mapping[str, Any]) -> Capacity:
    policy = raw.get("requestPolicy") or {}
    valid_range = policy.get("validRange")
    return Capacity(
        value=_q(raw.get("value", 0)),
        default=_q(policy["default"]) if policy.get("default") is not None else None,
        range=None
        if valid_range is None
        else Range(
            min=_q(valid_range.get("min", 0)),
            max=_q(valid_range["max"]) if valid_range.get("max") is not None else None,
            step=_q(valid_range["step"]) if valid_range.get("step") is not None else None,
        ),
        values=tuple(_q(v) for v in policy.get("validValues") or ()),
    )


def _attribute(raw: Mapping[str, Any]) -> Attribute | None:
    for field, kind in _KINDS:
        if raw.get(field) is not None:
            return Attribute(kind, raw[field])
    return None


def device_record(raw: Mapping[str, Any]) -> Device:
    """One ``spec.devices[]`` entry of a ResourceSlice."""
    attributes = {}
    for name, value in (raw.get("attributes") or {}).items():
        if (attribute := _attribute(value)) is not None:
            attributes[str(name)] = attribute
    return Device(
        name=str(raw.get("name", "")),
        attributes=attributes,
        capacity={str(k): _capacity(v) for k, v in (raw.get("capacity") or {}).items()},
        shared=bool(raw.get("allowMultipleAllocations")),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
            for t in raw.get("taints") or ()
        ),
        binding_conditions=tuple(raw.get("bindingConditions") or ()),
        binding_failure_conditions=tuple(raw.get("bindingFailureConditions") or ()),
        binds_to_node=bool(raw.get("bindsToNode")),
        node_name=str(raw.get("nodeName") or ""),
        node_selector=raw.get("nodeSelector"),
        counters=tuple(
            (
                str(c.get("counterSet", "")),
                {str(k): _q(v.get("value", 0)) for k, v in (c.get("counters") or {}).items()},
            )
            for c in raw.get("consumesCounters") or ()
        ),
    )


def _targets(spec: Mapping[str, Any], node: str, labels: Mapping[str, str]) -> bool:
    """The slice (or a device, with per-device node selection) reaches the node."""
    if spec.get("perDeviceNodeSelection"):
        return any(_targets(d, node, labels) for d in spec.get("devices") or ())
    if spec.get("nodeName"):
        return bool(spec["nodeName"] == node)
    if spec.get("allNodes"):
        return True
    if spec.get("nodeSelector") is not None:
        return any(t.matches(node, labels) for t in node_terms(spec["nodeSelector"]))
    return False


def _generation(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation", 0))


def node_pools(
    slices: Iterable[Mapping[str, Any]], node: str, labels: Mapping[str, str] | None = None
) -> list[Pool]:
    """The pools ``node`` sees among the cluster's slices: per driver and pool, the
    slices of the newest generation that target the node (a slice of shared counters
    targets every node); a pool whose newest generation has fewer slices than its
    ``resourceSliceCount`` is incomplete, one whose node slices are older than another
    slice of it is left out."""
    every: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    mine: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver", "")), str(pool.get("name", "")))
        every.setdefault(key, []).append(obj)
        if spec.get("sharedCounters") or _targets(spec, node, labels or {}):
            mine.setdefault(key, []).append(obj)
    pools = []
    for key, objs in mine.items():
        newest = max(_generation(o) for o in objs)
        current = [o for o in objs if _generation(o) == newest]
        wanted = int(current[0]["spec"]["pool"].get("resourceSliceCount", 1))
        others: list[Mapping[str, Any]] = []
        if len(current) != wanted:
            if any(_generation(o) > newest for o in every[key]):
                continue
            at_newest = [o for o in every[key] if _generation(o) == newest]
            if len(at_newest) != wanted:
                pools.append(Pool(driver=key[0], name=key[1], slices=(), incomplete=True))
                continue
            names = {_name(o) for o in current}
            others = [o for o in at_newest if _name(o) not in names]
        pools.append(_pool(key, current, others, node, labels or {}))
    return pools


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _pool(
    key: tuple[str, str],
    current: list[Mapping[str, Any]],
    others: list[Mapping[str, Any]],
    node: str,
    labels: Mapping[str, str],
) -> Pool:
    """One complete pool, checked as the allocator checks it."""
    current = sorted(current, key=_name)
    counter_sets: dict[str, dict[str, Fraction]] = {}
    device_slices = []
    invalid = ""
    for o in current:
        shared = o["spec"].get("sharedCounters")
        if not shared:
            device_slices.append(o)
            continue
        for counter_set in shared:
            name = str(counter_set.get("name", ""))
            if name in counter_sets:
                invalid = invalid or f"duplicate counter set name {name}"
            counter_sets[name] = {
                str(k): _q(v.get("value", 0))
                for k, v in (counter_set.get("counters") or {}).items()
            }
    made = [
        Slice(
            name=_name(o),
            devices=tuple(device_record(d) for d in o["spec"].get("devices") or ()),
            node_name=str(o["spec"].get("nodeName") or ""),
            node_selector=o["spec"].get("nodeSelector"),
            per_device=bool(o["spec"].get("perDeviceNodeSelection")),
            here=frozenset(
                str(d.get("name", ""))
                for d in o["spec"].get("devices") or ()
                if o["spec"].get("perDeviceNodeSelection") and _targets(d, node, labels)
            ),
        )
        for o in device_slices
    ]
    elsewhere = tuple(device_record(d) for o in others for d in o["spec"].get("devices") or ())
    seen: set[str] = set()
    for device in (d for s in made for d in s.devices):
        if device.name in seen and not invalid:
            invalid = f"duplicate device name {device.name}"
        seen.add(device.name)
    if not invalid:
        invalid = _counter_problem(counter_sets, [d for s in made for d in s.devices])
    if not invalid:
        invalid = _counter_problem(counter_sets, list(elsewhere))
    if invalid:
        return Pool(driver=key[0], name=key[1], slices=(), invalid=invalid)
    return Pool(
        driver=key[0],
        name=key[1],
        slices=tuple(made),
        counter_sets=counter_sets,
        elsewhere=elsewhere,
    )


def _counter_problem(sets: Mapping[str, Mapping[str, Fraction]], devices: list[Device]) -> str:
    for device in devices:
        for name, amounts in device.counters:
            if name not in sets:
                return f"counter set {name} not found"
            for counter in amounts:
                if counter not in sets[name]:
                    return f"counter {counter} not found in counter set {name}"
    return ""


def class_record(obj: Mapping[str, Any]) -> DeviceClass:
    """A DeviceClass."""
    spec = obj.get("spec") or {}
    return DeviceClass(
        name=str((obj.get("metadata") or {}).get("name", "")),
        selectors=tuple(
            str((s.get("cel") or {}).get("expression", "")) for s in spec.get("selectors") or ()
        ),
        config=tuple(spec.get("config") or ()),
        extended_resource_name=str(spec.get("extendedResourceName") or ""),
    )


def _request(raw: Mapping[str, Any], name: str, sub: bool = False) -> Request:
    """``exactly`` or a subrequest (which has no ``adminAccess`` in resource.k8s.io/v1)."""
    amounts = (raw.get("capacity") or {}).get("requests")
    return Request(
        name=name,
        device_class=str(raw.get("deviceClassName", "")),
        selectors=tuple(
            str((s.get("cel") or {}).get("expression", "")) for s in raw.get("selectors") or ()
        ),
        all=raw.get("allocationMode") == "All",
        count=int(raw.get("count") or 1),
        admin_access=not sub and bool(raw.get("adminAccess")),
        tolerations=tuple(
            Toleration(
                str(t.get("key", "")),
                str(t.get("operator") or "Equal"),
                str(t.get("value", "")),
                str(t.get("effect", "")),
            )
            for t in raw.get("tolerations") or ()
        ),
        capacity=None if amounts is None else {str(k): _q(v) for k, v in amounts.items()},
    )


def claim_record(obj: Mapping[str, Any]) -> Claim:
    """A ResourceClaim's ``spec.devices``."""
    meta = obj.get("metadata") or {}
    devices = (obj.get("spec") or {}).get("devices") or {}
    requests = []
    for raw in devices.get("requests") or ():
        name = str(raw.get("name", ""))
        if raw.get("exactly") is not None:
            requests.append(DeviceRequest(name, exactly=_request(raw["exactly"], name)))
        else:
            subs = tuple(
                _request(s, str(s.get("name", "")), sub=True)
                for s in raw.get("firstAvailable") or ()
            )
            requests.append(DeviceRequest(name, first_available=subs))
    constraints = []
    for raw in devices.get("constraints") or ():
        names = frozenset(str(n) for n in raw.get("requests") or ())
        if raw.get("matchAttribute"):
            constraints.append(Constraint(str(raw["matchAttribute"]), False, names))
        elif raw.get("distinctAttribute"):
            constraints.append(Constraint(str(raw["distinctAttribute"]), True, names))
    return Claim(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        requests=tuple(requests),
        constraints=tuple(constraints),
        config=tuple(
            (tuple(str(n) for n in c.get("requests") or ()), c) for c in devices.get("config") or ()
        ),
    )


def in_use(claims: Iterable[Mapping[str, Any]]) -> InUse:
    """What the allocated claims hold: a result with a ``shareID`` is a share (its
    ``consumedCapacity`` summed per device), one with admin access holds nothing, any
    other holds its device."""
    devices: set[DeviceKey] = set()
    consumed: dict[DeviceKey, dict[str, Fraction]] = {}
    shares: dict[DeviceKey, int] = {}
    for obj in claims:
        allocation = (obj.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or ():
            if r.get("adminAccess"):
                continue
            key = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
            if r.get("shareID") is None:
                devices.add(key)
                continue
            shares[key] = shares.get(key, 0) + 1
            if r.get("consumedCapacity") is not None:
                into = consumed.setdefault(key, {})
                for name, amount in r["consumedCapacity"].items():
                    into[name] = into.get(name, Fraction(0)) + _q(amount)
    return InUse(frozenset(devices), consumed, shares)


def quantity_text(value: Fraction) -> str:
    """An exact amount as a quantity string (whole, else milli, else nano rounded up)."""
    if value.denominator == 1:
        return str(value.numerator)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return f"{-(-value.numerator * 10**9 // value.denominator)}n"


def allocation_json(allocation: Allocation, share_id: Callable[[], str]) -> dict[str, Any]:
    """``status.allocation`` for one claim; ``share_id`` makes a fresh share's UID."""
    results = []
    for r in allocation.results:
        out: dict[str, Any] = {
            "request": r.request,
            "driver": r.driver,
            "pool": r.pool,
            "device": r.device,
        }
        if r.admin_access is not None:
            out["adminAccess"] = r.admin_access
        if r.tolerations:
            out["tolerations"] = [
                {
                    k: v
                    for k, v in (
                        ("key", t.key),
                        ("operator", t.operator),
                        ("value", t.value),
                        ("effect", t.effect),
                    )
                    if v
                }
                for t in r.tolerations
            ]
        if r.share:
            out["shareID"] = share_id()
        if r.consumed:
            out["consumedCapacity"] = {k: quantity_text(v) for k, v in r.consumed.items()}
        if r.binding_conditions:
            out["bindingConditions"] = list(r.binding_conditions)
        if r.binding_failure_conditions:
            out["bindingFailureConditions"] = list(r.binding_failure_conditions)
        results.append(out)
    devices: dict[str, Any] = {"results": results}
    if allocation.config:
        devices["config"] = [
            {"source": source, "requests": list(names), **_entry(entry)}
            for source, names, entry in allocation.config
        ]
    result: dict[str, Any] = {"devices": devices}
    if allocation.node_selector is not None:
        result["nodeSelector"] = allocation.node_selector
    return result


def _entry(entry: object) -> dict[str, Any]:
    """A config entry's configuration (``opaque``), without its ``requests``."""
    if isinstance(entry, Mapping):
        return {k: v for k, v in entry.items() if k != "requests"}
    return {}
