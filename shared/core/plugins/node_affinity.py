"""NodeAffinity: the pod's ``nodeSelector`` and required node affinity pick the nodes it
may run on; its preferred terms weigh in the score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin, ScorePlugin, normalised
from shared.core.status import UNRESOLVABLE, Code, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "NodeAffinity"
NODE_AFFINITY = fail(Reason(kind="node-affinity", code=UNRESOLVABLE, plugin=NAME))
OUTSIDE_NODE_SET = fail(Reason(kind="node-set", code=UNRESOLVABLE, plugin=NAME))
"""A node outside the names the pod's ``matchFields`` allow (PreFilter's node set)."""


class NodeAffinity(FilterPlugin, ScorePlugin):
    """PreFilter: the node names required terms pin with ``matchFields`` (the framework
    offers the pod no other node). Filter: the selector and required terms match the
    node. Score: the summed weights of the preferred terms it matches (weight 2)."""

    name = NAME
    node_only = True
    weight = 2

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """The node set of ``metadata.name`` terms: a term pinning names contributes
        their intersection, the terms' sets are joined; terms that pin nothing allow
        every node. An empty set rejects every node."""
        pod = prep.pod
        names: set[str] | None = None
        for term in pod.node_affinity or ():
            if not term.pinned:
                names = None
                break
            chosen = set(term.pinned[0])
            for values in term.pinned[1:]:
                chosen &= set(values)
            names = chosen if names is None else names | chosen
        if names is not None:
            if not names:
                return Status(
                    code=Code.UNRESOLVABLE,
                    reasons=(
                        Reason(kind="affinity-conflict", code=UNRESOLVABLE, nodes=0, plugin=NAME),
                    ),
                    nodes=hosts.known,
                )
            prep.names = names
        return bool(pod.node_selector or pod.node_affinity is not None)

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """The node's labels (and name) against the selector and required terms."""
        if prep.pod.matches_node(host.name, host.labels):
            return None
        return NODE_AFFINITY

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """The weights of the preferred terms each node matches, normalised."""
        preferred = prep.pod.preferred_nodes
        if not preferred:
            return None
        raw = [sum(w.weight for w in preferred if w.term.matches(h.name, h.labels)) for h in hosts]
        return normalised(raw)
