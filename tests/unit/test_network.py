"""Network topology for gangs (shared/core/network.py): HyperNodes read and built into a
tree from the three selector kinds and nesting, cycles and self-members told and cut,
domains derived from labels, networkTopology read, and gangs placed inside one domain:
hard and soft, binpack of domains, waiting and unresolvable."""

from __future__ import annotations

from typing import Any

from shared.core import network as nw
from shared.core.model import NodeName
from shared.core.placement import GangMember, Placer
from tests.unit.corekit import gpus, placer, ref, request

CARD = request({"nvidia.com/gpu": 1})


def hypernode(name: str, tier: int, *members: dict[str, Any], tier_name: str = "") -> nw.HyperNode:
    obj = {"metadata": {"name": name}, "spec": {"tier": tier, "members": list(members)}}
    if tier_name:
        obj["spec"]["tierName"] = tier_name
    read, errors = nw.read_hypernode(obj)
    assert not errors, errors
    return read


def node(kind: str, **selector: Any) -> dict[str, Any]:
    return {"type": kind, "selector": selector}


def labels(*names: str, **extra: str) -> dict[NodeName, dict[str, str]]:
    return {NodeName(n): dict(extra) for n in names}


def test_the_three_selectors_and_nesting_build_one_tree() -> None:
    nodes = {
        **labels("a0", "a1", rack="a"),
        **labels("b0", "b1"),
        **labels("c0"),
    }
    fabric = nw.build(
        [
            hypernode("rack-a", 1, node("Node", labelMatch={"matchLabels": {"rack": "a"}})),
            hypernode("rack-b", 1, node("Node", regexMatch={"pattern": "^b"})),
            hypernode("rack-c", 1, node("Node", exactMatch={"name": "c0"})),
            hypernode("spine", 2, node("HyperNode", regexMatch={"pattern": "^rack-[ab]$"})),
            hypernode(
                "top",
                3,
                node("HyperNode", exactMatch={"name": "spine"}),
                node("HyperNode", exactMatch={"name": "rack-c"}),
            ),
        ],
        nodes,
    )
    assert fabric.domains["rack-a"].nodes == {"a0", "a1"}
    assert fabric.domains["rack-b"].nodes == {"b0", "b1"}
    assert fabric.domains["spine"].nodes == {"a0", "a1", "b0", "b1"}
    assert fabric.domains["top"].nodes == set(nodes)
    assert sorted(fabric.tiers) == [1, 2, 3]
    assert fabric.of_node[NodeName("a0")] == ("rack-a", "spine", "top")
    assert not fabric.problems


def test_a_cycle_is_told_and_cut_and_a_self_member_refused() -> None:
    _, errors = nw.read_hypernode(
        {
            "metadata": {"name": "loop"},
            "spec": {"tier": 1, "members": [node("HyperNode", exactMatch={"name": "loop"})]},
        }
    )
    assert [e.field for e in errors] == ["spec.members[0]"]
    assert "names the HyperNode loop itself" in errors[0].message
    fabric = nw.build(
        [
            hypernode(
                "x",
                2,
                node("HyperNode", exactMatch={"name": "y"}),
                node("Node", exactMatch={"name": "n1"}),
            ),
            hypernode(
                "y",
                2,
                node("HyperNode", exactMatch={"name": "x"}),
                node("Node", exactMatch={"name": "n2"}),
            ),
        ],
        labels("n1", "n2"),
    )
    assert set(fabric.problems) == {"x", "y"}
    assert "cycle" in fabric.problems["x"]
    assert fabric.domains["x"].nodes == {"n1", "n2"}  # what is not on the cycle is kept


def test_members_that_break_rules_are_named() -> None:
    _, errors = nw.read_hypernode(
        {
            "metadata": {"name": "h"},
            "spec": {
                "tier": -1,
                "members": [
                    node("HyperNode", labelMatch={"matchLabels": {"a": "b"}}),
                    node("Node", exactMatch={"name": "x"}, regexMatch={"pattern": "y"}),
                    node("Node", regexMatch={"pattern": "("}),
                ],
            },
        }
    )
    fields = [e.field for e in errors]
    assert fields == [
        "spec.tier",
        "spec.members[0].selector.labelMatch",
        "spec.members[1].selector",
        "spec.members[2].selector.regexMatch.pattern",
    ]


def test_domains_derive_from_labels_top_tier_first() -> None:
    nodes = {NodeName(f"n{i}"): {"x/spine": f"s{i // 4}", "x/rack": f"r{i // 2}"} for i in range(8)}
    nodes[NodeName("lost")] = {"x/spine": "s0"}  # no rack: in no domain of tier 1
    fabric = nw.build(nw.from_labels(["x/spine", "x/rack", "kubernetes.io/hostname"], nodes), nodes)
    assert {d.name for d in fabric.tiers[1]} == {"r0", "r1", "r2", "r3"}
    assert fabric.domains["r1"].nodes == {"n2", "n3"}
    assert fabric.domains["r1"].tier_name == "rack"
    assert fabric.domains["s1"].nodes == {"n4", "n5", "n6", "n7"}
    assert "lost" not in fabric.domains["s0"].nodes


def test_network_topology_is_read_from_the_spec_or_the_annotations() -> None:
    read, errors = nw.read_topology({"mode": "soft", "highestTierAllowed": 2})
    assert read == nw.NetworkTopology(mode="soft", highest_tier=2)
    assert not errors
    read, errors = nw.read_topology({"highestTierAllowed": 1, "highestTierName": "rack"})
    assert errors
    assert "both set" in errors[0].message
    read, errors = nw.read_topology(None, {nw.TIER_ANNOTATION: "2"})
    assert read == nw.NetworkTopology(highest_tier=2)
    assert not errors
    assert nw.read_topology(None, {})[0] is None
    assert nw.read_topology({"mode": "loose"})[1][0].field == "spec.networkTopology.mode"


def racks(count: int, per_rack: int = 2, cards: int = 4) -> tuple[Placer, nw.Fabric]:
    """``count`` racks of ``per_rack`` nodes of ``cards`` cards, under one spine."""
    names = {f"r{r}n{i}": r for r in range(count) for i in range(per_rack)}
    p = placer({n: gpus(cards) for n in names})
    nodes = {NodeName(n): {"spine": "s0", "rack": f"rack-{r}"} for n, r in names.items()}
    return p, nw.build(nw.from_labels(["spine", "rack"], nodes), nodes)


def take(p: Placer, node: str, cards: int) -> None:
    """Use ``cards`` cards of ``node``."""
    p.within = frozenset({NodeName(node)})
    try:
        result = p.place_gang([GangMember(ref(), CARD) for _ in range(cards)], cards)
    finally:
        p.within = None
    assert result.ok, result.message


def members(n: int) -> list[GangMember]:
    return [GangMember(ref(), CARD) for _ in range(n)]


def rack_of(result: Any) -> set[str]:
    return {p.node.split("n")[0] for p in result.placed}


def test_a_hard_gang_goes_to_the_rack_it_fills_best() -> None:
    p, fabric = racks(3)
    take(p, "r0n0", 1)  # rack-0: 7 free, rack-1: 8, rack-2: 5
    take(p, "r2n0", 3)
    hard = nw.NetworkTopology(highest_tier=1)
    result = nw.place_gang(p, fabric, hard, members(6), 6)
    assert result.ok
    assert rack_of(result) == {"r0"}
    result = nw.place_gang(p, fabric, hard, members(8), 8)
    assert result.ok
    assert rack_of(result) == {"r1"}


def test_a_hard_gang_no_rack_holds_waits_saying_what_is_missing() -> None:
    p, fabric = racks(2)
    take(p, "r0n0", 1)
    take(p, "r1n1", 2)
    result = nw.place_gang(p, fabric, nw.NetworkTopology(highest_tier_name="rack"), members(8), 8)
    assert not result.ok
    assert not result.status.unresolvable
    assert result.message == (
        "no tier-1 HyperNode (rack) or below has room for all 8 pods of the gang: "
        "the best, rack-0, fits 7"
    )
    assert len(result.failures) == 8
    assert len(p.ledger.pods) == 3  # nothing of the gang stays reserved
    # the spine allows it
    spine = nw.place_gang(p, fabric, nw.NetworkTopology(highest_tier=2), members(8), 8)
    assert spine.ok
    assert rack_of(spine) == {"r0", "r1"}


def test_a_gang_larger_than_any_domain_is_unresolvable() -> None:
    p, fabric = racks(2)
    result = nw.place_gang(p, fabric, nw.NetworkTopology(highest_tier=1), members(9), 9)
    assert result.status.unresolvable
    assert "more than any tier-1 HyperNode (rack) or below holds" in result.message
    assert "holds 8" in result.message


def test_an_unknown_tier_name_is_told() -> None:
    p, fabric = racks(2)
    result = nw.place_gang(p, fabric, nw.NetworkTopology(highest_tier_name="pod"), members(2), 2)
    assert not result.ok
    assert 'highestTierName "pod" names no HyperNode\'s tierName (known: rack, spine)' in (
        result.message
    )


def test_a_soft_gang_prefers_one_rack_and_else_goes_across() -> None:
    p, fabric = racks(2)
    take(p, "r0n0", 1)  # rack-0: 7 free, rack-1: 8
    soft = nw.NetworkTopology(mode="soft")
    one = nw.place_gang(p, fabric, soft, members(8), 8)
    assert one.ok
    assert rack_of(one) == {"r1"}
    rest = nw.place_gang(p, fabric, soft, members(7), 7)
    assert rest.ok
    assert rack_of(rest) == {"r0"}
    p2, fabric2 = racks(2)
    take(p2, "r0n0", 1)
    take(p2, "r1n0", 1)
    spread = nw.place_gang(
        p2, fabric2, nw.NetworkTopology(mode="soft", highest_tier=1), members(10), 10
    )
    assert spread.ok
    assert rack_of(spread) == {"r0", "r1"}


def test_without_hypernodes_or_topology_a_gang_is_placed_as_before() -> None:
    p, _ = racks(2)
    result = nw.place_gang(p, nw.Fabric(), nw.NetworkTopology(highest_tier=1), members(10), 10)
    assert result.ok
    assert nw.place_gang(p, nw.Fabric(), None, members(2), 2).ok


def test_room_counts_free_cards_per_node() -> None:
    p, _ = racks(1)
    take(p, "r0n0", 3)
    assert nw.room(p, CARD) == {"r0n0": 1, "r0n1": 4}
    assert nw.room(p, CARD, empty=True) == {"r0n0": 4, "r0n1": 4}
    two = request({"nvidia.com/gpu": 2})
    assert nw.room(p, two) == {"r0n0": 0, "r0n1": 2}
