"""What a pod's DRA ResourceClaims count in its queue, per DeviceClass.

A Queue's ``capability``, ``deserved`` and ``guarantee`` (and a PodGroup's
``minResources``) name claimed devices with the resource names of Volcano's
``capacity`` plugin, beside the device-plugin names (``nvidia.com/gpu``...):

- ``deviceclass/<DeviceClass>``: how many devices of the class the queue's claims hold;
- ``<capacity>.deviceclass/<DeviceClass>``: how much of one consumable capacity (say
  ``memory`` or ``cores``) they hold, summed over the devices.

These names are the dimensions of the queue vectors (shared/core/queues.py) as they
are written: the queue accounting checks, divides and reclaims them as any other.
A device-plugin card and a claimed card never share a dimension: ``nvidia.com/gpu``
limits the first, ``deviceclass/gpu.tessera.io`` the second.

What a claim counts:

- **before placement** (:func:`asked`, from ``spec.devices``): per request, its class
  and ``count`` (1 when unset); each ``capacity.requests`` times that count. A
  ``firstAvailable`` request counts as its first subrequest (the one the allocator
  tries first); an ``allocationMode: All`` request as one device (how many it gets is
  known only once allocated); a request with ``adminAccess`` counts nothing (it holds
  no device: shared/core/dra/read.py ``in_use``).
- **once allocated** (:func:`held`, from ``status.allocation``): one device per result
  (not an ``adminAccess`` one) of the class its request or subrequest names, and each
  capacity it consumes on a shared device (``consumedCapacity``: the request rounded up
  by the device's request policy), else what its request asked.

Volcano's own reading (``pkg/scheduler/cache`` of the commit /work/shared/UPSTREAM.md
names) counts the spec only and skips ``All`` and ``firstAvailable`` requests; here
they count, exactly once allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.core.quantity import parse_quantity

Resources = dict[str, float]

COUNT = "deviceclass/"
"""The prefix of a device-count dimension: ``deviceclass/<DeviceClass>``."""
CAPACITY = ".deviceclass/"
"""What joins a capacity and a class in a capacity dimension:
``<capacity>.deviceclass/<DeviceClass>``."""


def is_claimed(name: str) -> bool:
    """Whether a resource name (or vector dimension) is one of claimed devices."""
    return name.startswith(COUNT) or CAPACITY in name


def name_error(name: str) -> str | None:
    """Why a resource name meant for claimed devices cannot be one (None: it is, or it
    is not meant for them)."""
    if name.startswith(COUNT):
        if not name[len(COUNT) :]:
            return "names no DeviceClass: write deviceclass/<DeviceClass>"
        return None
    if CAPACITY in name:
        dim, _, device_class = name.partition(CAPACITY)
        if not dim:
            return "names no capacity: write <capacity>.deviceclass/<DeviceClass>"
        if not device_class:
            return "names no DeviceClass: write <capacity>.deviceclass/<DeviceClass>"
    return None


def count_key(device_class: str) -> str:
    """The dimension counting devices of ``device_class``."""
    return f"{COUNT}{device_class}"


def capacity_key(capacity: str, device_class: str) -> str:
    """The dimension summing ``capacity`` over devices of ``device_class``."""
    return f"{capacity}{CAPACITY}{device_class}"


def _amount(raw: object) -> float:
    try:
        return float(parse_quantity(raw))
    except ValueError:
        return 0.0  # the API server validates claims: nothing else reaches here


def _add(out: Resources, key: str, value: float) -> None:
    if value:
        out[key] = out.get(key, 0.0) + value


def _count(out: Resources, request: Mapping[str, Any], devices: int) -> None:
    """``devices`` devices of the request's class, with its capacity requests each."""
    device_class = str(request.get("deviceClassName") or "")
    if not device_class or request.get("adminAccess"):
        return
    _add(out, count_key(device_class), devices)
    asked = (request.get("capacity") or {}).get("requests") or {}
    for dim, raw in asked.items():
        _add(out, capacity_key(str(dim), device_class), devices * _amount(raw))


def asked(devices: Mapping[str, Any]) -> Resources:
    """What a claim not yet allocated will count, from its ``spec.devices``."""
    out: Resources = {}
    for request in devices.get("requests") or ():
        exactly = request.get("exactly")
        if exactly is None:
            subrequests = request.get("firstAvailable") or ()
            if not subrequests:
                continue
            exactly = subrequests[0]
        if exactly.get("allocationMode") == "All":
            _count(out, exactly, 1)
        else:
            _count(out, exactly, int(exactly.get("count") or 1))
    return out


def _requests(devices: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Each request and subrequest by the name a result gives (``r``, ``r/sub``)."""
    out: dict[str, Mapping[str, Any]] = {}
    for request in devices.get("requests") or ():
        name = str(request.get("name", ""))
        if request.get("exactly") is not None:
            out[name] = request["exactly"]
        for sub in request.get("firstAvailable") or ():
            out[f"{name}/{sub.get('name', '')}"] = sub
    return out


def held(devices: Mapping[str, Any], allocation: Mapping[str, Any]) -> Resources:
    """What an allocated claim counts, from its ``spec.devices`` (the class of each
    request) and ``status.allocation`` (the devices it got)."""
    requests = _requests(devices)
    out: Resources = {}
    for result in (allocation.get("devices") or {}).get("results") or ():
        request = requests.get(str(result.get("request", "")))
        if request is None or result.get("adminAccess"):
            continue
        device_class = str(request.get("deviceClassName") or "")
        if not device_class:
            continue
        _add(out, count_key(device_class), 1)
        consumed = result.get("consumedCapacity")
        if consumed is None:
            consumed = (request.get("capacity") or {}).get("requests") or {}
        for dim, raw in consumed.items():
            _add(out, capacity_key(str(dim), device_class), _amount(raw))
    return out
