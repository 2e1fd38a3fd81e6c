"""NodeName: a pod that names its node (``spec.nodeName``) fits there only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin
from shared.core.status import UNRESOLVABLE, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Prepared

NAME = "NodeName"
NODE_NAME = fail(Reason(kind="node-name", code=UNRESOLVABLE, plugin=NAME))


class NodeName(FilterPlugin):
    """Refuses every node but the one the pod names."""

    name = NAME
    reads = "node_name"
    node_only = True

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """The node's name against the pod's ``spec.nodeName``."""
        return NODE_NAME if prep.pod.node_name != host.name else None
