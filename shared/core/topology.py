"""NVLink/NVSwitch topology inside a node: how well two cards are linked, and which cards
a request takes under HAMi's ``topology-aware`` policy (docs/compat.md).

A node agent reports, per card, the score of its link to every other card of the node
(``DeviceInfo.links``: the peer's index → score), on HAMi's scale (its
``pkg/device/nvidia/links.go``): the level of the PCIe path the two share, 10 across CPUs
to 60 on one board, plus 100 per NVLink between them (through NVSwitches: the fewer of
the two cards' switch links). :func:`pair_score` makes one; the node agent's NVML reader
and the simulated inventory both call it.

The placement core reads the scores here. :func:`best_set` takes, of the cards that fit
a request, ``count`` cards with the highest sum of pairwise scores; among equal sums, the
set least linked to the candidates it leaves (so a well-linked group stays whole for the
next job); then the earliest in the device policy's order. For one card that is HAMi's
rule, the card whose summed score to the other candidates is lowest. HAMi enumerates
every combination of ``count`` candidates (C(16, 8) = 12870 sets of 28 pairs on a
16-card node, per node, per pod); this search is bounded, see :func:`best_set`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

PCIE_SCORE: dict[int, int] = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
"""NVML's common-ancestor levels of two cards (``NVML_TOPOLOGY_INTERNAL`` 0: one board,
``SINGLE`` 10 and ``MULTIPLE`` 20: behind one or several PCIe switches, ``HOSTBRIDGE`` 30,
``NODE`` 40: one CPU, ``SYSTEM`` 50: across CPUs) → HAMi's score for that path."""
NVLINK_SCORE = 100
"""HAMi's score of each NVLink between two cards (1 to 18 of them)."""
SAME_NUMA = 40
"""The level simulated cards on one NUMA node share (``NVML_TOPOLOGY_NODE``)."""
CROSS_NUMA = 50
"""The level simulated cards on two NUMA nodes share (``NVML_TOPOLOGY_SYSTEM``)."""
MAX_SEEDS = 16
"""Candidates a multi-card search grows a set from (see :func:`best_set`): every card of
an 8- or 16-card node."""


def pair_score(level: int | None, nvlinks: int) -> int:
    """HAMi's score of a card pair: its PCIe path (``level``, NVML's common ancestor;
    None when NVML did not say: 0) plus :data:`NVLINK_SCORE` per NVLink."""
    pcie = PCIE_SCORE.get(level, 0) if level is not None else 0
    return pcie + NVLINK_SCORE * nvlinks


def nvlink_islands(links: Mapping[int, Mapping[int, int]]) -> dict[int, int]:
    """The NVLink island of each card of one node: ``links`` is each card's ``index`` →
    its scores to its peers (``DeviceInfo.links``); a card joins the island of every
    peer it shares at least one NVLink with (both ends reporting one: the lower score,
    as :func:`best_set` reads a pair), transitively. An island is named by its lowest
    card index; a card with no NVLink peer is an island of one. Cards whose links were
    not read (an empty map) get none: nothing says where they are.

    Published as the DRA device attribute ``nvlinkIsland`` (services/node_agent/dra/
    slices.py), which a claim's ``matchAttribute`` constraint pairs cards on."""
    read = {card for card, peers in links.items() if peers}
    parent = {card: card for card in read}

    def root(card: int) -> int:
        while parent[card] != card:
            parent[card] = parent[parent[card]]
            card = parent[card]
        return card

    for card in read:
        for peer, score in links[card].items():
            if peer in read and min(score, links[peer].get(card, 0)) >= NVLINK_SCORE:
                a, b = root(card), root(peer)
                parent[max(a, b)] = min(a, b)
    return {card: root(card) for card in sorted(read)}


def best_set(
    cands: Sequence[T],
    count: int,
    link: Callable[[T, T], int],
    group: Callable[[T], Hashable] | None = None,
) -> list[T] | None:
    """``count`` of ``cands`` (in the device policy's order) with the highest sum of
    pairwise ``link`` scores, the least linked to the candidates left among equals, the
    first found among those; all of one ``group`` (a NUMA node) when given. None when no
    group has ``count`` candidates. The picks come back in the order of ``cands``.

    A pair's score is the lower of what either card reports (a link both ends see).
    Bound: the n x n scores are read once (n(n-1) calls of ``link``); then from each of
    the first :data:`MAX_SEEDS` candidates a set is grown greedily (the candidate best
    linked to the cards taken so far: count x n steps) and improved by at most ``count``
    single swaps (count x n steps each): at most MAX_SEEDS x count x (count + 1) x n
    steps for a multi-card request (about 18 000 for 8 of 16 cards), n for one card,
    whatever C(n, count) is (HAMi tries all 12 870 sets of 8 of 16, 28 pairs each). On
    NVLink islands and NVSwitch boxes, with any cards busy, it finds what the exhaustive
    search finds (tests/unit/test_topology_nvlink.py checks every case of 8 cards); on
    other graphs it is a heuristic.
    """
    n = len(cands)
    keys = [group(c) for c in cands] if group is not None else [None] * n
    if count <= 0 or count > n:
        return None
    w = [[0] * n for _ in range(n)]
    for i in range(n):
        a = cands[i]
        for j in range(i + 1, n):
            b = cands[j]
            w[i][j] = w[j][i] = min(link(a, b), link(b, a))
    row = [sum(r) for r in w]
    sizes: dict[Hashable, int] = {}
    for k in keys:
        sizes[k] = sizes.get(k, 0) + 1
    seeds = [i for i in range(n) if sizes[keys[i]] >= count]
    if count > 1:
        seeds = seeds[:MAX_SEEDS]
    best: list[int] | None = None
    best_key = (0, 0)
    for seed in seeds:
        mine = keys[seed]
        chosen = [seed]
        taken = [False] * n
        taken[seed] = True
        gain = list(w[seed])
        inside = 0
        for _ in range(count - 1):
            pick, most = -1, -1
            for j in range(n):
                if not taken[j] and keys[j] == mine and gain[j] > most:
                    pick, most = j, gain[j]
            taken[pick] = True  # the group has count members: pick is found
            chosen.append(pick)
            inside += most
            wp = w[pick]
            for j in range(n):
                gain[j] += wp[j]
        # gain[j] is now j's link to the set. Single swaps, the best first, each raising
        # (inner, -cut), at most count of them: greedy growth can take a card whose
        # links to the rest are a little weaker (a degraded NVSwitch card, a far PCIe path).
        cut = sum(row[i] for i in chosen) - 2 * inside
        key = (inside, -cut)
        for _ in range(count if count > 1 else 0):  # one card: every card is a seed
            swap: tuple[int, int] | None = None
            for out in chosen:
                wo = w[out]
                for j in range(n):
                    if taken[j] or keys[j] != mine:
                        continue
                    d = gain[j] - wo[j] - gain[out]
                    new = (inside + d, -(cut - row[out] + row[j] - 2 * d))
                    if new > key:
                        swap, key = (out, j), new
            if swap is None:
                break
            out, j = swap
            chosen[chosen.index(out)] = j
            taken[out], taken[j] = False, True
            inside, cut = key[0], -key[1]
            wo, wj = w[out], w[j]
            for m in range(n):
                gain[m] += wj[m] - wo[m]
        if best is None or key > best_key:
            best, best_key = chosen, key
    if best is None:
        return None
    return [cands[i] for i in sorted(best)]
