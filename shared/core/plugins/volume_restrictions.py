"""VolumeRestrictions: every PersistentVolumeClaim the pod names must exist.

kube-scheduler's plugin of this name reads each claim the pod writes out (not the
ephemeral ones) in its PreFilter and refuses the pod on every node when one is missing;
that is what this plugin does (the wait shared/core/claims.py found). Its Filter's
checks (inline GCE PD, EBS, RBD and iSCSI volumes two pods may not share, and
ReadWriteOncePod claims already in use) are not Tessera's: pods with those volumes are
placed as if no other pod used them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.framework import FilterPlugin
from shared.core.plugins.volume_binding import waits
from shared.core.status import Status

if TYPE_CHECKING:
    from shared.core.nodefit import Hosts, Prepared

NAME = "VolumeRestrictions"


class VolumeRestrictions(FilterPlugin):
    """PreFilter only: a claim the pod names and that does not exist rejects every node."""

    name = NAME
    reads = "claims"
    labels_only = True

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """The missing claim's wait, if any; never a per-node check."""
        return waits(hosts, prep, NAME, lambda _claims: False)
