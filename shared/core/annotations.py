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
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from shared.core.model import ContainerGrant, DeviceGrant, NodeName, Vendor
from shared.core.spec import DEFAULT_VENDORS, DEFAULT_VNPUS

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

Placed = list[tuple[ContainerGrant, list[DeviceGrant]]]
"""Every container of a pod (init containers first) with its devices of one type."""
Extras = Callable[[Placed, NodeName, float], dict[str, str]]


@dataclass(frozen=True)
class DeviceKeys:
    """Where HAMi's scheduler writes one device type's grant at bind (the type's
    ``PatchAnnotations`` in ``pkg/device/<vendor>/``), which that vendor's device plugin
    reads. ``{model}`` in a key or the type stands for the device's model word (an Ascend
    chip's or an Iluvatar model's common word)."""

    allocated: str
    to_allocate: str = ""
    """Empty: HAMi writes only ``allocated`` for this type."""
    type_word: str = ""
    """The type in the device list; empty: the device's model."""
    extras: Extras | None = None
    """The type's own annotations beside the device list."""


def _nanos(now: float) -> str:
    return str(int(now * 1e9))


def _indexes(devices: Sequence[DeviceGrant]) -> str:
    return ",".join(str(d.index) for d in devices)


def _first_device(placed: Placed) -> DeviceGrant | None:
    return next((devs[0] for _, devs in placed if devs), None)


def _last_indexes(placed: Placed) -> str:
    """The device indexes of the last container holding any (HAMi rewrites the key per
    container, so the last one stays)."""
    return next((_indexes(devs) for _, devs in reversed(placed) if devs), "")


def _cambricon(placed: Placed, node: NodeName, now: float) -> dict[str, str]:
    # the first container's first device: index, cores, memory in 256 MiB units
    d = _first_device(placed)
    out = {"CAMBRICON_DSMLU_ASSIGNED": "false"}
    if d is not None:
        out["CAMBRICON_DSMLU_PROFILE"] = f"{d.index}_{d.cores}_{d.memory_mib // 256}"
    return out


def _metax(placed: Placed, node: NodeName, now: float) -> dict[str, str]:
    # per container, per device: uuid, compute (cores), vRam (MiB); zeros left out
    per = [
        [
            {"uuid": d.uuid}
            | ({"compute": d.cores} if d.cores else {})
            | ({"vRam": d.memory_mib} if d.memory_mib else {})
            for d in devs
        ]
        for _, devs in placed
    ]
    return {
        "metax-tech.com/gpu-devices-allocated": json.dumps(per, separators=(",", ":")),
        "metax-tech.com/predicate-time": _nanos(now),
    }


def _mthreads(placed: Placed, node: NodeName, now: float) -> dict[str, str]:
    return {
        "mthreads.com/gpu-index": _last_indexes(placed),
        "mthreads.com/predicate-node": node,
        "mthreads.com/predicate-time": _nanos(now),
    }


def _kunlun(placed: Placed, node: NodeName, now: float) -> dict[str, str]:
    return {"BAIDU_COM_DEVICE_IDX": _last_indexes(placed)}


def _enflame(placed: Placed, node: NodeName, now: float) -> dict[str, str]:
    out = {"enflame.com/gcu-assigned": "false", "enflame.com/gcu-assigned-time": _nanos(now)}
    d = _first_device(placed)
    if d is not None:
        out["enflame.com/gcu-assigned-index"] = out["enflame.com/gcu-assigned-id"] = str(d.index)
    return out


def _neuron(placed: Placed, node: NodeName, now: float) -> dict[str, str]:
    # whole devices: their indexes, every container's together
    return {
        "AWS_NEURON_IDS": ",".join(_indexes(devs) for _, devs in placed if devs),
        "NEURON_ALLOC_TIME": _nanos(now),
        "NEURON_ALLOCATED": "false",
        "aws.amazon.com/predicate-node": node,
    }


def _ascend(placed: Placed, node: NodeName, now: float) -> dict[str, str]:
    # huawei.com/<word>: per device its UUID, template (vNPU templates only), MiB, cores
    out = {"predicate-time": str(int(now))}
    info: dict[str, list[dict[str, object]]] = {}
    for _, devs in placed:
        for d in devs:
            item: dict[str, object] = {"UUID": d.uuid}
            if d.vnpu_template:
                item["temp"] = d.vnpu_template
            item["memory"] = d.memory_mib
            item["core"] = d.ai_cores if d.vnpu_template else d.cores
            info.setdefault(f"huawei.com/{_word(d)}", []).append(item)
    out.update({k: json.dumps(v, separators=(",", ":")) for k, v in info.items()})
    return out


HAMI_DEVICE_KEYS: dict[tuple[Vendor, bool], DeviceKeys] = {
    # (vendor, granted through a whole-count name): pkg/device/<vendor>/ of HAMi
    ("nvidia", False): DeviceKeys(
        "hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate"
    ),
    ("cambricon", False): DeviceKeys(
        "hami.io/cambricon-mlu-devices-allocated",
        "hami.io/cambricon-mlu-devices-to-allocate",
        "MLU",
        _cambricon,
    ),
    ("hygon", False): DeviceKeys(
        "hami.io/dcu-devices-allocated", "hami.io/dcu-devices-to-allocate", "DCU"
    ),
    ("metax", False): DeviceKeys(
        "hami.io/metax-sgpu-devices-allocated",
        "hami.io/metax-sgpu-devices-to-allocate",
        "Metax-SGPU",
        _metax,
    ),
    ("metax", True): DeviceKeys(
        "hami.io/metax-gpu-devices-allocated", "hami.io/metax-gpu-devices-to-allocate", "Metax-GPU"
    ),
    ("mthreads", False): DeviceKeys(
        "hami.io/mthreads-vgpu-devices-allocated", "", "Mthreads", _mthreads
    ),
    ("enflame", False): DeviceKeys(
        "hami.io/enflame-vgpu-devices-allocated", "", "Enflame", _enflame
    ),
    ("enflame", True): DeviceKeys(
        "hami.io/enflame-gcu-devices-allocated", "hami.io/enflame-gcu-devices-to-allocate", "GCU"
    ),
    ("kunlunxin", False): DeviceKeys(
        "hami.io/xpu-devices-allocated", "hami.io/xpu-devices-to-allocate", "XPU"
    ),
    ("kunlunxin", True): DeviceKeys("hami.io/kunlun-allocated", "", "kunlun", _kunlun),
    ("iluvatar", False): DeviceKeys(
        "hami.io/{model}-devices-allocated", "hami.io/{model}-devices-to-allocate", "{model}"
    ),
    ("amd", False): DeviceKeys("hami.io/amd-devices-allocated", "hami.io/amd-devices-to-allocate"),
    ("awsneuron", False): DeviceKeys("hami.io/aws-neuron-devices-allocated", "", "AWSNeuron"),
    ("awsneuron", True): DeviceKeys(
        "hami.io/aws-neuron-devices-allocated", "", "AWSNeuron", _neuron
    ),
    ("biren", False): DeviceKeys(
        "hami.io/Biren-devices-allocated", "hami.io/Biren-devices-to-allocate", "Biren"
    ),
    ("vastai", False): DeviceKeys(
        "hami.io/Vastai-devices-allocated", "hami.io/Vastai-devices-to-allocate", "Vastai"
    ),
    ("ascend", False): DeviceKeys(
        "hami.io/{model}-devices-allocated",
        "hami.io/{model}-devices-to-allocate",
        "{model}",
        _ascend,
    ),
}
"""HAMi's bind annotations per device type, written with ``compat.annotations: hami``."""

_ASCEND_WORDS = {c.chip_name: c.common_word for c in DEFAULT_VNPUS}
_ILUVATAR_MODELS = tuple(DEFAULT_VENDORS["iluvatar"].models)


def _word(d: DeviceGrant) -> str:
    """The common word HAMi names a device's type by: an Ascend chip's (from its model,
    ``Ascend910B3``), an Iluvatar model's (``BI-V100``); else the vendor."""
    if d.vendor == "ascend":
        chip = d.model.removeprefix("Ascend")
        return _ASCEND_WORDS.get(chip, d.model)
    lowered = d.model.lower()
    return max((m for m in _ILUVATAR_MODELS if m.lower() in lowered), key=len, default=d.model)


COMPAT_KEYS["hami"] |= {
    f"{role}:{vendor}{'-whole' if whole else ''}": key
    for (vendor, whole), keys in HAMI_DEVICE_KEYS.items()
    for role, key in (("allocated", keys.allocated), ("to-allocate", keys.to_allocate))
    if key and "{model}" not in key
}
"""(The roles ``allocated:<vendor>``... are written by :func:`hami_device_annotations`;
listed here so that a pod may not bring its own: services/webhook/validation.py.)"""

_grants_encoder = msgspec.json.Encoder()
_grants_decoder = msgspec.json.Decoder(tuple[ContainerGrant, ...])


def encode_grants(grants: Sequence[ContainerGrant]) -> str:
    """A pod's container grants as the compact JSON of its ``tessera.io/grant`` annotation."""
    return _grants_encoder.encode(tuple(grants)).decode()


def decode_grants(text: str) -> tuple[ContainerGrant, ...]:
    """Raises ``msgspec.DecodeError`` / ``ValidationError`` on a damaged annotation."""
    return _grants_decoder.decode(text)


def device_list(grants: Sequence[ContainerGrant], type_word: str = "") -> str:
    """HAMi/Volcano encoding: ``UUID,Type,memMiB,cores:`` per device, ``;`` per container;
    the type is ``type_word`` (``{model}``: the device's common word) or the model."""
    parts = []
    for c in grants:
        parts.append(
            "".join(
                f"{d.uuid},{_type_of(d, type_word)},{d.memory_mib},{d.cores}:" for d in c.devices
            )
        )
    return "".join(p + ";" for p in parts)


def _type_of(d: DeviceGrant, type_word: str) -> str:
    return type_word.replace("{model}", _word(d)) if type_word else d.model


def hami_device_annotations(
    node: NodeName, grants: Sequence[ContainerGrant], now: float
) -> dict[str, str]:
    """Per device type of the grant, HAMi's keys: its device list (every container, with
    only that type's devices) and the type's own annotations (:data:`HAMI_DEVICE_KEYS`)."""
    by_key: dict[tuple[DeviceKeys, str], list[list[DeviceGrant]]] = {}
    for i, c in enumerate(grants):
        for d in c.devices:
            keys = HAMI_DEVICE_KEYS.get((d.vendor, d.whole)) or HAMI_DEVICE_KEYS.get(
                (d.vendor, False)
            )
            if keys is None:
                continue
            word = _word(d) if "{model}" in keys.allocated else ""
            per = by_key.setdefault((keys, word), [[] for _ in grants])
            per[i].append(d)
    out: dict[str, str] = {}
    for (keys, word), per in by_key.items():
        placed: Placed = list(zip(grants, per, strict=True))
        only = [msgspec.structs.replace(c, devices=tuple(devs)) for c, devs in placed]
        text = device_list(only, keys.type_word)
        out[keys.allocated.replace("{model}", word)] = text
        if keys.to_allocate:
            out[keys.to_allocate.replace("{model}", word)] = text
        if keys.extras is not None:
            out.update(keys.extras(placed, node, now))
    return out


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
        when = str(int(now))
        values = {"node": node, "time": when, "phase": "allocating", "bind-time": when}
        out.update({key: values[role] for role, key in keys.items() if role in values})
        if compat == "hami":  # every vendor's own keys (NVIDIA's vgpu ones among them)
            out.update(hami_device_annotations(node, grants, now))
        else:  # Volcano's vGPU device plugin serves NVIDIA cards only
            nvidia = [
                msgspec.structs.replace(
                    c, devices=tuple(d for d in c.devices if d.vendor == "nvidia")
                )
                for c in grants
            ]
            devices = device_list(nvidia)
            out.update({keys["allocated"]: devices, keys["to-allocate"]: devices})
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
