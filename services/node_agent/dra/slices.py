"""A node's devices as DRA sees them: the devices of its ResourceSlice, and the grant one
allocated device stands for.

Pure: the node's inventory (as the agent reads it) and the config go in; the
ResourceSlice (``resource.k8s.io/v1``) the agent publishes, and per device name what
services/node_agent/dra/plugin.py hands a claim for it, come out. One pool per node, named
after the node, in one slice:

- a card in ``hami-core`` or ``mps`` mode is one device ``gpu-<index>`` with
  ``allowMultipleAllocations`` and two consumable capacities, ``cores`` (percent, 1 to
  100) and ``memory`` (bytes, 1Mi steps), each defaulting to the whole card, so a claim
  asking nothing gets the card to itself and ``capacity.requests`` ask a share
  (HAMi's DRA driver names and shapes them alike: docs/dra.md);
- a card in ``mig`` mode offers its running MIG instances, ``gpu-<index>-mig-<placement>``,
  each whole (MIG isolates in hardware);
- an Ascend NPU is one whole device ``npu-<index>``;
- other vendors are not offered through DRA yet.

Attributes are in the driver's domain (``device.attributes['gpu.tessera.io'].uuid``;
a card's ``nvlinkIsland``, where NVML read its links, lets ``matchAttribute`` keep a
claim's cards on one NVLink island);
a device that is not healthy carries a ``NoSchedule`` taint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shared.config import Config
from shared.core.ledger import sharing_mode
from shared.core.model import DeviceGrant, DeviceInfo, MigInstance, NodeName
from shared.core.quantity import parse_quantity
from shared.core.topology import nvlink_islands

MIB = 1 << 20
API_VERSION = "resource.k8s.io/v1"
UNHEALTHY_TAINT = "unhealthy"
"""The key (in the driver's domain) of the taint an unhealthy device carries."""

Kind = Literal["gpu", "mig", "npu"]


@dataclass(frozen=True)
class DraDevice:
    """One device of the node's ResourceSlice and what it stands for."""

    name: str
    kind: Kind
    card: DeviceInfo
    mig: MigInstance | None = None
    shared: bool = False
    """Published with ``allowMultipleAllocations`` and consumable ``cores`` and ``memory``."""
    island: int | None = None
    """The card's NVLink island (shared/core/topology.py ``nvlink_islands``), published as
    ``nvlinkIsland`` on a whole card's device; None when its links were not read."""


def dra_devices(cfg: Config, node: NodeName, devices: Iterable[DeviceInfo]) -> list[DraDevice]:
    """The devices ``node`` offers through DRA (the module docstring says which), in the
    inventory's order; ``filterDevices`` of the node's ``nodeConfigs`` entry leaves cards out
    as it does for the device plugin."""
    override = cfg.node_override(node)
    cards = list(devices)
    islands = nvlink_islands({d.index: d.links for d in cards if d.vendor == "nvidia"})
    out: list[DraDevice] = []
    for d in cards:
        if override is not None and override.filter_devices.excludes(d.uuid, d.index):
            continue
        if d.vendor == "ascend":
            out.append(DraDevice(f"npu-{d.index}", "npu", d))
        elif d.vendor == "nvidia" and cfg.devices.nvidia.enabled:
            if sharing_mode(d, override) == "mig":
                out += [
                    DraDevice(f"gpu-{d.index}-mig-{m.placement}", "mig", d, mig=m)
                    for m in d.mig_geometry
                    if m.uuid is not None
                ]
            else:
                island = islands.get(d.index)
                out.append(DraDevice(f"gpu-{d.index}", "gpu", d, shared=True, island=island))
    return out


def _version(text: str) -> str | None:
    """A dotted version as the semantic version DRA's ``version`` attributes hold
    (``9.0`` → ``9.0.0``, ``580.65.06`` → ``580.65.6``); None when it is not numeric."""
    parts = text.split(".")
    if not text or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    return ".".join(str(int(p)) for p in [*parts, "0", "0"][:3])


def attributes(device: DraDevice) -> dict[str, dict[str, Any]]:
    """The device's attributes (unqualified: the driver's domain)."""
    card = device.card
    out: dict[str, dict[str, Any]] = {
        "type": {"string": device.kind},
        "index": {"int": card.index},
        "productName": {"string": card.model},
        "numaNode": {"int": card.numa},
    }
    if device.mig is not None:
        out["uuid"] = {"string": device.mig.uuid or ""}
        out["parentUUID"] = {"string": card.uuid}
        out["profile"] = {"string": device.mig.profile}
        out["placement"] = {"int": device.mig.placement}
    else:
        out["uuid"] = {"string": card.uuid}
    if device.island is not None:
        out["nvlinkIsland"] = {"int": device.island}
    if card.chip:
        out["chip"] = {"string": card.chip}
    for name, text in (("architecture", card.architecture), ("pciBusID", card.pci_bus_id)):
        if text:
            out[name] = {"string": text}
    for name, text in (
        ("cudaComputeCapability", card.compute_capability),
        ("driverVersion", card.driver_version),
    ):
        version = _version(text)
        if version is not None:
            out[name] = {"version": version}
    return out


def capacity(device: DraDevice) -> dict[str, dict[str, Any]]:
    """The device's capacity: ``memory`` (and ``cores`` for a shared card, each with a
    request policy: the whole card by default, in 1% and 1Mi steps)."""
    card = device.card
    memory = device.mig.memory_mib if device.mig is not None else card.memory_mib
    if not device.shared:
        return {"memory": {"value": f"{memory}Mi"}}
    return {
        "cores": {
            "value": str(card.cores),
            "requestPolicy": {
                "default": str(card.cores),
                "validRange": {"min": "1", "max": str(card.cores), "step": "1"},
            },
        },
        "memory": {
            "value": f"{memory}Mi",
            "requestPolicy": {
                "default": f"{memory}Mi",
                "validRange": {"min": "1Mi", "max": f"{memory}Mi", "step": "1Mi"},
            },
        },
    }


def slice_name(cfg: Config, node: NodeName) -> str:
    """The name of ``node``'s one ResourceSlice: the node's, then the driver's."""
    return f"{node}-{cfg.node_agent.dra.driver_name}"


def resource_slice(
    cfg: Config, node: NodeName, devices: Iterable[DeviceInfo], generation: int
) -> dict[str, Any]:
    """``node``'s ResourceSlice: its one pool (named after the node) at ``generation``."""
    driver = cfg.node_agent.dra.driver_name
    out = []
    for d in dra_devices(cfg, node, devices):
        device: dict[str, Any] = {
            "name": d.name,
            "attributes": attributes(d),
            "capacity": capacity(d),
        }
        if d.shared:
            device["allowMultipleAllocations"] = True
        if not d.card.healthy:
            device["taints"] = [
                {"key": f"{driver}/{UNHEALTHY_TAINT}", "value": "true", "effect": "NoSchedule"}
            ]
        out.append(device)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(cfg, node)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": out,
        },
    }


class GrantError(ValueError):
    """An allocated device cannot be handed over (unknown here, or a mix the container
    cannot be given)."""


def grant_of(device: DraDevice, consumed: Mapping[str, Any] | None) -> DeviceGrant:
    """What a claim allocated ``device`` gets of it: the whole device, or on a shared card
    the ``consumedCapacity`` the scheduler wrote (memory rounded up to whole MiB). A share
    that is the whole card is handed over as a whole card, as the device plugin does."""
    card = device.card
    if device.mig is not None:
        return DeviceGrant(
            uuid=card.uuid,
            index=card.index,
            model=card.model,
            memory_mib=device.mig.memory_mib,
            exclusive=True,
            mig_profile=device.mig.profile,
            mig_placement=device.mig.placement,
        )
    whole = DeviceGrant(
        uuid=card.uuid,
        index=card.index,
        vendor=card.vendor,
        model=card.model,
        memory_mib=card.memory_mib,
        cores=card.cores,
        exclusive=True,
    )
    if not device.shared or not consumed:
        return whole
    try:
        memory = parse_quantity(consumed.get("memory", f"{card.memory_mib}Mi"))
        cores = parse_quantity(consumed.get("cores", str(card.cores)))
    except ValueError as exc:
        raise GrantError(
            f"device {device.name}: consumedCapacity {dict(consumed)}: {exc}"
        ) from None
    memory_mib = -(-memory // MIB)
    cores_pct = -(-cores // 1)
    if memory_mib >= card.memory_mib and cores_pct >= card.cores:
        return whole
    return DeviceGrant(
        uuid=card.uuid,
        index=card.index,
        vendor=card.vendor,
        model=card.model,
        memory_mib=int(min(memory_mib, card.memory_mib)),
        cores=int(min(cores_pct, card.cores)),
    )
