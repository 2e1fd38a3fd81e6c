"""The node agent's half of admission: which pod each kubelet ``Allocate`` is for.

Pure. The agent feeds it every ``allocation.bound`` for its node (the pods the kubelet
will admit) and every deletion; ``match`` takes one ``Allocate`` container request (a
vendor and a device count) and names the pod and container grant it is for. The rules
and why they are unambiguous are in shared/core/admission.py; here:

- a pod whose first container was served gets the calls that follow, container after
  container (the kubelet admits one pod at a time);
- otherwise the call is for the one waiting pod whose first container of that vendor
  asks that many devices. The allocator keeps that pod unique per node. Should two be
  waiting anyway (an allocator without the rule), identical grants are interchangeable
  and the oldest is taken; different grants are refused, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from shared.core.admission import container_counts
from shared.core.model import ContainerGrant, PodRef, PodUID, Vendor


@dataclass
class Waiting:
    """A pod bound here whose kubelet has not taken all its devices yet."""

    pod: PodRef
    grants: tuple[ContainerGrant, ...]
    order: int
    served: dict[Vendor, int] = field(default_factory=dict)
    """Per vendor, how many of its containers were handed their grant."""

    def next_grant(self, vendor: Vendor) -> ContainerGrant | None:
        using = [c for c in self.grants if any(d.vendor == vendor for d in c.devices)]
        i = self.served.get(vendor, 0)
        return using[i] if i < len(using) else None

    def done(self) -> bool:
        counts = container_counts(self.grants)
        return all(self.served.get(v, 0) >= len(n) for v, n in counts.items())


@dataclass(frozen=True)
class Match:
    """The grant an ``Allocate`` call gets: whose pod, which container, whether the last."""

    pod: PodRef
    grant: ContainerGrant
    admitted: bool
    """This was the pod's last container: the pod is admitted."""


class AmbiguousError(Exception):
    """Two waiting pods with different grants fit one Allocate: refuse, never guess."""


class Admissions:
    """Which pod each ``Allocate`` is for (shared/core/admission.py says why it is certain)."""

    def __init__(self) -> None:
        self.waiting: dict[PodUID, Waiting] = {}
        self.current: dict[Vendor, PodUID] = {}
        """Per vendor, the pod whose containers are being served."""
        self._order = 0

    def bound(self, pod: PodRef, grants: tuple[ContainerGrant, ...]) -> None:
        if pod.uid in self.waiting or not any(c.devices for c in grants):
            return
        self._order += 1
        self.waiting[pod.uid] = Waiting(pod=pod, grants=grants, order=self._order)

    def gone(self, uid: PodUID) -> None:
        self.waiting.pop(uid, None)
        for vendor, current in list(self.current.items()):
            if current == uid:
                del self.current[vendor]

    def match(self, vendor: Vendor, count: int) -> Match | None:
        """The pod and container this Allocate is for, or None while none is known
        (its ``allocation.bound`` has not reached the node yet). Raises ``AmbiguousError``."""
        chosen: Waiting | None = None
        uid = self.current.get(vendor)
        if uid is not None:
            w = self.waiting.get(uid)
            nxt = w.next_grant(vendor) if w is not None else None
            if w is not None and nxt is not None and _count(nxt, vendor) == count:
                chosen = w
            else:
                del self.current[vendor]  # that pod is through (or its admission failed)
        if chosen is None:
            fresh = [
                w
                for w in self.waiting.values()
                if w.served.get(vendor, 0) == 0
                and (g := w.next_grant(vendor)) is not None
                and _count(g, vendor) == count
            ]
            if not fresh:
                return None
            fresh.sort(key=lambda w: w.order)
            first = fresh[0]
            if any(_shape(w, vendor) != _shape(first, vendor) for w in fresh[1:]):
                names = ", ".join(str(w.pod) for w in fresh)
                raise AmbiguousError(
                    f"{len(fresh)} pods bound here wait for {count} {vendor} device(s) with "
                    f"different grants ({names}); refusing to guess which one this is"
                )
            chosen = first
        grant = chosen.next_grant(vendor)
        assert grant is not None
        chosen.served[vendor] = chosen.served.get(vendor, 0) + 1
        admitted = chosen.done()
        if admitted:
            self.gone(chosen.pod.uid)
        else:
            self.current[vendor] = chosen.pod.uid
        return Match(pod=chosen.pod, grant=grant, admitted=admitted)


def _count(grant: ContainerGrant, vendor: Vendor) -> int:
    return sum(1 for d in grant.devices if d.vendor == vendor)


def _shape(w: Waiting, vendor: Vendor) -> tuple[object, ...]:
    """What the container would be handed, less who it is (two equal shapes are
    interchangeable)."""
    g = w.next_grant(vendor)
    assert g is not None
    return (g.devices, g.priority, g.disable_isolation, g.core_policy)


KUBELET_CHECKPOINT = "kubelet_internal_checkpoint"
"""The kubelet's record of the devices it gave each pod, in its device-plugin directory."""


def admitted_in_checkpoint(text: str) -> set[str] | None:
    """The pod UIDs the kubelet's device manager has allocated devices to, from its
    checkpoint (``{"Data": {"PodDeviceEntries": [{"PodUID": ...}, ...]}, ...}``); None
    when the text is not such a checkpoint (JSON nested too deep to decode included)."""
    try:
        data = msgspec.json.decode(text)
        entries = data["Data"]["PodDeviceEntries"] or []
        return {str(e["PodUID"]) for e in entries}
    except (msgspec.DecodeError, KeyError, TypeError, RecursionError):
        return None
