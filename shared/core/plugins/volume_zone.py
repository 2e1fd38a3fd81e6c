"""VolumeZone: a node with zone or region labels must be in each zone of the pod's
bound volumes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin
from shared.core.hosts import GA_LABELS, ZONE_LABELS
from shared.core.plugins.volume_binding import waits
from shared.core.status import UNRESOLVABLE, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "VolumeZone"
VOLUME_ZONE = fail(Reason(kind="volume-zone", code=UNRESOLVABLE, plugin=NAME))


class VolumeZone(FilterPlugin):
    """Refuses a zoned node outside a volume's zone (beta and GA labels alike)."""

    name = NAME
    reads = "claims"
    labels_only = True

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """A bound claim's PersistentVolume that does not exist rejects every node;
        only a pod whose volumes carry zones has anything more to check."""
        return waits(hosts, prep, NAME, lambda claims: claims.zones)

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """Each volume zone label against the node's, on a node with any zone label."""
        claims = prep.pod.claims
        assert claims is not None  # pre_filter skips a pod without
        labels = host.labels
        if not any(k in labels for k in ZONE_LABELS):
            return None
        for zone in claims.zones:
            value = labels.get(zone.key)
            if value is None:
                value = labels.get(GA_LABELS.get(zone.key, zone.key))
            if value is None or value not in zone.values:
                return VOLUME_ZONE
        return None
