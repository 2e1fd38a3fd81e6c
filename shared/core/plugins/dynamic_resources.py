"""DynamicResources: each allocated ResourceClaim of the pod must be reachable from the
node (its allocation's node selector); a claim not ready waits (shared/core/claims.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin
from shared.core.plugins.volume_binding import waits
from shared.core.status import UNRESOLVABLE, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "DynamicResources"
CLAIM_NODE = fail(Reason(kind="claim-node", code=UNRESOLVABLE, plugin=NAME))


class DynamicResources(FilterPlugin):
    """Refuses a node that an allocated claim's node selector does not take."""

    name = NAME
    reads = "claims"
    labels_only = True

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """A ResourceClaim not ready makes the pod wait, on every node."""
        return waits(hosts, prep, NAME, lambda claims: claims.devices)

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """Every allocated claim's node selector against the node."""
        claims = prep.pod.claims
        assert claims is not None  # pre_filter skips a pod without
        name, labels = host.name, host.labels
        for terms in claims.devices:
            if not any(t.matches(name, labels) for t in terms):
                return CLAIM_NODE
        return None
