"""One claim prepared for the kubelet: its allocation read, each of this driver's
devices mapped to the grant it stands for, the hand-out written as a CDI spec.

services/node_agent/dra/plugin.py serves the kubelet and calls :func:`prepare` per
claim of a ``NodePrepareResources`` call. The claim's allocation is read from the API
server (by namespace and name, checked against the UID); each device of this driver is
mapped to what it stands for (services/node_agent/dra/slices.py) and the claim's CDI
spec written (services/node_agent/dra/cdi.py) with the hand-out the device plugin's
``Allocate`` gives for the same grant. The answer lists every allocated device with the
claim's CDI ID (once per request, so a container naming the whole claim gets it once).
The spec file also records that answer: preparing a prepared claim again answers the
same without reading the API server (idempotent across restarts).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiException

from services.node_agent.deviceplugin.allocation import make_writable_dirs
from services.node_agent.dra import api_pb2 as pb
from services.node_agent.dra import cdi
from services.node_agent.dra.slices import API_VERSION, GrantError, dra_devices, grant_of
from services.node_agent.isolation import HandoutError, handout
from shared import kube
from shared.config import Config
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceInfo,
    NodeName,
    PodRef,
    PodUID,
)

log = logging.getLogger(__name__)

PREPARED_ANNOTATION = "prepared"
"""The key (in the driver's domain) of the spec annotation recording the answer."""


class ClaimError(Exception):
    """A claim cannot be prepared; the message is the claim's error in the answer."""


ClaimReader = Callable[[str, str], Awaitable[dict[str, Any]]]
"""``(namespace, name)`` → the ResourceClaim object (raises ApiException)."""


@dataclass(frozen=True, slots=True)
class Driver:
    """What preparing a claim needs of the node's driver."""

    cfg: Config
    node: NodeName
    name: str
    cdi_dir: Path
    devices: tuple[DeviceInfo, ...]


async def prepare(driver: Driver, claim: pb.Claim, read_claim: ClaimReader) -> list[pb.Device]:
    """Prepare one claim: its CDI spec written, its devices as the kubelet records
    them. Raises ClaimError (or another exception) with the reason."""
    path = cdi.spec_path(driver.cdi_dir, driver.name, claim.uid)
    recorded = await asyncio.to_thread(cdi.read_spec, path)
    key = f"{driver.name}/{PREPARED_ANNOTATION}"
    if recorded is not None and key in recorded.get("annotations", {}):
        return [_device(d) for d in json.loads(recorded["annotations"][key])]
    obj = await read_claim(claim.namespace, claim.name)
    uid = obj.get("metadata", {}).get("uid")
    if uid != claim.uid:
        raise ClaimError(f"it was replaced (its UID is now {uid}, the kubelet asks {claim.uid})")
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("it is not allocated (status.allocation is empty)")
    results = [
        r
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == driver.name
    ]
    if not results:
        raise ClaimError(f"no device of driver {driver.name} is allocated to it")
    answer, grants = _grants(driver, results, claim.uid)
    given = handout(
        driver.cfg,
        driver.node,
        PodRef(namespace=claim.namespace, name=claim.name, uid=PodUID(claim.uid)),
        ContainerGrant(container="claim", devices=tuple(grants)),
        {d.uuid: d for d in driver.devices},
    )
    await asyncio.to_thread(make_writable_dirs, given)
    spec = cdi.claim_spec(driver.name, claim.uid, given)
    spec["annotations"] = {key: json.dumps(answer, sort_keys=True)}
    await asyncio.to_thread(cdi.write_spec, path, spec)
    log.info(
        "prepared claim %s/%s: %s (%s)",
        claim.namespace,
        claim.name,
        ", ".join(r["device"] for r in results),
        ", ".join(f"{k}={v}" for k, v in sorted(given.envs.items())),
    )
    return [_device(d) for d in answer]


def _grants(
    driver: Driver, results: list[dict[str, Any]], claim_uid: str
) -> tuple[list[dict[str, Any]], list[DeviceGrant]]:
    """Each allocated device's answer (as recorded) and grant."""
    table = {d.name: d for d in dra_devices(driver.cfg, driver.node, driver.devices)}
    cdi_id = cdi.device_id(driver.name, claim_uid)
    answer: list[dict[str, Any]] = []
    grants = []
    given_to: set[str] = set()
    for r in results:
        pool, name, request = r.get("pool", ""), r.get("device", ""), r.get("request", "")
        device = table.get(name) if pool == driver.node else None
        if device is None:
            raise GrantError(f"device {pool}/{name} is not one this node offers now")
        grants.append(grant_of(device, r.get("consumedCapacity")))
        names = [request] if "/" not in request else [request, request.split("/", 1)[0]]
        first = request not in given_to
        given_to.add(request)
        answer.append(
            {
                "requests": names,
                "pool": pool,
                "device": name,
                "cdi_id": cdi_id if first else "",
                "share": r.get("shareID") or "",
            }
        )
    kinds = {g.mig_profile is not None for g in grants if g.vendor == "nvidia"}
    if len(kinds) > 1:
        raise GrantError(
            "it holds MIG instances and cards together: a container sees one or the "
            "other, so ask them in two claims"
        )
    return answer, grants


async def read_claim(api: kube.Client | None, namespace: str, name: str) -> dict[str, Any]:
    """The ResourceClaim from the API server; ClaimError when it is gone."""
    if api is None:
        raise ClaimError("the node agent has no API server to read claims from")
    try:
        obj: dict[str, Any] = await kube.request(
            api, "GET", f"/apis/{API_VERSION}/namespaces/{namespace}/resourceclaims/{name}"
        )
    except ApiException as exc:
        if exc.status == 404:
            raise ClaimError("it does not exist") from None
        raise
    return obj


def _device(recorded: Mapping[str, Any]) -> pb.Device:
    """A device of the answer, from its record (the driver's CDI ID is added on the
    first device of each request)."""
    device = pb.Device(
        request_names=list(recorded["requests"]),
        pool_name=recorded["pool"],
        device_name=recorded["device"],
        cdi_device_ids=[recorded["cdi_id"]] if recorded.get("cdi_id") else [],
    )
    if recorded.get("share"):
        device.share_id = recorded["share"]
    return device


def message(claim: pb.Claim, exc: Exception) -> str:
    """The error a claim is answered with: the claim, then why."""
    why = str(exc) if isinstance(exc, ClaimError | GrantError | HandoutError) else repr(exc)
    return f"ResourceClaim {claim.namespace}/{claim.name} ({claim.uid}): {why}"
