"""NodeUnschedulable: a cordoned node takes only pods that tolerate its taint."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin
from shared.core.hosts import UNSCHEDULABLE_TAINT, Taint
from shared.core.status import UNRESOLVABLE, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "NodeUnschedulable"
NODE_UNSCHEDULABLE = fail(Reason(kind="node-unschedulable", code=UNRESOLVABLE, plugin=NAME))
_CORDON = Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")


class NodeUnschedulable(FilterPlugin):
    """Refuses a node whose ``spec.unschedulable`` is set (``kubectl cordon``) unless the
    pod tolerates ``node.kubernetes.io/unschedulable:NoSchedule``."""

    name = NAME
    node_only = True

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """Nothing to check while no node is cordoned."""
        return bool(hosts.cordoned)

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """The node's cordon against the pod's tolerations."""
        spec = host.spec
        if spec is None or not spec.unschedulable:
            return None
        if any(t.tolerates(_CORDON) for t in prep.pod.tolerations):
            return None
        return NODE_UNSCHEDULABLE
