"""VolumeBinding: the pod's bound PersistentVolumes must exist and be reachable from the
node (their ``spec.nodeAffinity``); a claim not ready waits (shared/core/claims.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin
from shared.core.hosts import Claims
from shared.core.status import UNRESOLVABLE, Code, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "VolumeBinding"
VOLUME_NODE = fail(Reason(kind="volume-node", code=UNRESOLVABLE, plugin=NAME))
VOLUME_MISSING = fail(Reason(kind="volume-missing", code=UNRESOLVABLE, plugin=NAME))


def waits(
    hosts: Hosts, prep: Prepared, plugin: str, checks: Callable[[Claims], object]
) -> Status | bool:
    """The PreFilter of the plugins that read the pod's claims: the claims' wait, if
    ``plugin`` found it (shared/core/claims.py), rejects every node; else whether the
    plugin's filter has anything to check (``checks`` of the claims)."""
    claims = prep.pod.claims
    if claims is None:
        return False
    wait = claims.wait
    if wait is not None and wait.plugin == plugin:
        return Status(
            code=Code.UNRESOLVABLE,
            reasons=(wait,),
            nodes=hosts.known,
        )
    return bool(checks(claims))


class VolumeBinding(FilterPlugin):
    """Refuses a node when one of the pod's volumes exists nowhere or its node affinity
    misses the node's labels (the first such volume)."""

    name = NAME
    reads = "claims"
    labels_only = True

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """A PersistentVolumeClaim not ready makes the pod wait, on every node."""
        return waits(hosts, prep, NAME, lambda claims: claims.volumes)

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """Each bound volume against the node's labels."""
        claims = prep.pod.claims
        assert claims is not None  # pre_filter skips a pod without
        labels = host.labels
        for volume in claims.volumes:
            if volume.missing:
                return VOLUME_MISSING
            terms = volume.affinity
            if terms is not None and not any(t.matches_labels(labels) for t in terms):
                return VOLUME_NODE
        return None
