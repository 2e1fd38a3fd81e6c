"""What :func:`~shared.core.dra.allocate.allocate` needs of a pod once, whatever the
node: each request's DeviceClass found (a missing one refuses the pod everywhere, as
kube-scheduler's DynamicResources PreFilter does) and every selector compiled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from shared.core.dra.cel import compile_selector
from shared.core.dra.model import Claim, DeviceClass, Outcome


class Prepared(NamedTuple):
    """A pod's claims with their classes resolved: what :func:`allocate` reads."""

    claims: tuple[Claim, ...]
    classes: Mapping[str, DeviceClass]


def prepare(claims: Sequence[Claim], classes: Mapping[str, DeviceClass]) -> Prepared | Outcome:
    """Once per pod: an Outcome (unresolvable on every node) when a request names a
    DeviceClass that does not exist, with DynamicResources' PreFilter text; else the
    claims ready for :func:`allocate`. Compiles every selector once (cached)."""
    for claim in claims:
        for request in claim.requests:
            for sub in (request.exactly,) if request.exactly else request.first_available:
                if sub is None:
                    continue
                name = request.name if request.exactly else f"{request.name}/{sub.name}"
                cls = classes.get(sub.device_class)
                if cls is None:
                    return Outcome(
                        reason=f"request {name}: device class {sub.device_class} does not exist"
                    )
                for text in cls.selectors + sub.selectors:
                    compile_selector(text)
    return Prepared(tuple(claims), classes)
