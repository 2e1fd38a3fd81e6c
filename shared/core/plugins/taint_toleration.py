"""TaintToleration: NoSchedule and NoExecute taints keep out pods that do not tolerate
them; PreferNoSchedule taints a pod does not tolerate lower the node's score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin, ScorePlugin, normalised
from shared.core.status import UNRESOLVABLE, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "TaintToleration"
TAINTED = fail(Reason(kind="taint", code=UNRESOLVABLE, plugin=NAME))


class TaintToleration(FilterPlugin, ScorePlugin):
    """Filter: every NoSchedule/NoExecute taint tolerated. Score: fewer untolerated
    PreferNoSchedule taints is better (weight 3 by default)."""

    name = NAME
    node_only = True
    weight = 3

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """Nothing to check while no node has a NoSchedule or NoExecute taint."""
        return bool(hosts.tainted)

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """The node's taints against the pod's tolerations (once per distinct set of
        taints for a pod: most nodes of a pool carry the same)."""
        spec = host.spec
        if spec is None or not spec.taints:
            return None
        seen = prep.tolerated
        if seen is None:
            seen = prep.tolerated = {}
        ok = seen.get(spec.taints)
        if ok is None:
            ok = seen[spec.taints] = prep.pod.tolerates(spec.taints) is None
        return None if ok else TAINTED

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """Untolerated PreferNoSchedule taints per node, fewest best."""
        tolerations = [x for x in prep.pod.tolerations if x.effect in ("", "PreferNoSchedule")]
        raw = [
            sum(
                1
                for t in (h.spec.taints if h.spec else ())
                if t.effect == "PreferNoSchedule" and not any(x.tolerates(t) for x in tolerations)
            )
            for h in hosts
        ]
        return normalised(raw, reverse=True)
