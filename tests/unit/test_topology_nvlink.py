"""NVLink/NVSwitch topology inside a node (HAMi's ``topology-aware``): the pair scores,
the bounded search for the best-linked set, the one-card rule, the NVML reading through
the fake NVML layer, the simulated inventory's links, and old inventories decoding."""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.node_agent.nvml import NvmlSource, read_links
from services.node_agent.simulate import Inventory, expand
from shared import events as ev
from shared.config import Config
from shared.core.model import DeviceInfo
from shared.core.placement import Placement, PlacementConfig, Placer
from shared.core.topology import MAX_SEEDS, best_set, nvlink_islands, pair_score
from tests.unit.corekit import gpus, place, placer, ref, request
from tests.unit.fake_nvml import DATA, FakeNvml

TOPOLOGY = {"hami.io/gpu-scheduler-policy": "topology-aware"}
WHOLE = {"nvidia.com/gpu": 1}
"""A count alone: a whole card."""


def sim(count: int, islands: int, links: int = 4, numa: int = 2) -> list[DeviceInfo]:
    """A simulated node's cards (services/node_agent/simulate.py's ``nvlink``)."""
    group = {
        "vendor": "nvidia",
        "model": "NVIDIA-A100-SXM4-80GB",
        "memory": 81920,
        "count": count,
        "numa": numa,
        "nvlink": {"islands": islands, "links": links},
    }
    inventory = msgspec.convert({"nodes": [{"name": "n", "devices": [group]}]}, Inventory)
    return list(expand(inventory)["n"][1])


def link_of(devices: Sequence[DeviceInfo]) -> Callable[[int, int], int]:
    return lambda a, b: devices[a].links.get(devices[b].index, 0)


def indexes(p: Placement) -> list[int]:
    return sorted(g.index for c in p.grants for g in c.devices)


def busy(pl: Placer, *cards: int) -> None:
    for i in cards:
        place(pl, WHOLE, annotations={"volcano.sh/gpu-index": str(i)})


# --- the pair score (HAMi's table) -------------------------------------------------------


def test_a_pair_scores_its_pcie_path_plus_100_per_nvlink() -> None:
    assert pair_score(None, 0) == 0  # NVML said nothing
    assert pair_score(50, 0) == 10  # across CPUs
    assert pair_score(40, 0) == 20  # one CPU
    assert pair_score(10, 0) == 50  # one PCIe switch
    assert pair_score(0, 0) == 60  # one board
    assert pair_score(40, 4) == 420
    assert pair_score(10, 18) == 1850


def test_simulated_islands_link_within_each_island_and_pcie_across() -> None:
    devices = sim(8, islands=2)
    assert devices[0].links == {1: 420, 2: 420, 3: 420, 4: 10, 5: 10, 6: 10, 7: 10}
    assert devices[5].links[4] == 420
    assert devices[5].links[3] == 10
    box = sim(8, islands=1, links=18, numa=1)  # an NVSwitch box
    assert {s for d in box for s in d.links.values()} == {1820}
    plain = expand(
        msgspec.convert(
            {"nodes": [{"name": "p", "devices": [{"model": "m", "memory": 1, "count": 2}]}]},
            Inventory,
        )
    )
    assert all(not d.links for d in plain["p"][1])  # no nvlink: no links reported


def test_nvlink_islands_join_linked_cards_transitively_named_by_their_lowest_index() -> None:
    assert nvlink_islands({d.index: d.links for d in sim(8, islands=2)}) == {
        0: 0,
        1: 0,
        2: 0,
        3: 0,
        4: 4,
        5: 4,
        6: 4,
        7: 4,
    }
    assert set(
        nvlink_islands({d.index: d.links for d in sim(8, islands=1, links=18)}).values()
    ) == {0}
    # a chain 3 - 1 - 2 is one island; 0 has PCIe only (an island of one); 4 was not read
    chain = {
        0: {1: 20, 2: 20, 3: 20},
        1: {0: 20, 2: 120, 3: 220},
        2: {0: 20, 1: 120, 3: 20},
        3: {0: 20, 1: 220, 2: 20},
        4: {},
    }
    assert nvlink_islands(chain) == {0: 0, 1: 1, 2: 1, 3: 1}
    # a link only one end reports is no link (the pair's lower score)
    assert nvlink_islands({0: {1: 120}, 1: {0: 20}}) == {0: 0, 1: 1}


# --- the search ----------------------------------------------------------------------------


def brute(n: int, count: int, w: Callable[[int, int], int]) -> tuple[int, int]:
    """The exhaustive search's best (inner score, -cut) over every ``count`` of ``n``."""
    best = None
    for combo in itertools.combinations(range(n), count):
        inner = sum(w(a, b) for a, b in itertools.combinations(combo, 2))
        cut = sum(w(a, b) for a in combo for b in range(n) if b not in combo)
        best = max(best or (inner, -cut), (inner, -cut))
    assert best is not None
    return best


def judged(chosen: Sequence[int], cands: Sequence[int], w: Callable[[int, int], int]) -> Any:
    inner = sum(w(a, b) for a, b in itertools.combinations(chosen, 2))
    cut = sum(w(a, b) for a in chosen for b in cands if b not in chosen)
    return inner, -cut


def nvml_devices(name: str) -> tuple[DeviceInfo, ...]:
    source = NvmlSource(Config(), FakeNvml.load(name))
    try:
        return source.read()
    finally:
        source.close()


@pytest.mark.parametrize(
    "devices",
    [lambda: sim(8, islands=2), lambda: nvml_devices("nvml-h100-x8-nvswitch.json")],
    ids=["two-islands", "nvswitch"],
)
def test_the_bounded_search_equals_the_exhaustive_one_on_islands_and_nvswitch(
    devices: Callable[[], Sequence[DeviceInfo]],
) -> None:
    """Every set of busy cards, every count: the same best score and the same least cut
    as trying every combination (HAMi's search)."""
    w = link_of(devices())
    for free_mask in range(1, 256):
        free = [i for i in range(8) if free_mask >> i & 1]
        for count in range(1, len(free) + 1):
            chosen = best_set(free, count, w)
            assert chosen is not None
            local = [[w(free[a], free[b]) for b in range(len(free))] for a in range(len(free))]
            want = brute(len(free), count, lambda a, b: local[a][b])  # noqa: B023
            assert judged(chosen, free, w) == want, (free, count, chosen)


def test_four_cards_on_two_islands_are_one_island() -> None:
    w = link_of(sim(8, islands=2))
    assert best_set(list(range(8)), 4, w) == [0, 1, 2, 3]  # the first of equals
    # One card of the first island busy: the second island whole.
    assert best_set([0, 1, 2, 4, 5, 6, 7], 4, w) == [4, 5, 6, 7]
    # Two cards: from the island they split least (the first is already broken).
    assert best_set([0, 1, 4, 5, 6, 7], 2, w) == [0, 1]


def test_on_an_nvswitch_box_a_degraded_card_and_a_far_pcie_path_score_lower() -> None:
    w = link_of(nvml_devices("nvml-h100-x8-nvswitch.json"))
    # Two cards: a pair behind one PCIe switch (1800 + 50) beats one CPU's (1800 + 20).
    assert best_set(list(range(8)), 2, w) == [0, 1]
    # Four of 4-7 with card 7 down to 12 links: 4, 5, 6 and the best of the rest.
    chosen = best_set([1, 4, 5, 6, 7], 4, w)
    assert chosen == [1, 4, 5, 6]  # 7's 12 links lose to 1's 18 across the CPUs


def test_a_group_keeps_the_set_on_one_numa_node_or_none() -> None:
    w = link_of(sim(8, islands=1, links=18))
    numa = {0: 0, 1: 0, 2: 1, 3: 1, 4: 1}.__getitem__
    assert best_set([0, 1, 2, 3, 4], 3, w, numa) == [2, 3, 4]
    assert best_set([0, 1, 2, 3], 3, w, numa) is None


def test_the_search_is_bounded_on_8_and_16_card_nodes() -> None:
    calls = 0

    def counted(devices: Sequence[DeviceInfo]) -> Callable[[int, int], int]:
        def w(a: int, b: int) -> int:
            nonlocal calls
            calls += 1
            return devices[a].links.get(b, 0)

        return w

    for count_cards in (8, 16):
        w = counted(sim(count_cards, islands=count_cards // 4))

        for count in range(1, count_cards + 1):
            calls = 0
            started = time.perf_counter()
            chosen = best_set(list(range(count_cards)), count, w)
            took = time.perf_counter() - started
            assert chosen is not None
            assert len(chosen) == count
            # Each pair's score read twice (both ends), once: no combination is enumerated.
            assert calls == count_cards * (count_cards - 1)
            assert took < 0.5, (count_cards, count, took)  # about 0.3 ms; loose: a busy CI
    w16 = link_of(sim(16, islands=4))
    assert best_set(list(range(16)), 8, w16) == list(range(8))  # two islands of one CPU
    assert best_set(list(range(16)), 4, w16) == [0, 1, 2, 3]
    assert MAX_SEEDS >= 16  # every card of a 16-card node seeds a set


# --- placement: the annotation, the config default, without either ---------------------------


def test_a_four_card_pod_takes_one_island_of_a_node_with_two() -> None:
    pl = placer({"n": sim(8, islands=2)})
    busy(pl, 1)
    assert indexes(place(pl, {"nvidia.com/gpu": 4}, annotations=TOPOLOGY)) == [4, 5, 6, 7]


def test_a_one_card_pod_avoids_splitting_a_well_linked_group() -> None:
    pl = placer({"n": sim(8, islands=2)})
    busy(pl, 0, 1, 2)
    # Card 3 is the rest of a broken island; taking 4 would break the whole one.
    assert indexes(place(pl, WHOLE, annotations=TOPOLOGY)) == [3]
    pl = placer({"n": sim(8, islands=2)})
    busy(pl, 4, 5)
    # A slice: of the cards it fits, one of the broken island's pair (6 or 7 split 450
    # from the free cards, 0 to 3 split 1290 each).
    shared = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}
    assert indexes(place(pl, shared, annotations=TOPOLOGY)) in ([6], [7])


def test_the_config_default_applies_to_pods_that_name_no_policy_only() -> None:
    config = PlacementConfig(topology_aware=True)
    pl = Placer(placer({"n": sim(8, islands=2)}).ledger, config)
    busy(pl, 1)
    assert indexes(place(pl, {"nvidia.com/gpu": 4})) == [4, 5, 6, 7]
    pl = Placer(placer({"n": sim(8, islands=2)}).ledger, config)
    busy(pl, 1)
    # binpack named: the pod's own policy, the default's topology-aware not added.
    named = {"hami.io/gpu-scheduler-policy": "binpack"}
    assert indexes(place(pl, {"nvidia.com/gpu": 4}, annotations=named)) == [0, 2, 3, 4]
    pl = Placer(placer({"n": sim(8, islands=2)}).ledger, config)
    busy(pl, 1)
    both = {"hami.io/gpu-scheduler-policy": "binpack,topology-aware"}
    assert indexes(place(pl, {"nvidia.com/gpu": 4}, annotations=both)) == [4, 5, 6, 7]


def test_links_change_nothing_without_the_policy() -> None:
    """Without topology-aware, a node whose cards report links places as one without."""
    for limits in ({"nvidia.com/gpu": 4}, WHOLE, {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 9}):
        for policy in ({}, {"hami.io/gpu-scheduler-policy": "binpack"}):
            linked, plain = placer({"n": sim(8, islands=2)}), placer({"n": gpus(8)})
            for pl in (linked, plain):
                busy(pl, 1, 6)
            assert indexes(place(linked, limits, annotations=policy)) == indexes(
                place(plain, limits, annotations=policy)
            )


def test_a_node_with_no_links_places_topology_aware_pods_by_the_device_policy() -> None:
    pl = placer({"n": gpus(4)})
    busy(pl, 0)
    p = pl.place(ref(), request({"nvidia.com/gpu": 2}, annotations=TOPOLOGY), None)
    assert isinstance(p, Placement)
    assert len(indexes(p)) == 2


# --- the NVML reading (the fake NVML layer) -------------------------------------------------


def test_nvml_two_islands_read_as_nvlinks_within_and_pcie_across() -> None:
    nvml = FakeNvml.load("nvml-a100-x8-two-nvlink-islands.json")
    source = NvmlSource(Config(), nvml)
    devices = source.read()
    assert devices[0].links == {1: 450, 2: 420, 3: 420, 4: 10, 5: 10, 6: 10, 7: 10}
    assert devices[6].links == {0: 10, 1: 10, 2: 10, 3: 10, 4: 420, 5: 420, 7: 450}
    calls = dict(nvml.calls)
    source.read()
    assert nvml.calls == calls  # the topology is read once, not at each health check
    source.close()


def test_nvml_nvswitch_counts_the_fewer_switch_links_of_a_pair() -> None:
    source = NvmlSource(Config(), FakeNvml.load("nvml-h100-x8-nvswitch.json"))
    devices = source.read()
    assert devices[0].links[1] == 1850  # 18 links each, one PCIe switch
    assert devices[0].links[4] == 1810  # across the CPUs
    assert devices[7].links[6] == 1250  # card 7 reaches the switches with 12
    source.close()


def test_nvml_without_topology_reports_no_links() -> None:
    """The recorded A100 host answers NotSupported to every topology call (PCIe cards
    without NVLink and without a common-ancestor answer): no links, no error."""
    source = NvmlSource(Config(), FakeNvml.load("nvml-a100-80gb-x4.json"), sysfs=Path("/nope"))
    assert all(d.links == {} for d in source.read())
    source.close()


def recording(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def test_nvml_asymmetric_links_score_the_pair_zero_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = recording("nvml-a100-x8-two-nvlink-islands.json")
    data["gpus"][0]["nvlink"]["1"] = 2  # GPU 1 still counts 4 back
    nvml = FakeNvml(data)
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    with caplog.at_level(logging.WARNING):
        links = read_links(nvml, handles)
    assert 1 not in links[0]
    assert links[0][2] == 420
    assert "AsymmetricGPUP2PLink" in caplog.text


def test_nvml_without_the_v2_name_uses_pynvml_12s_plain_one() -> None:
    class Plain(FakeNvml):
        nvmlDeviceGetNvLinkRemotePciInfo_v2 = None  # type: ignore[assignment]  # noqa: N815

        def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Any, link: int) -> Any:  # noqa: N802
            return FakeNvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h, link)

    nvml = Plain(recording("nvml-a100-x8-two-nvlink-islands.json"))
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert read_links(nvml, handles)[0][3] == 420


def test_nvml_topology_with_no_nvlink_is_the_pcie_path_only() -> None:
    data = recording("nvml-a100-x8-two-nvlink-islands.json")
    for g in data["gpus"]:
        del g["nvlink"]  # NotSupported: PCIe cards
    nvml = FakeNvml(data)
    links = read_links(nvml, [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)])
    assert links[0] == {1: 50, 2: 20, 3: 20, 4: 10, 5: 10, 6: 10, 7: 10}
    assert nvml.calls["state"] == 8  # one NotSupported per card, then no more links asked


# --- the inventory on the wire ----------------------------------------------------------------


def test_an_inventory_without_links_decodes_and_links_are_omitted_when_empty() -> None:
    old = {
        "type": "node.inventory",
        "node": "n",
        "config_hash": "h",
        "devices": [
            {"uuid": "GPU-1", "index": 0, "vendor": "nvidia", "model": "m", "memory_mib": 1}
        ],
    }
    decoded = ev.decode(json.dumps(old).encode())
    assert isinstance(decoded, ev.NodeInventory)
    assert decoded.devices[0].links == {}
    assert b"links" not in msgspec.json.encode(decoded.devices[0])
    linked = sim(2, islands=1, numa=1)[0]
    again = msgspec.json.decode(msgspec.json.encode(linked), type=DeviceInfo)
    assert again.links == {1: 420}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(
            b'{"uuid":"u","index":0,"vendor":"nvidia","model":"m","memory_mib":1,"links":{"-1":5}}',
            type=DeviceInfo,
        )
