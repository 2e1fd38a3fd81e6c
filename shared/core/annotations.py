"""Grant annotations: how a placement is written on the pod, and read back.

Tessera's own record is ``tessera.io/grant`` (JSON of every container's grant) with
``tessera.io/node``; the allocator rebuilds its ledger from these. With
``compat.annotations: hami`` or ``volcano`` the upstream keys (docs/compat.md, section 3) are
written too (device list ``UUID,Type,memMiB,cores:`` per device, ``;`` after every
container, init containers first) so HAMi's or Volcano's own device plugin can consume
the grant. All of them ride on the Binding: one API write.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from shared.core.model import ContainerGrant, NodeName

GRANT = "tessera.io/grant"
NODE = "tessera.io/node"
BIND_TIME = "tessera.io/bind-time"
SIGNATURE = "tessera.io/grant-signature"
"""HMAC-SHA256 of the pod's UID, its node and its grant, under the key shared by the
allocator, the binder and the node agents: only Tessera can write a grant that counts."""

Compat = Literal["none", "hami", "volcano"]

# Upstream's assignment annotations (docs/compat.md, section 3), by role.
COMPAT_KEYS: dict[str, dict[str, str]] = {
    "hami": {
        "node": "hami.io/vgpu-node",
        "time": "hami.io/vgpu-time",
        "allocated": "hami.io/vgpu-devices-allocated",
        "to-allocate": "hami.io/vgpu-devices-to-allocate",
        "phase": "hami.io/bind-phase",
        "bind-time": "hami.io/bind-time",
    },
    "volcano": {
        "node": "volcano.sh/vgpu-node",
        "time": "volcano.sh/vgpu-time",
        "allocated": "volcano.sh/vgpu-ids-new",
        "to-allocate": "volcano.sh/devices-to-allocate",
        "phase": "volcano.sh/bind-phase",
        "bind-time": "volcano.sh/bind-time",
    },
}

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


def signature(key: bytes, uid: str, node: str, grants: Sequence[ContainerGrant]) -> str:
    """The signature of a grant for pod ``uid`` on ``node``, over its canonical encoding
    (what the annotation holds), so it can be checked from the decoded grant."""
    text = encode_grants(grants)
    mac = hmac.new(key, f"{uid}\n{node}\n{text}".encode(), hashlib.sha256)
    return "v1:" + base64.b64encode(mac.digest()).decode()


def signed(
    key: bytes | None, uid: str, node: str, grants: Sequence[ContainerGrant], given: str
) -> bool:
    """Is this grant Tessera's own (True when no key is configured)? Any other text,
    non-ASCII included, is not a signature (compared as bytes: ``compare_digest`` refuses
    a str that is not ASCII)."""
    if key is None:
        return True
    expected = signature(key, uid, node, grants).encode()
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)


def grant_annotations(
    node: NodeName,
    grants: Sequence[ContainerGrant],
    now: float,
    compat: Compat = "none",
    *,
    key: bytes | None = None,
    uid: str = "",
) -> dict[str, str]:
    """Every annotation the Binding carries for this grant (signed when ``key`` is set)."""
    out = {GRANT: encode_grants(grants), NODE: node, BIND_TIME: str(int(now))}
    if key is not None:
        out[SIGNATURE] = signature(key, uid, node, grants)
    keys = COMPAT_KEYS.get(compat)
    if keys is not None:
        devices = device_list(grants)
        when = str(int(now))
        values = {
            "node": node,
            "time": when,
            "allocated": devices,
            "to-allocate": devices,
            "phase": "allocating",
            "bind-time": when,
        }
        out.update({key: values[role] for role, key in keys.items()})
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


CORDON_ANNOTATIONS = ("hami.io/device-cordon", "volcano.sh/gpu-unhealthy-ids")
"""Node annotations listing device UUIDs that must receive no new work (comma lists)."""


def cordoned_devices(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """Every device UUID a Node's annotations cordon or mark unhealthy, sorted, once."""
    found = {
        uuid.strip()
        for key in CORDON_ANNOTATIONS
        for uuid in annotations.get(key, "").split(",")
        if uuid.strip()
    }
    return tuple(sorted(found))
