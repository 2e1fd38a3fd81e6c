"""The node agent's half of admission: which pod each kubelet ``Allocate`` is for.

Pure. The agent feeds it every ``allocation.bound`` for its node (the pods the kubelet
will admit) and every deletion; ``match`` takes one ``Allocate`` container request (the
channel of the resource called, a vendor or a resource counted in units, and its number
of device IDs) and names the pod and container grant it is for. The rules and why they
are unambiguous are in shared/core/admission.py; here:

- a pod whose first container was served on a channel gets the calls that follow on
  it, container after container (the kubelet admits one pod at a time);
- otherwise the call is for the one waiting pod whose first container on that channel
  asks that many IDs. The allocator keeps that pod unique per node. Should two be
  waiting anyway (an allocator without the rule), identical grants are interchangeable
  and the oldest is taken; different grants are refused, never guessed.

A container that names resources of two channels (``nvidia.com/gpu`` and
``huawei.com/Ascend910B3``) gets one call on each, in any order; each is answered with
the container's whole hand-out, the same both times, which the kubelet merges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from shared.core.admission import Channel, amounts, container_amounts
from shared.core.model import ContainerGrant, PodRef, PodUID


@dataclass
class Waiting:
    """A pod bound here whose kubelet has not taken all its devices yet."""

    pod: PodRef
    grants: tuple[ContainerGrant, ...]
    order: int
    served: dict[Channel, int] = field(default_factory=dict)
    """Per channel, how many of its containers were handed their grant."""

    def next_grant(self, channel: Channel) -> ContainerGrant | None:
        """The container grant the next call on ``channel`` gets (containers that ask devices of
        ``channel``, in order), or None once all of them were served."""
        using = [c for c in self.grants if channel in amounts(c)]
        i = self.served.get(channel, 0)
        return using[i] if i < len(using) else None

    def done(self) -> bool:
        """Whether every container was served on every channel it asks: the pod is admitted."""
        calls = container_amounts(self.grants)
        return all(self.served.get(ch, 0) >= len(n) for ch, n in calls.items())


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
        self.current: dict[Channel, PodUID] = {}
        """Per channel, the pod whose containers are being served."""
        self._order = 0

    def bound(self, pod: PodRef, grants: tuple[ContainerGrant, ...]) -> None:
        """A pod bound here waits for its calls, in the order bound; a repeat, or a pod granted no
        device, is not recorded."""
        if pod.uid in self.waiting or not any(c.devices for c in grants):
            return
        self._order += 1
        self.waiting[pod.uid] = Waiting(pod=pod, grants=grants, order=self._order)

    def gone(self, uid: PodUID) -> None:
        """A pod deleted or admitted: it waits no more, and no channel keeps serving it."""
        self.waiting.pop(uid, None)
        for channel, current in list(self.current.items()):
            if current == uid:
                del self.current[channel]

    def match(self, channel: Channel, count: int) -> Match | None:
        """The pod and container this Allocate of ``count`` device IDs on ``channel`` is
        for, or None while none is known (its ``allocation.bound`` has not reached the
        node yet). Raises ``AmbiguousError``."""
        chosen: Waiting | None = None
        uid = self.current.get(channel)
        if uid is not None:
            w = self.waiting.get(uid)
            nxt = w.next_grant(channel) if w is not None else None
            if w is not None and nxt is not None and amounts(nxt)[channel] == count:
                chosen = w
            else:
                del self.current[channel]  # that pod is through (or its admission failed)
        if chosen is None:
            fresh = [
                w
                for w in self.waiting.values()
                if w.served.get(channel, 0) == 0
                and (g := w.next_grant(channel)) is not None
                and amounts(g)[channel] == count
            ]
            if not fresh:
                return None
            fresh.sort(key=lambda w: w.order)
            first = fresh[0]
            if any(_shape(w, channel) != _shape(first, channel) for w in fresh[1:]):
                names = ", ".join(str(w.pod) for w in fresh)
                raise AmbiguousError(
                    f"{len(fresh)} pods bound here wait for {count} {channel} device ID(s) "
                    f"with different grants ({names}); refusing to guess which one this is"
                )
            chosen = first
        grant = chosen.next_grant(channel)
        assert grant is not None
        chosen.served[channel] = chosen.served.get(channel, 0) + 1
        admitted = chosen.done()
        if admitted:
            self.gone(chosen.pod.uid)
        else:
            self.current[channel] = chosen.pod.uid
        return Match(pod=chosen.pod, grant=grant, admitted=admitted)


def _shape(w: Waiting, channel: Channel) -> tuple[object, ...]:
    """What the container would be handed, less who it is (two equal shapes are
    interchangeable)."""
    g = w.next_grant(channel)
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
