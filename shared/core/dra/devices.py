"""The units the DRA search works with: a request resolved for it, a device where the
search meets it, the claim constraints' bookkeeping, and device taints
(shared/core/dra/allocate.py searches with them)."""

from __future__ import annotations

from typing import NamedTuple

from shared.core.dra.model import (
    Attribute,
    Constraint,
    Device,
    DeviceClass,
    DeviceKey,
    Request,
    Slice,
    Taint,
    Toleration,
)


class Req(NamedTuple):
    """One request (or subrequest) of a claim, resolved for the search."""

    request: Request
    parent: str
    """The request's name when this is one of its subrequests, else ''."""
    cls: DeviceClass
    wanted: int
    everything: tuple[Dev, ...] | None
    """The devices ``All`` takes, else None."""

    @property
    def result_name(self) -> str:
        """The name an allocation result carries: ``request/subrequest`` for a subrequest."""
        return f"{self.parent}/{self.request.name}" if self.parent else self.request.name


class Dev(NamedTuple):
    """A device where the search meets it: its identity, record and slice."""

    key: DeviceKey
    device: Device
    slice: Slice
    pool: int
    """Its pool's place in the search's order."""


def lookup(device: Device, driver: str, name: str) -> Attribute | None:
    """A constraint's attribute (a qualified name): as written, or, in the driver's own
    domain, the name without its domain."""
    found = device.attributes.get(name)
    if found is not None:
        return found
    domain, sep, short = name.partition("/")
    if not sep or domain != driver:
        return None
    return device.attributes.get(short)


class Tracker:
    """matchAttribute or distinctAttribute over one claim's devices, with the allocator's
    bookkeeping: matchAttribute remembers the first device's value until it has no
    device left; distinctAttribute remembers one value per request name (the last
    device added for it) and compares a new device with those only."""

    def __init__(self, spec: Constraint) -> None:
        self.spec = spec
        self.first: Attribute | None = None
        self.by_request: dict[str, Attribute] = {}
        self.count = 0

    def _applies(self, request: str, sub: str) -> bool:
        names = self.spec.requests
        return not names or request in names or (bool(sub) and f"{request}/{sub}" in names)

    def add(self, request: str, sub: str, dev: Dev) -> bool:
        """Adds a device chosen for ``request`` (``sub``: its subrequest); False if the
        constraint refuses it (nothing recorded then)."""
        if not self._applies(request, sub):
            return True
        found = lookup(dev.device, dev.key[0], self.spec.attribute)
        if found is None:
            return False
        if self.count == 0:
            self.first = found
            self.by_request[request] = found
            self.count = 1
            return True
        if self.spec.distinct:
            if any(v.kind == found.kind and v == found for v in self.by_request.values()):
                return False
            self.by_request[request] = found
        elif self.first != found:
            return False
        self.count += 1
        return True

    def remove(self, request: str, sub: str) -> None:
        """Undoes the last :meth:`add` for ``request``."""
        if not self._applies(request, sub):
            return
        self.by_request.pop(request, None)
        self.count -= 1


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.operator in ("", "Equal") and toleration.value == taint.value


def tainted(device: Device, request: Request) -> bool:
    """A NoSchedule or NoExecute taint of the device that the request does not tolerate."""
    return any(
        taint.effect in ("NoSchedule", "NoExecute")
        and not any(_tolerates(t, taint) for t in request.tolerations)
        for taint in device.taints
    )
