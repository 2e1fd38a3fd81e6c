"""NodeResourcesBalancedAllocation: prefer the node whose cpu and memory use the pod
leaves most even (the pinned release scores the change in balance, 50 to 100)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.framework import ScorePlugin
from shared.core.hosts import CPU, MEMORY

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Prepared


class NodeResourcesBalancedAllocation(ScorePlugin):
    """Scores each node by how much the pod evens its cpu and memory fractions."""

    name = "NodeResourcesBalancedAllocation"

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """50 + half the change in balance (0 for a pod asking neither cpu nor memory)."""
        requests = prep.pod.requests
        if not (requests.get(CPU) or requests.get(MEMORY)):
            return [0.0] * len(hosts)
        return [_balance(requests, h) for h in hosts]


def _balance(requests: dict[str, int], host: HostNode) -> float:
    spec = host.spec
    if spec is None:
        return 0.0
    before, after = [], []
    for name in (CPU, MEMORY):
        have = spec.allocatable.get(name, 0)
        if have <= 0:
            continue
        used = host.requested.get(name, 0)
        before.append(min(used / have, 1.0))
        after.append(min((used + requests.get(name, 0)) / have, 1.0))
    return float(50 + (50 + _even(after) - _even(before)) // 2)


def _even(fractions: list[float]) -> int:
    std = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - std) * 100)
