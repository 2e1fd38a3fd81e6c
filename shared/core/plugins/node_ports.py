"""NodePorts: a host port (protocol, IP) is held by one pod per node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin
from shared.core.hosts import HostPort
from shared.core.status import Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Prepared

NAME = "NodePorts"
NODE_PORTS = fail(Reason(kind="node-ports", plugin=NAME))


class NodePorts(FilterPlugin):
    """Refuses a node where a pod already holds one of the pod's host ports: the same
    port and protocol on the same IP, or on any IP when either side binds 0.0.0.0."""

    name = NAME
    reads = "ports"

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """The pod's host ports against those the node's pods hold."""
        return NODE_PORTS if conflict(prep.pod.ports, host.ports) else None


def conflict(wanted: tuple[HostPort, ...], used: list[HostPort]) -> bool:
    """Does any of ``wanted`` clash with a port in ``used``?"""
    for w in wanted:
        for u in used:
            if u.port != w.port or u.protocol != w.protocol:
                continue
            if w.ip == "0.0.0.0" or u.ip == "0.0.0.0" or u.ip == w.ip:
                return True
    return False
