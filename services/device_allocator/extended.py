"""Extended resources served through DRA: a pod asking ``nvidia.com/gpu: 1`` placed on a
node that offers its cards by ResourceSlice (docs/dra.md, "Extended resources served
through DRA").

The watcher finds the DeviceClass that maps each extended resource the pod asks and the
claim the requests become (``Claims.extended``, shared/core/dra/extended.py). A gang is
placed first as written: its device requests go to the device plugin's nodes (a DRA
node holds no device in the ledger: services/device_allocator/nodes.py). Where that
finds no room, :func:`variant` gives each member the other way: its mapped requests
dropped from its device and node-fit requests and its claim added to the claims to
allocate, on the nodes whose allocatable does not list any of the names (a node whose
device plugin serves a name keeps serving it, as kube-scheduler's NodeResourcesFit and
DynamicResources decide). The claim is then decided like any other
(services/device_allocator/dra.py), and the binder creates it (services/binder/claims.py).
So one node never serves one name both ways, and a card is never counted twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import msgspec

from shared.core.hosts import NodeTerm, Requirement
from shared.core.nodefit import Hosts
from shared.core.placement import GangMember
from shared.core.status import Status


def variant(member: GangMember, hosts: Hosts) -> GangMember | None:
    """``member`` with its mapped extended resources asked as a claim instead (None:
    it asks none a DeviceClass maps)."""
    spec = member.spec
    claims = spec.claims if spec is not None else None
    if spec is None or claims is None or claims.extended is None:
        return None
    served = tuple(
        sorted(
            str(name)
            for name, host in hosts.nodes.items()
            if host.spec is not None
            and any(host.spec.allocatable.get(r, 0) > 0 for r in claims.mapped)
        )
    )
    devices = claims.devices
    if served:  # the device plugin serves a name there: not through DRA
        devices = (*devices, (NodeTerm(names=(Requirement("metadata.name", "NotIn", served),)),))
    limited = msgspec.structs.replace(
        claims,
        allocate=(*claims.allocate, claims.extended),
        devices=devices,
        extended=None,
        mapped=(),
    )
    requests = {k: v for k, v in spec.requests.items() if k not in claims.mapped}
    containers = tuple(msgspec.structs.replace(c, devices=()) for c in member.request.containers)
    return dataclasses.replace(
        member,
        spec=msgspec.structs.replace(spec, claims=limited, requests=requests),
        request=msgspec.structs.replace(member.request, containers=containers),
    )


def variants(members: Sequence[GangMember], hosts: Hosts) -> list[GangMember] | None:
    """The gang with each member that may be served through DRA served so (None: no
    member may)."""
    swapped = [variant(m, hosts) for m in members]
    if all(v is None for v in swapped):
        return None
    return [v if v is not None else m for v, m in zip(swapped, members, strict=True)]


def told(plugin: Status, dra: Status) -> Status:
    """Why neither way placed the gang: the device plugin's reasons, unless no card
    could ever serve it that way (then the DRA attempt's say more)."""
    return dra if plugin.unresolvable else plugin
