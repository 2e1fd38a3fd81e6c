"""Binpack: the node policy that fills the fullest devices first (HAMi's default).

The device index is walked from the tightest card that fits the pod's first device
request; the first node that fits takes it, or when scores matter (a pod with soft
preferences, a PreferNoSchedule taint somewhere) the best of a window of
``scoreWindow`` nodes, this order weighing ``weight`` among kube-scheduler's scores
(shared/core/placement.py ``Placer.first_fit``).
"""

from __future__ import annotations

from shared.core.placement import WalkOrder


class Binpack(WalkOrder):
    """``binpack``: tightest devices first."""

    name = "Binpack"
    policy = "binpack"
