"""Allocator shards: which shard owns a node, which shards a gang is offered to, and one
message over every shard's nodes (shared/core/shards.py, shared/core/status.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from shared import config
from shared.core.shards import Shard, Shards
from shared.core.status import Code, Reason, Status, combined

POOLS = Shards(
    [
        Shard("a100", {"pool": "a100"}),
        Shard("h100", {"pool": "h100", "zone": "z1"}),
        Shard("rest", {}),
    ]
)


def test_a_node_belongs_to_the_first_shard_it_matches() -> None:
    assert POOLS.of_node({"pool": "a100", "zone": "z1"}) == "a100"
    assert POOLS.of_node({"pool": "h100", "zone": "z1"}) == "h100"
    assert POOLS.of_node({"pool": "h100", "zone": "z2"}) == "rest"
    assert POOLS.of_node({}) == "rest"
    assert Shards([Shard("a", {"pool": "a"})]).of_node({"pool": "b"}) is None


def test_a_gang_is_offered_to_the_shards_its_selectors_allow() -> None:
    assert POOLS.candidates([{}]) == ("a100", "h100", "rest")
    # pool=a100 implies shard a100: no later shard holds such a node.
    assert POOLS.candidates([{"pool": "a100"}]) == ("a100",)
    # pool=h100 alone: the h100 shard, or "rest" (an h100 node in another zone).
    assert POOLS.candidates([{"pool": "h100"}]) == ("h100", "rest")
    assert POOLS.candidates([{"pool": "h100", "zone": "z1"}]) == ("h100",)
    assert POOLS.candidates([{"pool": "mi300"}]) == ("rest",)
    # Every pod of the gang must be able to run there.
    assert POOLS.candidates([{"pool": "h100"}, {"zone": "z2"}]) == ("rest",)


def test_routes_start_where_the_name_hashes_and_spread_evenly() -> None:
    firsts = Counter(POOLS.route(f"ns/pod-{i}", [{}])[0] for i in range(3000))
    assert set(firsts) == {"a100", "h100", "rest"}
    assert min(firsts.values()) > 900, firsts
    route = POOLS.route("ns/train", [{}])
    assert sorted(route) == ["a100", "h100", "rest"]
    assert route == POOLS.route("ns/train", [{}]), "stable: a retry starts where it did"
    # Rotated, not reordered: the order after the first is the configured one.
    names = list(POOLS.names)
    i = names.index(route[0])
    assert list(route) == names[i:] + names[:i]
    assert Shards().route("ns/x", [{}]) == ()


def test_one_message_over_every_shard_counts_all_their_nodes() -> None:
    a = Status(
        code=Code.UNSCHEDULABLE,
        nodes=3,
        reasons=(
            Reason(kind="insufficient", resource="cpu", nodes=2, free=500, capacity=8000),
            Reason(kind="taint", code=Code.UNRESOLVABLE, nodes=1),
        ),
    )
    b = Status(
        code=Code.UNRESOLVABLE,
        nodes=4,
        reasons=(
            Reason(kind="insufficient", resource="cpu", nodes=1, free=900, capacity=4000),
            Reason(kind="node-affinity", code=Code.UNRESOLVABLE, nodes=3),
        ),
        note="Preempting 1 pod(s) to make room on n1.",
    )
    both = combined([a, b])
    assert both.message() == (
        "0/7 nodes are available: 1 node(s) had untolerated taint(s), 3 Insufficient cpu, "
        "3 node(s) didn't match Pod's node affinity/selector. "
        "Preempting 1 pod(s) to make room on n1."
    )
    [cpu] = [r for r in both.reasons if r.kind == "insufficient"]
    assert (cpu.free, cpu.capacity) == (900, 8000)  # what the best node offers
    assert both.code == Code.UNSCHEDULABLE  # one shard's nodes may yet free up
    assert combined([b, b]).code == Code.UNRESOLVABLE
    assert combined([a]) is a


def test_the_config_names_each_shard_once_and_at_most_eight() -> None:
    cfg = config.parse(
        {"scheduler": {"shards": [{"name": "a", "nodeSelector": {"pool": "a"}}, {"name": "b"}]}}
    )
    assert cfg.scheduler.shard_pools().of_node({"pool": "a"}) == "a"
    assert cfg.scheduler.shard_pools().of_node({"pool": "x"}) == "b"
    with pytest.raises(config.ConfigError, match=r"shards\[1\].name` 'a' is listed twice"):
        config.parse({"scheduler": {"shards": [{"name": "a"}, {"name": "a"}]}})
    with pytest.raises(config.ConfigError, match="at most 8"):
        config.parse({"scheduler": {"shards": [{"name": f"s{i}"} for i in range(9)]}})
    with pytest.raises(config.ConfigError, match="shards"):
        config.parse({"scheduler": {"shards": [{"name": "Pool_A"}]}})


def test_an_allocator_names_its_shard_or_refuses_to_start() -> None:
    import argparse

    from services.device_allocator.service import shard_of

    sharded = config.parse({"scheduler": {"shards": [{"name": "a"}, {"name": "b"}]}})
    assert shard_of(sharded, argparse.Namespace(shard="b")) == ("b", 1)
    with pytest.raises(config.ConfigError, match="run one allocator per shard with --shard"):
        shard_of(sharded, argparse.Namespace(shard=None))
    with pytest.raises(config.ConfigError, match=r"'c' is not in `\$.scheduler.shards` \(a, b\)"):
        shard_of(sharded, argparse.Namespace(shard="c"))
    with pytest.raises(config.ConfigError, match="an unsharded cluster has one allocator"):
        shard_of(config.Config(), argparse.Namespace(shard="a"))
    assert shard_of(config.Config(), None) == ("", -1)
