"""NodeResourcesFit: the node's allocatable less what its pods request must hold the
pod's requests (and one more pod); its score packs (MostAllocated, for binpack) or
spreads (LeastAllocated) cpu and memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin, ScorePlugin
from shared.core.hosts import CPU, EPHEMERAL, MEMORY, PODS
from shared.core.status import UNRESOLVABLE, UNSCHEDULABLE, Code, Reason, Status

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Prepared

NAME = "NodeResourcesFit"
TOO_MANY_PODS = Reason(kind="too-many-pods", plugin=NAME)
_ORDER = {r: i for i, r in enumerate((PODS, CPU, MEMORY, EPHEMERAL))}


class NodeResourcesFit(FilterPlugin, ScorePlugin):
    """Filter: every resource the pod requests, and a pod slot, free on the node; every
    shortage is a reason, unresolvable when a request exceeds what the node has at all.
    Score: ``binpack`` nodes score by MostAllocated, others by LeastAllocated (cpu and
    memory 1:1, on the requests scoring counts)."""

    name = NAME

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """Every resource short, in kube-scheduler's order (pods, cpu, memory, storage,
        then the others)."""
        spec = host.spec
        assert spec is not None  # the framework runs it on known nodes only
        alloc = spec.allocatable
        reasons: list[Reason] = []
        unresolvable = False
        if host.count + 1 > alloc.get(PODS, 0):
            reasons.append(TOO_MANY_PODS)
        used = host.requested
        for name, want in prep.pod.requests.items():
            if want <= 0:
                continue
            have = alloc.get(name, 0)
            free = have - used.get(name, 0)
            if want > free:
                big = want > have
                unresolvable = unresolvable or big
                reasons.append(
                    Reason(
                        kind="insufficient",
                        code=UNRESOLVABLE if big else UNSCHEDULABLE,
                        resource=name,
                        requested=want,
                        free=free,
                        capacity=have,
                        plugin=NAME,
                    )
                )
        if not reasons:
            return None
        if len(reasons) > 1:
            reasons.sort(key=lambda r: _ORDER.get(r.resource or PODS, len(_ORDER)))
        code = Code.UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE
        return Status(code=code, reasons=tuple(reasons))

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """MostAllocated for ``binpack``, LeastAllocated otherwise, per node."""
        pod, most = prep.pod, policy == "binpack"
        return [_fit_score(pod.score_cpu, pod.score_memory, h, most=most) for h in hosts]


def _fit_score(cpu: int, memory: int, host: HostNode, *, most: bool) -> float:
    spec = host.spec
    if spec is None:
        return 0.0
    parts = []
    for have, used, want in (
        (spec.allocatable.get(CPU, 0), host.nonzero_cpu, cpu),
        (spec.allocatable.get(MEMORY, 0), host.nonzero_memory, memory),
    ):
        if have <= 0:
            continue
        req = used + want
        if most:
            parts.append(min(req, have) * 100 // have)
        else:
            parts.append(0 if req > have else (have - req) * 100 // have)
    return float(sum(parts) // len(parts)) if parts else 0.0
