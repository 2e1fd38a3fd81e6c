"""Spread: the node policy that takes the emptiest devices first.

The device index is walked from the card with the most room; otherwise as Binpack
(shared/core/plugins/binpack.py).
"""

from __future__ import annotations

from shared.core.placement import WalkOrder


class Spread(WalkOrder):
    """``spread``: emptiest devices first."""

    name = "Spread"
    policy = "spread"
