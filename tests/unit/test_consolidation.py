"""The consolidation planner (shared/core/consolidation.py): which shared-GPU pods move
where so that a gang fits, on the pure core's ledger; and which bound pods may move."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from shared.core import consolidation
from shared.core.consolidation import Consolidation, fractional, movable, plan, spot_ref
from shared.core.ledger import PodGrant
from shared.core.model import (
    ContainerGrant,
    GangKey,
    Movable,
    NodeName,
    PodRef,
    PodRequest,
    VictimUnit,
)
from shared.core.placement import GangMember, Placer
from shared.core.preemption import Protection
from shared.core.queues import Resources
from shared.core.room import Room, Unplaced
from shared.core.status import Code, Reason, Status
from tests.unit.corekit import gpus, placer, ref, request

WHOLE = {"nvidia.com/gpu": 1}
MIB = 81920
NOW = 1_000_000.0
NO_ROOM = Status(
    code=Code.UNSCHEDULABLE, nodes=1, reasons=(Reason(kind="insufficient", resource="x"),)
)


def share(pct: int) -> PodRequest:
    return request({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": pct})


def hold(pl: Placer, node: str, pct: int, card: int = 0, name: str | None = None) -> Movable:
    """A bound pod holding ``pct`` % of card ``card`` of ``node``, offered as movable."""
    pod = ref(name)
    dev = pl.ledger.nodes[NodeName(node)].devices[card]
    got = dev.grant(memory_mib=MIB * pct // 100, cores=0)
    grant = PodGrant(
        pod=pod, node=NodeName(node), containers=(ContainerGrant(container="main", devices=(got,)),)
    )
    assert pl.ledger.grant(grant)
    return Movable(pod=pod, request=share(pct), owner="ReplicaSet/web")


def whole(n: int = 1) -> list[GangMember]:
    return [GangMember(pod=ref(), request=request(WHOLE)) for _ in range(n)]


def test_two_fractional_pods_make_room_for_a_whole_card_with_one_move() -> None:
    pl = placer({"n0": gpus(1), "n1": gpus(1)})
    a, b = hold(pl, "n0", 40), hold(pl, "n1", 40)
    before = pl.ledger.snapshot()
    found = plan(pl, whole(), 1, (a, b), max_moves=4, allowed={})
    assert isinstance(found, Consolidation)
    assert pl.ledger.snapshot() == before  # nothing changed: a plan only
    assert len(found.moves) == 1
    move = found.moves[0]
    assert move.spot.node != move.origin
    assert move.spot.pod == spot_ref(move.pod.pod)
    assert found.placements[0].node == move.origin  # the gang goes where the pod left
    assert found.fragmentation <= 0.0  # FGD: the cluster ends no more fragmented


def test_nothing_moves_when_a_moved_pod_would_have_nowhere_to_go() -> None:
    pl = placer({"n0": gpus(1), "n1": gpus(1)})
    a, b = hold(pl, "n0", 60), hold(pl, "n1", 60)
    found = plan(pl, whole(), 1, (a, b), max_moves=4, allowed={})
    assert isinstance(found, str)
    assert "would have nowhere to go" in found


def test_a_gang_that_cannot_fit_even_after_the_moves_moves_nothing() -> None:
    pl = placer({"n0": gpus(1), "n1": gpus(1)})
    a, b = hold(pl, "n0", 20), hold(pl, "n1", 20)
    hold(pl, "n0", 20)  # not movable: n0's card stays shared
    hold(pl, "n1", 20)
    found = plan(pl, whole(), 1, (a, b), max_moves=4, allowed={})
    assert found == "Consolidation: moving up to 4 shared-GPU pod(s) would not make room."


def test_max_moves_bounds_the_moves_and_zero_turns_it_off() -> None:
    pl = placer({"n0": gpus(1), "n1": gpus(1)})
    pods = [hold(pl, "n0", 10) for _ in range(3)]
    hold(pl, "n1", 50)
    assert isinstance(plan(pl, whole(), 1, pods, max_moves=2, allowed={}), str)
    three = plan(pl, whole(), 1, pods, max_moves=3, allowed={})
    assert isinstance(three, Consolidation)
    assert len(three.moves) == 3
    assert plan(pl, whole(), 1, pods, max_moves=0, allowed={}) is None
    assert plan(pl, whole(), 1, (), max_moves=3, allowed={}) is None


def test_a_move_that_would_break_a_disruption_budget_is_refused() -> None:
    pl = placer({"n0": gpus(1), "n1": gpus(1)})
    a = hold(pl, "n0", 40)
    b = hold(pl, "n1", 40)
    covered = [
        Movable(pod=m.pod, request=m.request, owner=m.owner, budgets=("ns/web",)) for m in (a, b)
    ]
    found = plan(pl, whole(), 1, covered, max_moves=4, allowed={"ns/web": 0})
    assert found == "Consolidation: moving would violate PodDisruptionBudget ns/web."
    assert isinstance(
        plan(pl, whole(), 1, covered, max_moves=4, allowed={"ns/web": 1}), Consolidation
    )


def test_fewest_moves_win_and_the_search_tries_a_bounded_number_of_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = {f"n{i:02}": gpus(1) for i in range(40)}
    pl = placer(nodes)
    offered = []
    for i in range(40):  # every card holds one pod of 30 %, and n00 two of 15 %
        if i == 0:
            offered += [hold(pl, "n00", 15), hold(pl, "n00", 15)]
        else:
            offered.append(hold(pl, f"n{i:02}", 30))
    trials = []
    real = pl.place_gang

    def counted(*args: object, **kw: object) -> object:
        trials.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pl, "place_gang", counted)
    found = plan(pl, whole(), 1, offered, max_moves=4, allowed={})
    assert isinstance(found, Consolidation)
    assert len(found.moves) == 1
    # at most a few trial placements per seed node, never one per combination
    assert len(trials) <= consolidation.MAX_SEEDS * 12


@dataclass
class Bound:
    """A bound pod as the coordinator's member reads (preemption's Candidate and more)."""

    pod: PodRef
    request: PodRequest
    owner: str = "ReplicaSet/web"
    preemptable: bool = True
    priority: int = 0
    created_at: float = 0.0
    queue: str = "default"
    started: float | None = None
    cooldown_s: float = 0.0
    vector: Resources = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    preemption_policy: str = ""


def test_only_lone_controller_owned_shared_pods_past_their_minimum_runtime_move() -> None:
    me = GangKey.of(ref(), None)
    pods = {
        "ok": Bound(ref("ok"), share(30), created_at=2.0),
        "big": Bound(ref("big"), share(60), created_at=9.0, vector={"nvidia.memory": 49152.0}),
        "bare": Bound(ref("bare"), share(30), owner=""),
        "unmarked": Bound(ref("unmarked"), share(30), preemptable=False),
        "victim": Bound(ref("victim"), share(30), preemptable=False, created_at=3.0),
        "whole": Bound(ref("whole"), request(WHOLE)),
        "young": Bound(ref("young"), share(30), started=90.0, cooldown_s=60.0),
    }
    bound = {GangKey.of(p.pod, None): {p.pod.uid: p} for p in pods.values()}
    bound[GangKey(namespace="ns", name="pg")] = {
        u.pod.uid: u for u in [Bound(ref("member"), share(30))]
    }
    offered = (VictimUnit(pods=(pods["victim"].pod,)),)
    protection = Protection(now=100.0)
    got = movable(me, "default", bound, offered, protection, {}, None, {})
    # the least memory first (the others hold none in their vector here), then the newest
    assert [m.pod.name for m in got] == ["victim", "ok", "big"]
    assert got[0].owner == "ReplicaSet/web"
    assert math.isclose(protection.soonest, 50.0)


def test_fractional_means_one_card_shared() -> None:
    assert fractional(share(50))
    assert fractional(request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}))
    assert not fractional(request(WHOLE))
    assert not fractional(request({"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 50}))
    assert not fractional(request({}))


def test_the_room_reserves_each_moved_pods_place_before_eviction_and_frees_it_unused() -> None:
    pl = placer({"n0": gpus(1), "n1": gpus(1)})
    a, b = hold(pl, "n0", 40), hold(pl, "n1", 40)
    room = Room(pl, max_moves=4, reserve_s=60.0)
    top = ref()
    gang = Unplaced(key=GangKey.of(top, None), members=whole(1), min_member=1, movable=(a, b))
    made = room.make_room(gang, NO_ROOM, now=NOW)
    assert made.preempting is not None
    moved = made.preempting.pods[0]
    dest = made.preempting.moves[moved]
    assert made.note.startswith("Moving 1 pod(s) to make room on ")
    spot = next(iter(room.spots.values()))
    assert pl.ledger.pods[spot.grant.pod.uid].node == dest  # held before anything leaves
    assert room.waiting(gang.key, NOW) == "waiting for 1 preempted pod(s) to exit"
    # the recreated pod of another controller, or of another shape, does not take it
    new = ref()
    assert room.take_spot(new, "ReplicaSet/other", share(40), None) is None
    assert room.take_spot(new, "ReplicaSet/web", share(30), None) is None
    taken = room.take_spot(new, "ReplicaSet/web", share(40), None)
    assert taken is not None
    assert taken.node == dest
    assert pl.ledger.pods[new.uid].node == dest
    assert spot.grant.pod.uid not in pl.ledger.pods
    # a second move's place lapses unused: its devices are free again
    c = hold(pl, "n1", 10)
    again = Unplaced(key=GangKey.of(ref(), None), members=whole(1), min_member=1, movable=(c,))
    room2 = Room(pl, max_moves=4, reserve_s=60.0)
    room2.consolidate(again, NOW)
    held = set(room2.spots)
    ended = room2.lapsed(NOW + 61.0)
    assert {g.pod.uid for g in ended.spots} == held
    assert not held & set(pl.ledger.pods)


def test_consolidation_is_tried_before_preemption_and_a_refusal_is_told() -> None:
    pl = placer({"n0": gpus(1), "n1": gpus(1)})
    a, b = hold(pl, "n0", 60), hold(pl, "n1", 60)
    room = Room(pl, max_moves=4)
    top = ref()
    gang = Unplaced(key=GangKey.of(top, None), members=whole(1), min_member=1, movable=(a, b))
    made = room.make_room(gang, NO_ROOM, now=NOW)
    assert made.preempting is None
    assert "would have nowhere to go" in made.note
    assert not room.spots
    with_victims = Unplaced(
        key=gang.key,
        members=gang.members,
        min_member=1,
        movable=(a, b),
        victims=(VictimUnit(pods=(a.pod,), why="priority 0 < 9"),),
    )
    made = room.make_room(with_victims, NO_ROOM, now=NOW)
    assert made.preempting is not None
    assert not made.preempting.moves  # preemption, after consolidation found no move


def test_the_watcher_reads_a_pods_controller_and_preemptable_mark() -> None:
    from services.watcher.translate import controller, pending_event

    owned = {
        "ownerReferences": [
            {"kind": "Node", "name": "n0"},
            {"kind": "ReplicaSet", "name": "web-7c9", "controller": True},
        ]
    }
    assert controller(owned) == "ReplicaSet/web-7c9"
    assert controller({"ownerReferences": [{"kind": "ReplicaSet", "name": "x"}]}) == ""
    assert controller({}) == ""
    obj = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "labels": {"volcano.sh/preemptable": "true"},
            **owned,
        },
        "spec": {"schedulerName": "tessera"},
    }
    event = pending_event(obj, ref("p"), share(30), None)  # type: ignore[arg-type]
    assert (event.owner, event.preemptable) == ("ReplicaSet/web-7c9", True)
    obj["metadata"]["labels"] = {}
    obj["metadata"]["annotations"] = {"volcano.sh/preemptable": "false"}
    assert not pending_event(obj, ref("p"), share(30), None).preemptable  # type: ignore[arg-type]


def test_the_coordinator_offers_movable_pods_to_a_failed_gang_only_when_enabled() -> None:
    from tests.unit.test_gangs import bind, failed_once, gangs, member

    for enabled in (False, True):
        g = gangs(consolidation=enabled)
        moving = member(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 30})
        moving.owner, moving.preemptable = "ReplicaSet/web", True
        bare = member(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 30})
        bare.preemptable = True
        for m in (moving, bare):
            bind(g, m)
        first = member()
        g.pending(first)
        assert g.dispatch(0.0).ready[0].movable == ()  # plain placement first
        g.failed([first.pod.uid], 1, unresolvable=False, now=0.0)
        again = g.dispatch(1000.0).ready[0]
        want = (moving.pod,) if enabled else ()
        assert tuple(m.pod for m in again.movable) == want
        assert failed_once(g, member()).movable == again.movable
