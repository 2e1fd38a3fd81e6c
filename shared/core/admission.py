"""Which pod a kubelet ``Allocate`` is for: the shape both sides agree on.

The kubelet's ``Allocate`` names device IDs only, one container at a time, never the pod
(docs/compat.md, section 3). HAMi serialises every bind to a node behind a node lock so
that only one pod can be meant; Volcano guesses the oldest pod, and under concurrent binds the guess
hands one pod's limits to another.

Tessera makes the answer unambiguous without a node lock. The kubelet admits one pod at
a time, container after container, and asks each device resource for exactly as many
devices as the container requested. So the first ``Allocate`` of a pod for a vendor
carries the device count of its first container using that vendor: its *admission
key* ``(vendor, count)``. The allocator never has two pods with a common admission key in
flight (bound, not yet admitted) to one node; pods of other shapes, and every other
node, bind concurrently. The node agent then matches each first call to the one pod
with that key, and the calls that follow to the same pod's next containers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.core.model import ContainerGrant, Vendor

AdmissionKey = tuple[Vendor, int]


def container_counts(grants: Sequence[ContainerGrant]) -> dict[Vendor, list[int]]:
    """Per vendor, the device count of each container (in kubelet order: init containers
    first) that uses the vendor: the sequence of ``Allocate`` calls the pod will cause."""
    out: dict[Vendor, list[int]] = {}
    for c in grants:
        per: dict[Vendor, int] = {}
        for d in c.devices:
            per[d.vendor] = per.get(d.vendor, 0) + 1
        for vendor, n in per.items():
            out.setdefault(vendor, []).append(n)
    return out


def keys_of_grants(grants: Sequence[ContainerGrant]) -> frozenset[AdmissionKey]:
    return frozenset((v, counts[0]) for v, counts in container_counts(grants).items())


def clash(a: Iterable[AdmissionKey], b: frozenset[AdmissionKey]) -> bool:
    return any(k in b for k in a)
