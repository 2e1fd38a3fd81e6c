"""Extended resources backed by DRA: a container's ``nvidia.com/gpu: 1`` served by a
DeviceClass whose ``spec.extendedResourceName`` names it (docs/dra.md, "Extended
resources served through DRA").

As kube-scheduler's DynamicResources plugin of the pinned release does (feature
DRAExtendedResource, beta and on in 1.36): every DeviceClass maps its implicit name
``deviceclass.resource.kubernetes.io/<class>`` and, when set, its
``extendedResourceName``; two classes naming one resource: the newer class wins, the
lower name on a tie (:func:`class_mapping`). On a node whose allocatable does not list
the name, the pod's requests for mapped names become one ResourceClaim of the pod
(:func:`requests_and_mappings`): one request of ``count`` devices of the class per
container and name, named ``container-<i>-request-<j>`` (``i`` the container's index
among init containers then containers, ``j`` the name's index among the container's
sorted request names); an init container that runs before the app containers reuses
the requests of the containers after it, and the largest of their own serves them all.
The pod's ``status.extendedResourceClaimStatus`` maps each container and name to its
request (services/binder/claims.py writes both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.quantity import parse_whole

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
"""The name every DeviceClass serves without ``extendedResourceName``."""
ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""Marks the claim made for a pod's extended resources (``"true"``)."""
IN_MEMORY = "<extended-resources>"
"""The claim's name until the binder creates it (never a valid object name)."""

Mapping3 = tuple[str, str, str]
"""One entry of ``requestMappings``: (container name, resource name, request name)."""


@dataclass(frozen=True)
class ContainerAsk:
    """A container's extended-resource requests (name → whole count; zero left out)."""

    name: str
    init: bool = False
    sidecar: bool = False
    """An init container with ``restartPolicy: Always`` (it lives beside the others)."""
    asks: tuple[tuple[str, int], ...] = ()
    names: tuple[str, ...] = ()
    """Every resource name it requests, sorted (``j`` of a request name counts them)."""

    def count(self, resource: str) -> int:
        """How many of ``resource`` it asks (0: none)."""
        return dict(self.asks).get(resource, 0)


def class_mapping(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Resource name → DeviceClass name, for DeviceClass API objects (their metadata
    name and ``creationTimestamp``, ``spec.extendedResourceName``)."""
    out: dict[str, str] = {}
    explicit: dict[str, tuple[str, str]] = {}
    for obj in classes:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if not name:
            continue
        out[IMPLICIT_PREFIX + name] = name
        wanted = (obj.get("spec") or {}).get("extendedResourceName")
        if not wanted:
            continue
        created = str(meta.get("creationTimestamp") or "")  # RFC 3339 UTC: sorts as text
        held = explicit.get(str(wanted))
        # The newer class, then the lower name (the scheduler's extended-resource cache).
        if held is None or (created, _neg(name)) > (held[0], _neg(held[1])):
            explicit[str(wanted)] = (created, name)
    for resource, (_, name) in explicit.items():
        out[resource] = name
    return out


def _neg(name: str) -> tuple[int, ...]:
    """A key that orders names backwards (the lower name wins a tie)."""
    return (*(-ord(c) for c in name), 0)


def container_asks(pod: Mapping[str, Any]) -> tuple[ContainerAsk, ...]:
    """The pod's containers (init containers first) with their extended-resource
    requests; () when none asks one."""
    spec = pod.get("spec") or {}
    found: list[ContainerAsk] = []
    any_ask = False
    for init, key in ((True, "initContainers"), (False, "containers")):
        for c in spec.get(key) or ():
            requests = (c.get("resources") or {}).get("requests") or {}
            asks = []
            for resource, value in requests.items():
                if not is_extended(str(resource)):
                    continue
                try:
                    count = parse_whole(value)
                except (ValueError, TypeError):
                    continue  # not whole: the API server refuses it for an extended name
                if count > 0:
                    asks.append((str(resource), count))
            any_ask = any_ask or bool(asks)
            found.append(
                ContainerAsk(
                    name=str(c.get("name", "")),
                    init=init,
                    sidecar=init and c.get("restartPolicy") == "Always",
                    asks=tuple(sorted(asks)),
                    names=tuple(sorted(str(k) for k in requests)),
                )
            )
    return tuple(found) if any_ask else ()


def is_extended(name: str) -> bool:
    """An extended resource name (a domain other than kubernetes.io's, or a class's
    implicit name), as the scheduler counts them."""
    if name.startswith(IMPLICIT_PREFIX):
        return True
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def requests_and_mappings(
    containers: Sequence[ContainerAsk],
    mapping: Mapping[str, str],
    names: Iterable[str],
) -> tuple[list[dict[str, Any]], list[Mapping3]]:
    """The claim's ``spec.devices.requests`` and the pod's request mappings for the
    resources ``names`` (each mapped by ``mapping``)."""
    requests: list[dict[str, Any]] = []
    mappings: list[Mapping3] = []
    long_lived = [i for i, c in enumerate(containers) if not c.init or c.sidecar]
    short_lived = [i for i, c in enumerate(containers) if c.init and not c.sidecar]
    for resource in sorted(set(names)):
        cls = mapping.get(resource)
        if cls is None:
            continue
        own: dict[int, dict[str, Any]] = {}
        long_maps: list[Mapping3] = []
        for i in long_lived:
            req, maps = _one(i, containers[i], resource, cls, [])
            if req is not None:
                own[i] = req
            long_maps.extend(maps)
        biggest: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_maps: list[Mapping3] = []
        for i in short_lived:
            later = [own[j] for j in sorted(own) if j >= i]
            req, maps = _one(i, containers[i], resource, cls, later)
            if req is not None:
                short_names.add(req["name"])
                if biggest is None or biggest["exactly"]["count"] < req["exactly"]["count"]:
                    biggest = req
            short_maps.extend(maps)
        if biggest is not None and len(short_names) > 1:
            short_names.discard(biggest["name"])
            short_maps = [
                (c, r, biggest["name"] if q in short_names else q) for c, r, q in short_maps
            ]
        if biggest is not None:
            requests.append(biggest)
        requests.extend(own[i] for i in sorted(own))
        mappings.extend(long_maps)
        mappings.extend(short_maps)
    requests.sort(key=lambda r: str(r["name"]))
    return requests, mappings


def _one(
    index: int,
    container: ContainerAsk,
    resource: str,
    cls: str,
    reusable: Sequence[dict[str, Any]],
) -> tuple[dict[str, Any] | None, list[Mapping3]]:
    wanted = container.count(resource)
    if not wanted:
        return None, []
    maps: list[Mapping3] = []
    total = 0
    for r in reusable:
        total += int(r["exactly"]["count"])
        maps.append((container.name, resource, str(r["name"])))
        if total >= wanted:
            return None, maps
    ordered = container.names or tuple(n for n, _ in container.asks)
    j = ordered.index(resource) if resource in ordered else 0
    name = f"container-{index}-request-{j}"
    request = {
        "name": name,
        "exactly": {
            "deviceClassName": cls,
            "allocationMode": "ExactCount",
            "count": wanted - total,
        },
    }
    maps.append((container.name, resource, name))
    return request, maps


@dataclass(frozen=True)
class Extended:
    """What a pod's mapped extended resources become on a node that serves them through
    DRA: the claim's ``spec.devices``, the pod's request mappings, the names served."""

    devices: dict[str, Any]
    mappings: tuple[Mapping3, ...]
    names: tuple[str, ...]
    classes: tuple[str, ...]


def extended_claim(
    containers: Sequence[ContainerAsk], mapping: Mapping[str, str], plain: Iterable[str] = ()
) -> Extended | None:
    """The claim for the pod's mapped names, or None when it asks none, or asks a name
    that only Tessera's device plugin serves (not in ``plain``, the names node
    allocatable is fitted against) and no class maps: such a pod cannot run on a DRA
    node (HAMi's ``nvidia.com/gpumem`` and ``gpucores`` map to no class)."""
    asked = {n for c in containers for n, _ in c.asks}
    names = sorted(n for n in asked if n in mapping)
    plain = set(plain)
    if not names or any(n not in mapping and n not in plain for n in asked):
        return None
    requests, mappings = requests_and_mappings(containers, mapping, names)
    return Extended(
        devices={"requests": requests},
        mappings=tuple(mappings),
        names=tuple(names),
        classes=tuple(sorted({mapping[n] for n in names})),
    )
