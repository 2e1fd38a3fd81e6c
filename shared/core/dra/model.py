"""The records the DRA allocator reads and writes: devices of a node's ResourceSlices,
DeviceClasses, ResourceClaims, what is already in use, and an allocation.

Each is the handful of ``resource.k8s.io/v1`` fields the allocation decision reads,
frozen, so that one pod's claims can be decided against many nodes without copies
(shared/core/dra/read.py turns API objects into them). Quantities are exact
:class:`~fractions.Fraction` values (shared/core/quantity.py reads them).

:class:`InUse` is the one input that changes as pods come and go: the devices held
whole and the capacity consumed on shared devices, by allocated claims. It is a plain
value the caller keeps in its ledger, next to the device-plugin grants, and passes in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal

import msgspec

AttributeKind = Literal["int", "bool", "string", "version"]
DeviceKey = tuple[str, str, str]
"""A device's identity on the cluster: (driver, pool, device)."""
ALLOCATION_RESULTS_MAX = 32
"""The most devices one claim may be allocated (``AllocationResultsMaxSize`` in the
resource.k8s.io/v1 API the pinned release serves)."""


class Attribute(msgspec.Struct, frozen=True):
    """One device attribute: its kind (one of the four the API allows a slice to
    publish) and its value; a version is its semantic-version text."""

    kind: AttributeKind
    value: int | bool | str


class Range(msgspec.Struct, frozen=True):
    """``requestPolicy.validRange``: a request is rounded up to ``min + k * step``."""

    min: Fraction
    max: Fraction | None = None
    step: Fraction | None = None


class Capacity(msgspec.Struct, frozen=True):
    """One capacity of a device, with its request policy (at most one of ``range`` and
    ``values``; ``values`` sorted ascending, as the API requires)."""

    value: Fraction
    default: Fraction | None = None
    range: Range | None = None
    values: tuple[Fraction, ...] = ()


class Taint(msgspec.Struct, frozen=True):
    """A device taint; only ``NoSchedule`` and ``NoExecute`` keep a device from a claim."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


class Toleration(msgspec.Struct, frozen=True):
    """A request's toleration of device taints (``operator``: Exists or Equal)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


class Device(msgspec.Struct, frozen=True):
    """One device of a slice. ``attributes`` and ``capacity`` are keyed as the slice
    writes them: a name without a domain is in the driver's domain."""

    name: str
    attributes: Mapping[str, Attribute] = {}
    capacity: Mapping[str, Capacity] = {}
    shared: bool = False
    """``allowMultipleAllocations``: several claims may hold it, each consuming capacity."""
    taints: tuple[Taint, ...] = ()
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    binds_to_node: bool = False
    node_name: str = ""
    """Its own ``nodeName`` (a slice with per-device node selection)."""
    node_selector: Mapping[str, Any] | None = None
    """Its own ``nodeSelector`` (a slice with per-device node selection)."""
    counters: tuple[tuple[str, Mapping[str, Fraction]], ...] = ()
    """``consumesCounters``: (counter set, amounts) it draws on its pool's shared
    counters while allocated (partitionable devices)."""


class Slice(msgspec.Struct, frozen=True):
    """One ResourceSlice of a pool that targets the node (``spec.nodeName`` or a node
    selector or ``allNodes`` that takes it; the caller filters)."""

    name: str
    devices: tuple[Device, ...]
    node_name: str = ""
    """``spec.nodeName``: the allocation's node selector then names the node."""
    node_selector: Mapping[str, Any] | None = None
    """``spec.nodeSelector`` (a ``v1.NodeSelector``): its one term's requirements go
    into the allocation's node selector."""
    per_device: bool = False
    """``perDeviceNodeSelection``: each device says which nodes reach it."""
    here: frozenset[str] = frozenset()
    """With ``per_device``: the devices the node reaches."""


class Pool(msgspec.Struct, frozen=True):
    """A driver's pool as the node sees it: its slices of the newest generation that
    target the node, in any order. ``incomplete`` when fewer slices are seen than
    ``resourceSliceCount``; ``invalid`` (why) when two devices share a name, two counter
    sets a name, or a device draws on a counter the pool lacks: neither is searched."""

    driver: str
    name: str
    slices: tuple[Slice, ...]
    incomplete: bool = False
    invalid: str = ""
    counter_sets: Mapping[str, Mapping[str, Fraction]] = {}
    """``sharedCounters``: counter set → counter → value."""
    elsewhere: tuple[Device, ...] = ()
    """The pool's devices in slices that do not target the node: what those allocated
    draw on the shared counters counts too."""


class DeviceClass(msgspec.Struct, frozen=True):
    """A DeviceClass: its selectors apply to every request naming it."""

    name: str
    selectors: tuple[str, ...] = ()
    config: tuple[object, ...] = ()
    """``spec.config`` entries, copied into the allocation as ``source: FromClass``."""
    extended_resource_name: str = ""


class Request(msgspec.Struct, frozen=True):
    """A request's ``exactly`` (or one of its ``firstAvailable`` subrequests)."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    all: bool = False
    """``allocationMode: All``; else ExactCount with ``count``."""
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    capacity: Mapping[str, Fraction] | None = None
    """``capacity.requests``, keyed as the slice keys its capacities."""


class DeviceRequest(msgspec.Struct, frozen=True):
    """One entry of a claim's ``spec.devices.requests``: either ``exactly`` or the
    subrequests tried in order (``firstAvailable``)."""

    name: str
    exactly: Request | None = None
    first_available: tuple[Request, ...] = ()


class Constraint(msgspec.Struct, frozen=True):
    """``matchAttribute`` (all the devices share the value) or ``distinctAttribute``
    (their values differ), over ``requests`` (empty: all of the claim's requests)."""

    attribute: str
    distinct: bool = False
    requests: frozenset[str] = frozenset()


class Claim(msgspec.Struct, frozen=True):
    """A ResourceClaim that needs an allocation."""

    namespace: str
    name: str
    requests: tuple[DeviceRequest, ...]
    constraints: tuple[Constraint, ...] = ()
    config: tuple[tuple[tuple[str, ...], object], ...] = ()
    """``spec.devices.config``: (requests, the entry as written) pairs."""


class InUse(msgspec.Struct, frozen=True):
    """What allocated claims hold on the cluster: devices held whole, and capacity
    consumed on shared devices (per device, per capacity name, summed over shares)."""

    devices: frozenset[DeviceKey] = frozenset()
    consumed: Mapping[DeviceKey, Mapping[str, Fraction]] = {}
    """Per shared device that allocated shares consume capacity of (with a
    ``consumedCapacity``), the sums."""
    shares: Mapping[DeviceKey, int] = {}
    """How many allocated shares each shared device has."""

    def holds(self, key: DeviceKey) -> bool:
        """The device is allocated, whole or in shares."""
        return key in self.devices or key in self.consumed or bool(self.shares.get(key))

    def plus(self, allocations: Iterable[Allocation]) -> InUse:
        """What is held once ``allocations`` are made too (the ledger assumes a pod's
        claims allocated before the API server has them)."""
        return self._with(allocations, 1)

    def minus(self, allocations: Iterable[Allocation]) -> InUse:
        """What is held once ``allocations`` are released (or an assumption undone)."""
        return self._with(allocations, -1)

    def less(self, other: InUse) -> InUse:
        """What is held once what ``other`` holds is given back (``other`` a part of
        this: the claims of pods being evicted, read with ``read.in_use``)."""
        consumed = {k: dict(v) for k, v in self.consumed.items()}
        for key, amounts in other.consumed.items():
            into = consumed.get(key)
            if into is None:
                continue
            for name, amount in amounts.items():
                left = into.get(name, Fraction(0)) - amount
                if left > 0:
                    into[name] = left
                else:
                    into.pop(name, None)
            if not into:
                del consumed[key]
        shares = dict(self.shares)
        for key, count in other.shares.items():
            remaining = shares.get(key, 0) - count
            if remaining > 0:
                shares[key] = remaining
            else:
                shares.pop(key, None)
        return InUse(self.devices - other.devices, consumed, shares)

    def _with(self, allocations: Iterable[Allocation], sign: int) -> InUse:
        devices = set(self.devices)
        consumed = {k: dict(v) for k, v in self.consumed.items()}
        shares = dict(self.shares)
        for allocation in allocations:
            for r in allocation.results:
                if r.admin_access:
                    continue
                key = (r.driver, r.pool, r.device)
                if not r.share:
                    if sign > 0:
                        devices.add(key)
                    else:
                        devices.discard(key)
                    continue
                shares[key] = shares.get(key, 0) + sign
                if not shares[key]:
                    del shares[key]
                if r.consumed is None:
                    continue
                into = consumed.setdefault(key, {})
                for name, amount in r.consumed.items():
                    into[name] = into.get(name, Fraction(0)) + sign * amount
                if sign < 0:
                    for name in [n for n, v in into.items() if not v]:
                        del into[name]
                    if not into:
                        del consumed[key]
        return InUse(frozenset(devices), consumed, shares)


class Tally:
    """What allocated claims hold, as a running sum: each claim's holding (an
    :class:`InUse` of that claim alone, ``read.in_use([claim])``) is added when it
    starts to count and taken away when it stops, so the whole is never summed again
    (a rebuild from 5,000 claims took 44 ms here, after every gang). Exact: the
    capacities are Fractions, so what is added and taken away leaves no residue.

    :meth:`snapshot` is the sum as an :class:`InUse` whose maps are read-only views of
    the running sums: valid until the next change, after which the holder takes a new
    one (services/device_allocator/dra.py drops its cached snapshot on every change)."""

    def __init__(self) -> None:
        self.devices: dict[DeviceKey, int] = {}
        """Devices held whole, by how many counted claims hold each (one, unless two
        schedulers disagree)."""
        self.consumed: dict[DeviceKey, dict[str, Fraction]] = {}
        self.shares: dict[DeviceKey, int] = {}
        self._devices: frozenset[DeviceKey] | None = None

    def add(self, use: InUse, sign: int = 1) -> None:
        """Count what ``use`` holds (``sign`` -1: stop counting it)."""
        for key in use.devices:
            left = self.devices.get(key, 0) + sign
            if left > 0:
                self.devices[key] = left
            else:
                self.devices.pop(key, None)
            self._devices = None
        for key, amounts in use.consumed.items():
            into = self.consumed.setdefault(key, {})
            for name, amount in amounts.items():
                total = into.get(name, Fraction(0)) + sign * amount
                if total:
                    into[name] = total
                else:
                    into.pop(name, None)
            if not into:
                del self.consumed[key]
        for key, count in use.shares.items():
            left = self.shares.get(key, 0) + sign * count
            if left > 0:
                self.shares[key] = left
            else:
                self.shares.pop(key, None)

    def snapshot(self) -> InUse:
        """The sum now (see the class docstring for how long it holds)."""
        if self._devices is None:
            self._devices = frozenset(self.devices)
        return InUse(self._devices, MappingProxyType(self.consumed), MappingProxyType(self.shares))


class DeviceResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """One entry of ``status.allocation.devices.results``."""

    request: str
    """The request's name, ``request/subrequest`` for a firstAvailable choice."""
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: tuple[Toleration, ...] = ()
    share: bool = False
    """A shared device's share: the writer gives it a fresh ``shareID`` (a UUID)."""
    consumed: Mapping[str, Fraction] | None = None
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()


class Allocation(msgspec.Struct, frozen=True):
    """One claim's ``status.allocation`` (without ``allocationTimestamp``)."""

    results: tuple[DeviceResult, ...]
    config: tuple[tuple[str, tuple[str, ...], object], ...] = ()
    """(source ``FromClass``/``FromClaim``, requests, the configuration) entries."""
    node_selector: Mapping[str, Any] | None = None
    """``nodeSelector`` (a ``v1.NodeSelector``): the node itself for a device of a
    node's own slice, else the requirements of the slices' node selectors; None: every
    node reaches the devices."""


class Outcome(msgspec.Struct, frozen=True):
    """The decision for one node: ``allocations`` (one per claim, in order) when it
    fits; else ``error`` False and ``reason`` the text kube-scheduler's DynamicResources
    filter gives (``cannot allocate all claims``), or ``error`` True when a claim or
    class is broken (a CEL selector that fails): the scheduling attempt stops."""

    allocations: tuple[Allocation, ...] | None = None
    reason: str = ""
    error: bool = False
    hints: tuple[str, ...] = ()
    """For people, beside ``cannot allocate all claims``: a request whose capacity
    request every device it selects refuses whatever is free (an amount outside the
    request policy, a capacity the device lacks, more than the device has)."""

    @property
    def fits(self) -> bool:
        """It fits the node."""
        return self.allocations is not None
