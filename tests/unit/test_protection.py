"""Protection from early eviction (shared/core/preemption.py ``Protection``): KAI's
``preemptMinRuntime`` and ``reclaimMinRuntime`` per queue with the config's defaults,
Volcano's ``volcano.sh/cooldown-time`` per pod, and what the waiting gang is told."""

from __future__ import annotations

from shared.core.gangs import Gangs, Member
from shared.core.hierarchy import TreeQueue, build
from shared.core.plugins.default_preemption import protected_note
from shared.core.preemption import Protection
from shared.core.queues import GroupSpec, QueueSpec
from shared.core.room import Room, Unplaced
from shared.core.status import Code, Reason, Status
from tests.unit.corekit import gpus, placer
from tests.unit.test_gangs import failed_once, gangs, member

NOW = 1000.0


def bound_at(g: Gangs, m: Member, started: float, cooldown_s: float = 0.0) -> None:
    g.pending(m)
    g.decided(m.pod.uid, {"nvidia.count": 1.0})
    g.bound_now(m.pod.uid, started, cooldown_s)


def test_a_pod_within_its_minimum_runtime_is_not_offered_and_the_gang_learns_when() -> None:
    g = gangs(preempt_min_runtime_s=600.0)
    low = member(priority=1)
    bound_at(g, low, started=NOW - 100)
    waiting = failed_once(g, member(priority=9))  # sent again at 1000 (NOW)
    assert waiting.victims == ()
    assert 0 < waiting.protected_s <= 600
    old = gangs(preempt_min_runtime_s=600.0)
    ran = member(priority=1)
    bound_at(old, ran, started=-10_000.0)  # ran long ago: offered
    assert [p.uid for v in failed_once(old, member(priority=9)).victims for p in v.pods] == [
        ran.pod.uid
    ]


def test_a_pods_cooldown_protects_it_even_without_a_minimum_runtime() -> None:
    g = gangs()
    cooling = member(priority=1)
    bound_at(g, cooling, started=900.0, cooldown_s=3600.0)
    waiting = failed_once(g, member(priority=9))
    assert waiting.victims == ()
    assert waiting.protected_s > 0
    unknown = gangs(preempt_min_runtime_s=600.0)
    bound_at(unknown, member(priority=1), started=None)  # never seen scheduled: not held
    assert failed_once(unknown, member(priority=9)).victims


def test_the_minimum_runtime_is_the_queues_then_an_ancestors_then_the_default() -> None:
    specs = {
        "org": QueueSpec(name="org", preempt_min_runtime_s=60.0, reclaim_min_runtime_s=300.0),
        "a": QueueSpec(name="a", parent="org", reclaim_min_runtime_s=30.0),
        "b": QueueSpec(name="b", parent="org"),
        "x": QueueSpec(name="x"),
    }
    tree = build(TreeQueue(name=q.name, parent=q.parent) for q in specs.values())
    p = Protection(NOW, preempt_s=5.0, reclaim_s=7.0)
    assert p.minimum("a", "a", False, specs, tree) == 60.0  # a sets none: org's
    assert p.minimum("x", "x", False, specs, tree) == 5.0  # the default
    # reclaim: the queue just below the common ancestor on the victim's side, then up
    assert p.minimum("b", "a", True, specs, tree) == 30.0  # siblings: a itself
    assert p.minimum("x", "a", True, specs, tree) == 300.0  # across the root: org
    assert p.minimum("a", "x", True, specs, tree) == 7.0  # x and up set none: default
    flat = Protection(NOW)
    assert flat.minimum("a", "x", True, specs, None) == 0.0  # flat: the victim's queue


def test_reclaim_waits_for_the_reclaim_minimum_of_the_queue_it_takes_from() -> None:
    g = gangs(cards=2)
    g.queues["greedy"] = QueueSpec(name="greedy", reclaim_min_runtime_s=3600.0)
    g.queues["fair"] = QueueSpec(name="fair")
    for i in range(2):
        hog = member(f"hog{i}")
        g.groups[hog.key] = GroupSpec(queue="greedy")
        g.pending(hog)
        g.decided(hog.pod.uid, {"nvidia.count": 10, "nvidia.cores": 100, "nvidia.memory": 81920})
        g.bound_now(hog.pod.uid, NOW - 60)
    mine = member("mine")
    g.groups[mine.key] = GroupSpec(queue="fair")
    waiting = failed_once(g, mine)
    assert waiting.victims == ()
    assert waiting.protected_s > 0


def test_the_waiting_gang_is_told_when_protection_ends() -> None:
    room = Room(placer({"n": gpus(1)}))
    gang = Unplaced(key=member().key, members=[], min_member=1, protected_s=125.2)
    status = Status(code=Code.UNSCHEDULABLE, reasons=(Reason(kind="insufficient"),))
    made = room.make_room(gang, status, now=0.0)
    assert made.note == protected_note(125.2, 0.0)
    assert made.note == (
        "Pods that could make room are protected by their minimum runtime: the first may "
        "be evicted in 126s (at 00:02:05 UTC)."
    )
