"""ImageLocality: prefer the nodes that already hold the pod's images, the more so the
larger the images and the more nodes share them (an image on one node of a thousand
counts for a thousandth: the pod should not pile onto the few nodes that pulled it).

kube-scheduler's formula: each of the pod's images the node holds adds its size times
the share of nodes holding it; the sum, clamped between 23 MiB and 1000 MiB per
container, scales to 0-100 (no normalisation over the nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.framework import ScorePlugin

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Prepared

MIB = 1 << 20
LOW = 23 * MIB
"""Below this much image to reuse, a node scores 0 (a small image pulls quickly)."""
HIGH_PER_CONTAINER = 1000 * MIB
"""At this much per container, a node scores 100."""


class ImageLocality(ScorePlugin):
    """Scores each node by the pod's images already on it (weight 1)."""

    name = "ImageLocality"

    def score(self, prep: Prepared, hosts: Sequence[HostNode], policy: str) -> list[float] | None:
        """0 to 100 per node; None for a pod naming no image or while no node lists any."""
        pod, index = prep.pod, prep.hosts
        if not pod.images or not index.images:
            return None
        high = HIGH_PER_CONTAINER * pod.containers
        total = index.known
        out = []
        for h in hosts:
            held = h.spec.images if h.spec is not None else {}
            reused = 0
            for name in pod.images:
                if name in held:
                    size, nodes = index.images[name]
                    reused += int(size * (nodes / total))
            reused = min(max(reused, LOW), high)
            out.append(float(100 * (reused - LOW) // (high - LOW)))
        return out
