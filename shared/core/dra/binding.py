"""Binding conditions: whether an allocated claim's devices are ready for its pod's Binding.

A device may carry ``bindingConditions`` and ``bindingFailureConditions`` (its slice's;
the allocator copies them into the allocation's results: shared/core/dra/written.py). A
pod whose claims hold such a device is bound only once, for every such result, the entry
of the claim's ``status.devices`` with the same driver, pool and device (the share is not
compared) has each binding condition ``True``; a failure condition ``True`` fails the
bind; so does the binding timeout, counted from the allocation's ``allocationTimestamp``.
This is kube-scheduler's reading in its DynamicResources PreBind (the binder's wait:
services/binder/conditions.py). Pure: the caller passes the claim as read and ``now``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

State = Literal["ready", "waiting", "failed"]


class Readiness(NamedTuple):
    """One claim's answer: ``ready``; ``waiting`` (``why``: what is still pending, for
    people); ``failed`` (``why``: kube-scheduler's words, naming the claim, the failure
    condition's reason and message)."""

    state: State
    why: str = ""
    claim: str = ""
    """The claim that failed or timed out (its name)."""


def _results(allocation: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list(((allocation or {}).get("devices") or {}).get("results") or ())


def conditioned(allocation: Mapping[str, Any] | None) -> bool:
    """Whether any device of ``allocation`` (a claim's ``status.allocation``) carries
    binding conditions: its pod's Binding then waits for them."""
    return any(r.get("bindingConditions") for r in _results(allocation))


def _device_status(claim: Mapping[str, Any], result: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The claim's ``status.devices`` entry of ``result``: the first with its driver, pool
    and device (kube-scheduler's ``getAllocatedDeviceStatus``)."""
    key = (result.get("driver"), result.get("pool"), result.get("device"))
    for entry in (claim.get("status") or {}).get("devices") or ():
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == key:
            found: Mapping[str, Any] = entry
            return found
    return None


def _condition(entry: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in entry.get("conditions") or ():
        if cond.get("type") == kind:
            found: Mapping[str, Any] = cond
            return found
    return None


def _true(entry: Mapping[str, Any] | None, kind: str) -> bool:
    cond = _condition(entry, kind) if entry is not None else None
    return cond is not None and cond.get("status") == "True"


def readiness(claim: Mapping[str, Any]) -> Readiness:
    """Whether ``claim`` (a ResourceClaim as read) is ready for its pod's Binding: every
    result with binding conditions has them all ``True`` in its device status (a claim
    with none is ready); a failure condition ``True`` fails it, checked first, result by
    result; a claim not allocated waits."""
    name = str((claim.get("metadata") or {}).get("name", ""))
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return Readiness("waiting", f"claim {name} is not allocated")
    pending: list[str] = []
    for result in _results(allocation):
        wanted = result.get("bindingConditions") or ()
        if not wanted:
            continue
        entry = _device_status(claim, result)
        for kind in result.get("bindingFailureConditions") or ():
            cond = _condition(entry, kind) if entry is not None else None
            if cond is not None and cond.get("status") == "True":
                return Readiness(
                    "failed",
                    f"device binding failed: claim={name}, reason={cond.get('reason', '')}, "
                    f"message={json.dumps(str(cond.get('message', '')))}",
                    name,
                )
        missing = [str(kind) for kind in wanted if not _true(entry, kind)]
        if missing:
            where = f"{result.get('driver')}/{result.get('pool')}/{result.get('device')}"
            pending.append(f"{', '.join(missing)} on {where}")
    if pending:
        return Readiness("waiting", f"claim {name} waits for {'; '.join(pending)}")
    return Readiness("ready")


def allocated_at(claim: Mapping[str, Any]) -> float | None:
    """The claim's ``status.allocation.allocationTimestamp`` in seconds since the epoch
    (None: not written, or not a time)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    stamp = allocation.get("allocationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def timed_out(claim: Mapping[str, Any], now: float, timeout_s: float) -> bool:
    """Whether ``claim``'s devices have waited past ``timeout_s`` since its allocation
    was written (kube-scheduler's ``isClaimTimeout``: only an allocation with binding
    conditions and a timestamp times out)."""
    allocation = (claim.get("status") or {}).get("allocation")
    at = allocated_at(claim)
    return conditioned(allocation) and at is not None and at + timeout_s < now


def timestamp(now: float) -> str:
    """``now`` as an ``allocationTimestamp`` is written (RFC 3339, whole seconds, UTC)."""
    return datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_readiness(claims: Iterable[Mapping[str, Any]], now: float, timeout_s: float) -> Readiness:
    """A pod's claims together (kube-scheduler's ``isPodReadyForBinding``): the first
    claim that failed or timed out fails the pod (in order); ready when every claim is;
    else waiting, with what each waiting claim waits for."""
    waits: list[str] = []
    for claim in claims:
        found = readiness(claim)
        if found.state == "failed":
            return found
        if found.state == "waiting":
            if timed_out(claim, now, timeout_s):
                name = (claim.get("metadata") or {}).get("name", "")
                return Readiness(
                    "failed",
                    f"device binding timeout: claim={name} ({found.why} after {timeout_s:.0f}s)",
                    str(name),
                )
            waits.append(found.why)
    return Readiness("waiting", "; ".join(waits)) if waits else Readiness("ready")
