"""FragmentationGuard: binpack's and spread's first nodes re-weighed by FGD's measure.

Binpack's order alone fills the tightest card whatever share it leaves, and spread's
device choice puts a sharing pod on an idle card of the node binpack found for its
tight one. With the guard, a pod that names no node policy and has no soft preferences
takes, of the first ``fragmentationGuard`` nodes that fit in its policy's order (for
binpack drawn from both ends of the index in turn, as FGD draws them), the one whose
expected fragmentation it raises least, the first of equals; its devices there by the
same measure unless it names a device policy. A pod with no devices is placed by FGD
over every node in turn. The window is short: most of its fits are FGD's memo of the
last pod of the same size (shared/core/plugins/fgd.py).

On a cluster of several node kinds (GPU type and card count), one kind fills at most a
quarter of a binpack window: further nodes of a kind already there are passed without
a fit, up to four times the window of them. Both ends of the index are mostly the
commonest kind, and a window of that kind alone cannot prefer the card the typed work
needs least (the openb trace with 33 % of its GPU tasks naming a model: 2.5 points
below FGD's 64 nodes before, level with it now); a passed node costs a step of the
walk, not a fit, yet about 50 of them a pod cost the openb trace's public variants
0-13 % more CPU per placement. On a cluster of one kind nothing is passed. Measured on
the openb trace in bench/RESULTS.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from shared.core.framework import Choice, Chosen, NodePolicyPlugin

if TYPE_CHECKING:
    from shared.core.model import DeviceRequest, PodRequest
    from shared.core.placement import Placer

GUARDED = ("binpack", "spread")
"""The node policies the guard re-weighs."""
KIND_SHARE = 4
"""Where the pools serving a pod hold several node kinds (GPU type and device count),
one kind fills at most 1/KIND_SHARE of a binpack window while others are in reach
(shared/core/plugins/fgd.py ``PASS_SHARE`` bounds the reach)."""


class FragmentationGuard(NodePolicyPlugin):
    """Applies over Binpack and Spread for pods that name no node policy (the window,
    ``Choice.guard``, is 0 for them and while the allocator is behind:
    shared/core/pace.py)."""

    name = "FragmentationGuard"

    def applies(self, choice: Choice) -> bool:
        """A guarded policy, a window, and no soft preference (their scores decide)."""
        if not choice.guard or choice.policy not in GUARDED:
            return False
        return choice.primary is None or (choice.prep is not None and not choice.prep.soft())

    def choose(self, choice: Choice) -> Chosen | None:
        """FGD's choice over the policy's first ``guard`` nodes that fit."""
        placer = choice.placer
        request, prep = choice.request, choice.prep
        if choice.primary is None:
            rotation = placer.rotation(choice.owner, prep)
            return placer.fgd.best(placer, rotation, request, choice.ctx, prep, rotate=True)
        per_kind = 0
        if choice.policy == "binpack":
            nodes = placer.both_ends(request, choice.primary, choice.owner, choice.guard, prep)
            if several_kinds(placer, request, choice.primary):
                per_kind = max(1, choice.guard // KIND_SHARE)
        else:
            nodes = placer.candidates(request, choice.primary, choice.policy, choice.owner, prep)
        ctx = choice.ctx
        if not request.constraints.device_policy:
            ctx = replace(ctx, device_policy="fgd")
        return placer.fgd.best(
            placer, nodes, request, ctx, prep, limit=choice.guard, per_kind=per_kind
        )


def several_kinds(placer: Placer, request: PodRequest, primary: DeviceRequest) -> bool:
    """Whether the pools that serve ``primary`` hold nodes of more than one kind
    (shared/core/ledger.py ``PoolIndex.kinds``): a few entries, counted per pod."""
    pools = placer.ledger.pools
    kinds = 0
    for pool, _ in placer.routes(primary, request):
        index = pools.get(pool)
        if index is not None:
            kinds += len(index.kinds)
    return kinds > 1
