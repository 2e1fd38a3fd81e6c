"""Which pod a kubelet ``Allocate`` is for: the shape both sides agree on.

The kubelet's ``Allocate`` names device IDs only, one container and one resource at a
time, never the pod (docs/compat.md, section 3). HAMi serialises every bind to a node
behind a node lock so that only one pod can be meant; Volcano guesses the oldest pod,
and under concurrent binds the guess hands one pod's limits to another.

Tessera makes the answer unambiguous without a node lock. The kubelet admits one pod at
a time, container after container, and asks each device resource a container names for
exactly as many device IDs as the container requested of it. Every registered resource
belongs to one *channel*:

- a vendor's count resources (``nvidia.com/gpu``, ``volcano.sh/vgpu-number``,
  ``huawei.com/Ascend910B3``...): the channel is the vendor, one device ID per device;
- a resource counted in units instead of devices (:data:`UNIT_CHANNELS`): Volcano's
  gpu-share ``volcano.sh/gpu-memory`` (one ID per ``gpuMemoryFactor`` MiB) and
  MindCluster's ``huawei.com/npu-core`` (one ID per AI core). A device granted through
  one carries the IDs it stands for (``DeviceGrant.units``).

So the first ``Allocate`` of a pod on a channel carries the amount of its first
container using that channel: its *admission key* ``(channel, amount)``. The allocator
never has two pods with a common admission key in flight (bound, not yet admitted) to
one node; pods of other shapes, and every other node, bind concurrently. The node agent
then matches each first call to the one pod with that key, and the calls that follow
on the same channel to the same pod's next containers. Channels never mix: each granted
device comes through exactly one (its ``units`` say which), and an amount counts only
the devices of its own channel, so a call on one channel is never matched by what a
pod asks on another (the request parser refuses gpu-share beside the NVIDIA count
names in one container, so a container's NVIDIA devices come through one channel).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.core.model import ContainerGrant, DeviceGrant, Vendor

Channel = str
"""A vendor (its count resources) or one of :data:`UNIT_CHANNELS`' values."""
AdmissionKey = tuple[Channel, int]

UNIT_CHANNELS: dict[Vendor, Channel] = {"nvidia": "gpu-share", "ascend": "npu-core"}
"""Per vendor, the channel of its resource counted in units (``DeviceGrant.units``)."""


def channel_of(device: DeviceGrant) -> Channel:
    """The channel the kubelet asks ``device`` through."""
    if device.units:
        return UNIT_CHANNELS.get(device.vendor, f"{device.vendor}-units")
    return device.vendor


def container_amounts(grants: Sequence[ContainerGrant]) -> dict[Channel, list[int]]:
    """Per channel, the amount each container (in kubelet order: init containers first)
    asks of it: the sequence of ``Allocate`` calls the pod will cause there."""
    out: dict[Channel, list[int]] = {}
    for c in grants:
        for channel, amount in amounts(c).items():
            out.setdefault(channel, []).append(amount)
    return out


def amounts(grant: ContainerGrant) -> dict[Channel, int]:
    """The device IDs one container asks of each channel it uses."""
    per: dict[Channel, int] = {}
    for d in grant.devices:
        if d.external:
            continue  # another device plugin's: no Allocate of it reaches Tessera's agent
        channel = channel_of(d)
        per[channel] = per.get(channel, 0) + (d.units or 1)
    return per


def keys_of_grants(grants: Sequence[ContainerGrant]) -> frozenset[AdmissionKey]:
    """The admission keys of a pod: per channel, its first container's amount."""
    return frozenset((ch, n[0]) for ch, n in container_amounts(grants).items())


def clash(a: Iterable[AdmissionKey], b: frozenset[AdmissionKey]) -> bool:
    """Whether two pods share an admission key (one Allocate could mean either)."""
    return any(k in b for k in a)
