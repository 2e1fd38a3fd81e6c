"""Queues count claimed DRA devices (shared/core/claimed.py) on the pure core: what a
claim asks and holds per DeviceClass, a Queue's ``deviceclass/...`` names, the
coordinator's admission, telling, sharing and reclaim with them (shared/core/gangs.py),
the webhook's refusal of a badly named one and how ``tessera get queues`` shows them."""

from __future__ import annotations

from typing import Any

from shared.config import parse as parse_config
from shared.core.claimed import asked, held, name_error
from shared.core.claims import ResourceClaim, Uses, claims_of, pod_uses
from shared.core.gangs import Gangs, Member
from shared.core.queues import GroupSpec, QueueSpec, resource_list, resource_vector
from shared.core.request import ResourceTable
from tests.unit.test_capacity import into, q, tree
from tests.unit.test_gangs import failed_once, gangs, member, sent
from tests.unit.test_webhook import queue_review
from tools.ops import vector

GPU = "gpu.tessera.io"
ONE = {f"deviceclass/{GPU}": 1.0}
GI = 2**30


def exactly(**kw: Any) -> dict[str, Any]:
    return {"deviceClassName": GPU, **kw}


def test_a_claim_asks_its_requests_devices_and_capacity_times_their_count() -> None:
    spec = {
        "requests": [
            {"name": "a", "exactly": exactly(count=2, capacity={"requests": {"memory": "8Gi"}})},
            {"name": "b", "exactly": exactly()},  # count 1 when unset
            {"name": "all", "exactly": exactly(allocationMode="All")},  # one before placement
            {"name": "admin", "exactly": exactly(adminAccess=True)},  # holds nothing
            {
                "name": "either",
                "firstAvailable": [  # the first subrequest, the allocator's first try
                    {"name": "big", "deviceClassName": "mig.tessera.io", "count": 3},
                    {"name": "small", "deviceClassName": GPU},
                ],
            },
        ]
    }
    assert asked(spec) == {
        f"deviceclass/{GPU}": 4.0,
        f"memory.deviceclass/{GPU}": 16.0 * GI,
        "deviceclass/mig.tessera.io": 3.0,
    }


def test_an_allocated_claim_holds_one_device_per_result_and_what_it_consumes() -> None:
    spec = {
        "requests": [
            {"name": "share", "exactly": exactly(capacity={"requests": {"cores": "30"}})},
            {"name": "all", "exactly": exactly(allocationMode="All")},
            {"name": "admin", "exactly": exactly(adminAccess=True)},
            {
                "name": "either",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": "mig.tessera.io"},
                    {"name": "small", "deviceClassName": GPU},
                ],
            },
        ]
    }
    result = {"driver": "gpu.tessera.io", "pool": "n"}
    allocation = {
        "devices": {
            "results": [
                {  # rounded up by the request policy: what the device gives away
                    **result,
                    "request": "share",
                    "device": "gpu-0",
                    "consumedCapacity": {"cores": "30", "memory": "80Gi"},
                },
                *({**result, "request": "all", "device": f"gpu-{i}"} for i in (1, 2, 3)),
                {**result, "request": "admin", "device": "gpu-4", "adminAccess": True},
                {**result, "request": "either/small", "device": "gpu-5"},
            ]
        }
    }
    assert held(spec, allocation) == {
        f"deviceclass/{GPU}": 5.0,
        f"cores.deviceclass/{GPU}": 30.0,
        f"memory.deviceclass/{GPU}": 80.0 * GI,
    }


def test_the_watchers_verdict_counts_each_claim_asked_or_held() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod"},
        "spec": {
            "resourceClaims": [
                {"name": "mine", "resourceClaimName": "mine"},
                {"name": "theirs", "resourceClaimName": "theirs"},
            ]
        },
    }
    uses = pod_uses(pod)
    assert isinstance(uses, Uses)
    spec = {"requests": [{"name": "gpu", "exactly": exactly(count=2)}]}
    allocation = {"devices": {"results": [{"request": "gpu", "device": "gpu-0"}]}}
    records = {  # one to allocate, one another scheduler allocated (one device of two)
        ("claim", "ns/mine"): ResourceClaim(uid="c1", devices=spec),
        ("claim", "ns/theirs"): ResourceClaim(
            uid="c2", devices=spec, allocated=True, allocation=allocation
        ),
    }
    verdict, _ = claims_of(uses, records.get)
    assert verdict.counts == {"c1": {f"deviceclass/{GPU}": 2.0}, "c2": ONE}


def test_queue_lists_keep_claimed_names_and_give_them_back_as_written() -> None:
    table = ResourceTable.build(parse_config({}).devices)
    written = {
        f"deviceclass/{GPU}": "2",
        f"memory.deviceclass/{GPU}": "16Gi",
        "nvidia.com/gpu": "1",
        "deviceclass/": "3",  # names no class: refused by the webhook, ignored here
    }
    found = resource_vector(table, written)
    assert found == {
        f"deviceclass/{GPU}": 2.0,
        f"memory.deviceclass/{GPU}": 16.0 * GI,
        "nvidia.count": 1.0,
    }
    assert resource_list(table, found) == {
        f"deviceclass/{GPU}": 2.0,
        f"memory.deviceclass/{GPU}": 16.0 * GI,
        "nvidia.com/gpu": 1.0,
    }
    assert name_error("deviceclass/") is not None
    assert name_error(f".deviceclass/{GPU}") is not None
    assert name_error("memory.deviceclass/") is not None
    assert name_error("nvidia.com/gpu") is None


def claiming(queue: str, claims: dict[str, dict[str, float]], g: Gangs) -> Member:
    m = member(f"{queue}-{len(g.groups)}", limits={})
    m.claims = claims
    g.groups[m.key] = GroupSpec(queue=queue)
    return m


def held_by(g: Gangs, m: Member) -> None:
    """``m`` placed and bound, holding its claims and no device-plugin card."""
    g.pending(m)
    g.decided(m.pod.uid, {})
    g.bound_now(m.pod.uid)


def test_a_queue_capability_in_claimed_devices_holds_the_second_pod_and_says_why() -> None:
    for g in (gangs(), tree(8, q("small"))):
        g.queues["small"] = QueueSpec(name="small", capability=ONE, parent="")
        first, second = claiming("small", {"c1": ONE}, g), claiming("small", {"c2": ONE}, g)
        g.pending(first)
        assert [r.members[0] for r in g.dispatch(0.0).ready] == [first]
        g.decided(first.pod.uid, {}, {"c1": ONE})
        g.bound_now(first.pod.uid)
        assert g.shares()[0]["small"] == ONE  # allocated: one claimed device
        g.pending(second)
        waiting = g.dispatch(1.0)
        assert waiting.ready == ()
        [(told, status)] = waiting.told
        assert told is second
        assert (
            f'queue "small" has no room within its capability (deviceclass/{GPU} 2 > 1)'
            in status.message()
        )
        g.forget(first.pod.uid)  # its claim's device is free: the second goes
        assert [r.members[0] for r in g.dispatch(2.0).ready] == [second]


def test_device_plugin_cards_do_not_count_against_a_claimed_capability() -> None:
    g = gangs()
    g.queues["small"] = QueueSpec(name="small", capability=ONE)
    held_by(g, claiming("small", {"c1": ONE}, g))
    card = member("cards")
    g.groups[card.key] = GroupSpec(queue="small")
    g.pending(card)  # nvidia.com/gpu is another dimension: not held by the claimed cap
    assert sent(g, 1.0) == [(card.key.name, 1)]


def test_a_claim_shared_by_pods_of_one_queue_counts_once_until_the_last_goes() -> None:
    g = gangs()
    g.queues["q"] = QueueSpec(name="q")
    g.queues["other"] = QueueSpec(name="other")
    a, b = claiming("q", {"shared": ONE}, g), claiming("q", {"shared": ONE}, g)
    elsewhere = claiming("other", {"shared": ONE}, g)
    for m in (a, b, elsewhere):
        held_by(g, m)
    assert g.shares()[0]["q"] == ONE  # two pods, one claim
    assert g.shares()[0]["other"] == ONE  # each queue counts it once (as Volcano)
    g.forget(a.pod.uid)
    assert g.shares()[0]["q"] == ONE  # b counts it now
    g.forget(b.pod.uid)
    assert not any(g.shares()[0]["q"].values())


def test_claimed_devices_without_a_total_do_not_hold_a_queue_at_its_share() -> None:
    # proportion: the inventories do not say which class a device is of, so a claimed
    # dimension is not divided by weight: a queue gets what it asks of it while another
    # queue waits, within its capability
    g = gangs()
    g.queues["a"] = QueueSpec(name="a")
    g.queues["b"] = QueueSpec(name="b")
    cards = member("cards")
    g.groups[cards.key] = GroupSpec(queue="b")
    g.pending(cards)
    mine = claiming("a", {"c": {f"deviceclass/{GPU}": 4.0}}, g)
    g.pending(mine)
    assert sorted(sent(g)) == sorted([(cards.key.name, 1), (mine.key.name, 1)])


def test_under_capacity_a_queue_below_its_deserved_reclaims_claimed_devices() -> None:
    # a deserves 1 claimed device and holds 3; b deserves 2 and holds none: b's claiming
    # pod that did not fit is offered a's pods (over its deserved share in that class)
    g = tree(
        0,
        q("a", deserved=ONE),
        q("b", deserved={f"deviceclass/{GPU}": 2.0}),
    )
    hogs = [claiming("a", {f"h{i}": ONE}, g) for i in range(3)]
    for m in hogs:
        held_by(g, m)
    waiting = failed_once(g, claiming("b", {"mine": ONE}, g))
    offered = {p.uid for v in waiting.victims for p in v.pods}
    assert offered
    assert offered <= {m.pod.uid for m in hogs}
    assert all(v.why.startswith('queue "a" is over its fair share') for v in waiting.victims)
    # a card pod of b's asks no claimed device: a's claims are no room for it
    card = into(g, "b", "card")
    assert failed_once(g, card).victims == ()


def test_a_queue_naming_a_claimed_resource_badly_is_refused_naming_the_field() -> None:
    for spec, said in (
        ({"capability": {"deviceclass/": "1"}}, "spec.capability.deviceclass/: names no"),
        (
            {"deserved": {f".deviceclass/{GPU}": "1"}},
            f"spec.deserved..deviceclass/{GPU}: names no capacity",
        ),
    ):
        response = queue_review("new", **spec)
        assert not response["allowed"]
        assert said in response["status"]["message"]
    assert queue_review("new", capability={f"deviceclass/{GPU}": "2"})["allowed"]


def test_tessera_get_queues_shows_claimed_devices_by_class() -> None:
    shown = vector({"nvidia.count": 2, **ONE, f"memory.deviceclass/{GPU}": 8 * GI})
    assert shown == f"nvidia: 2 gpu; {GPU}: 1 claimed, memory 8Gi"


def test_the_usage_memory_keeps_claimed_devices_over_the_roots_capability() -> None:
    # the inventories give no total of a class: the capacity tree's root Queue may
    g = tree(0, q("root", capability={f"deviceclass/{GPU}": 4.0}), q("a"))
    assert g.totals()[f"deviceclass/{GPU}"] == 4.0
    held_by(g, claiming("a", {"c": ONE}, g))
    g.sample_usage(0.0)
    g.sample_usage(600.0)
    assert abs(g.usage.normalized["a"][f"deviceclass/{GPU}"] - 0.25) < 1e-9
    flat = gangs()  # no total: remembered, not normalized
    flat.queues["a"] = QueueSpec(name="a")
    held_by(flat, claiming("a", {"c": ONE}, flat))
    flat.sample_usage(0.0)
    flat.sample_usage(600.0)
    assert flat.usage.usage(600.0)["a"][f"deviceclass/{GPU}"] > 0
    assert f"deviceclass/{GPU}" not in flat.usage.normalized.get("a", {})


def test_a_placed_pod_counts_its_claims_as_allocated() -> None:
    g = gangs()
    g.queues["a"] = QueueSpec(name="a")
    m = claiming("a", {"c": {f"deviceclass/{GPU}": 1.0}}, g)  # asked: no capacity
    g.pending(m)
    g.dispatch(0.0)
    share = {f"deviceclass/{GPU}": 1.0, f"cores.deviceclass/{GPU}": 100.0}
    g.decided(m.pod.uid, {}, {"c": share})  # held: the card's whole default
    assert g.shares()[0]["a"] == share
