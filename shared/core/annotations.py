"""Grant annotations: how a placement is written on the pod, and read back.

Tessera's own record is ``tessera.io/grant`` (JSON of every container's grant) with
``tessera.io/node``; the allocator rebuilds its ledger from these. With
``compat.annotations: hami`` or ``volcano`` the upstream keys of COMPAT.md section 5 are
written too (device list ``UUID,Type,memMiB,cores:`` per device, ``;`` after every
container, init containers first) so HAMi's or Volcano's own device plugin can consume
the grant. All of them ride on the Binding: one API write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from shared.core.model import ContainerGrant, NodeName

GRANT = "tessera.io/grant"
NODE = "tessera.io/node"
BIND_TIME = "tessera.io/bind-time"

Compat = Literal["none", "hami", "volcano"]

_grants_encoder = msgspec.json.Encoder()
_grants_decoder = msgspec.json.Decoder(tuple[ContainerGrant, ...])


def encode_grants(grants: Sequence[ContainerGrant]) -> str:
    return _grants_encoder.encode(tuple(grants)).decode()


def decode_grants(text: str) -> tuple[ContainerGrant, ...]:
    """Raises ``msgspec.DecodeError`` / ``ValidationError`` on a damaged annotation."""
    return _grants_decoder.decode(text)


def device_list(grants: Sequence[ContainerGrant]) -> str:
    """HAMi/Volcano encoding: ``UUID,Type,memMiB,cores:`` per device, ``;`` per container."""
    parts = []
    for c in grants:
        parts.append("".join(f"{d.uuid},{d.model},{d.memory_mib},{d.cores}:" for d in c.devices))
    return "".join(p + ";" for p in parts)


def grant_annotations(
    node: NodeName, grants: Sequence[ContainerGrant], now: float, compat: Compat = "none"
) -> dict[str, str]:
    """Every annotation the Binding carries for this grant."""
    out = {GRANT: encode_grants(grants), NODE: node, BIND_TIME: str(int(now))}
    if compat == "hami":
        devices = device_list(grants)
        out.update(
            {
                "hami.io/vgpu-node": node,
                "hami.io/vgpu-time": str(int(now)),
                "hami.io/vgpu-devices-allocated": devices,
                "hami.io/vgpu-devices-to-allocate": devices,
                "hami.io/bind-phase": "allocating",
                "hami.io/bind-time": str(int(now)),
            }
        )
    elif compat == "volcano":
        devices = device_list(grants)
        out.update(
            {
                "volcano.sh/vgpu-node": node,
                "volcano.sh/vgpu-time": str(int(now)),
                "volcano.sh/vgpu-ids-new": devices,
                "volcano.sh/devices-to-allocate": devices,
                "volcano.sh/bind-phase": "allocating",
                "volcano.sh/bind-time": str(int(now)),
            }
        )
    return out


def read_grants(annotations: Mapping[str, str]) -> tuple[ContainerGrant, ...] | None:
    """The grant a pod carries, or None when it has none (or it cannot be read)."""
    text = annotations.get(GRANT)
    if not text:
        return None
    try:
        return decode_grants(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
