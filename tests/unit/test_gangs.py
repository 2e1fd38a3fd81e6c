"""The coordinator's decisions, directly on the pure core (shared/core/gangs.py):
gang readiness, queue admission and order, retries, and which bound pods are offered
as victims."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from shared.core.gangs import INFLIGHT_TIMEOUT_S, MAX_BACKOFF_S, Gangs, Member, Policy
from shared.core.model import GangKey, NodeName, PodUID
from shared.core.queues import GroupSpec, QueueSpec
from tests.unit.corekit import gpus, ref, request

WHOLE = {"nvidia.com/gpu": 1}


def gangs(cards: int = 8, **policy: Any) -> Gangs:
    g = Gangs(Policy(**policy), {"nvidia": 10})
    g.set_node(NodeName("n"), tuple(gpus(cards)))
    return g


def member(
    group: str | None = None,
    *,
    priority: int = 0,
    created: float = 0.0,
    task: str | None = None,
    limits: dict[str, Any] = WHOLE,
) -> Member:
    pod = ref()
    return Member(
        pod=pod,
        key=GangKey.of(pod, group),
        request=request(limits),
        priority=priority,
        created_at=created,
        task=task,
    )


def sent(g: Gangs, now: float = 0.0) -> list[tuple[str, int]]:
    """(gang name, member count) of each gang dispatched, in order."""
    return [(r.key.name, len(r.members)) for r in g.dispatch(now).ready]


# --- readiness ------------------------------------------------------------------------


def test_a_lone_pod_goes_at_once_and_only_once() -> None:
    g = gangs()
    m = member()
    g.pending(m)
    [ready] = g.dispatch(0.0).ready
    assert ready.key.lone
    assert ready.min_member == 1
    assert ready.attempt == 1
    assert m.state == "inflight"
    assert g.dispatch(1.0).ready == ()  # in flight: not sent again


def test_a_group_waits_for_its_podgroup_then_for_min_member() -> None:
    g = gangs()
    first = member("job")
    g.pending(first)
    waiting = g.dispatch(0.0)
    assert waiting.ready == ()  # PodGroup unknown: wait, as Volcano does, but say so
    [(told, status)] = waiting.told
    assert told is first
    assert not status.unresolvable
    assert 'PodGroup "job" does not exist' in status.message()
    g.groups[first.key] = GroupSpec(min_member=2)
    assert sent(g) == []  # 1 of 2
    g.pending(member("job"))
    assert sent(g) == [("job", 2)]


def test_placed_members_count_towards_min_member() -> None:
    g = gangs()
    a, b, c = member("job"), member("job"), member("job")
    g.groups[a.key] = GroupSpec(min_member=3)
    for m in (a, b, c):
        g.pending(m)
    [ready] = g.dispatch(0.0).ready
    assert ready.min_member == 3
    g.decided(a.pod.uid, {"nvidia.count": 1})
    g.decided(b.pod.uid, {"nvidia.count": 1})
    g.failed([c.pod.uid], ready.attempt, unresolvable=False, now=0.0)
    [again] = g.dispatch(100.0).ready
    assert [m.pod for m in again.members] == [c.pod]
    assert again.min_member == 1  # two of three are placed already


def test_min_task_member_counts_per_role() -> None:
    g = gangs()
    ps = member("tf", task="ps")
    g.groups[ps.key] = GroupSpec(min_member=2, min_task_member={"ps": 1, "worker": 1})
    g.pending(ps)
    g.pending(member("tf", task="ps"))
    assert sent(g) == []  # two pods, but no worker yet
    g.pending(member("tf", task="worker"))
    assert sent(g) == [("tf", 3)]


def test_members_go_by_priority_then_age() -> None:
    g = gangs()
    late, early, high = member("j", created=2), member("j", created=1), member("j", priority=5)
    g.groups[late.key] = GroupSpec(min_member=3)
    for m in (late, early, high):
        g.pending(m)
    [ready] = g.dispatch(0.0).ready
    assert [m.pod for m in ready.members] == [high.pod, early.pod, late.pod]


# --- queues -----------------------------------------------------------------------------


def test_a_closed_or_missing_queue_holds_its_pods_and_tells_them_once() -> None:
    g = gangs()
    g.queues["default"] = QueueSpec(name="default", state="Closed")
    m = member()
    g.pending(m)
    first = g.dispatch(0.0)
    assert first.ready == ()
    [(told, status)] = first.told
    assert told is m
    assert status.unresolvable
    assert 'queue "default" is Closed' in status.message()
    assert g.dispatch(1.0).told == ()  # said once
    del g.queues["default"]
    g.queues["other"] = QueueSpec(name="other")
    [(_, missing)] = g.dispatch(2.0).told
    assert 'queue "default" does not exist' in missing.message()


def test_a_queue_over_its_deserved_share_waits_while_another_is_served() -> None:
    g = gangs(cards=4)
    g.queues["a"] = QueueSpec(name="a", weight=1)
    g.queues["b"] = QueueSpec(name="b", weight=1)
    pods = {"a": [member(f"a{i}") for i in range(4)], "b": [member(f"b{i}") for i in range(4)]}
    for queue, members in pods.items():
        for m in members:
            g.groups[m.key] = GroupSpec(queue=queue)
            g.pending(m)
    ready = g.dispatch(0.0).ready
    by_queue = {q: sum(r.queue == q for r in ready) for q in ("a", "b")}
    # 4 cards x 10 slots shared 1:1 by demand; each whole card counts its cores, so the
    # share limits each queue to half the cluster's cores: 2 whole cards each.
    assert by_queue == {"a": 2, "b": 2}


def test_capability_is_a_hard_cap_even_alone() -> None:
    g = gangs()
    g.queues["q"] = QueueSpec(name="q", capability={"nvidia.count": 2})
    members = [member(f"g{i}") for i in range(4)]
    for m in members:
        g.groups[m.key] = GroupSpec(queue="q")
        g.pending(m)
    assert len(g.dispatch(0.0).ready) == 2


def test_queue_priority_then_the_queue_furthest_below_its_share_goes_first() -> None:
    g = gangs()
    g.queues["low"] = QueueSpec(name="low", priority=0)
    g.queues["high"] = QueueSpec(name="high", priority=10)
    for queue in ("low", "high"):
        m = member(queue)
        g.groups[m.key] = GroupSpec(queue=queue)
        g.pending(m)
    assert [r.queue for r in g.dispatch(0.0).ready] == ["high", "low"]


def summed(g: Gangs) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """What each queue holds and asks, summed afresh over every pod (what ``shares``
    keeps as pods change)."""
    used: dict[str, dict[str, float]] = {q: dict(v) for q, v in g.bound_use.items()}
    demand: dict[str, dict[str, float]] = {q: dict(v) for q, v in g.bound_use.items()}
    for m in g.pods.values():
        sums = [demand, used] if m.state in ("inflight", "placed") else [demand]
        for out in sums:
            held = out.setdefault(m.queue, {})
            for k, v in m.vector.items():
                held[k] = held.get(k, 0.0) + v
    return used, demand


OPS = st.lists(
    st.tuples(
        st.sampled_from(["pending", "dispatch", "decided", "failed", "bound", "gone", "requeue"]),
        st.integers(0, 7),
        st.integers(1, 4),
    ),
    max_size=60,
)


@given(ops=OPS)
def test_the_queue_sums_kept_as_pods_change_are_the_sums_over_every_pod(
    ops: list[tuple[str, int, int]],
) -> None:
    g = gangs(cards=16)
    g.queues["a"] = QueueSpec(name="a", weight=1)
    g.queues["b"] = QueueSpec(name="b", weight=2)
    pods = [member(f"g{i % 4}", limits={"nvidia.com/gpu": 1 + i % 2}) for i in range(8)]
    for i, m in enumerate(pods):
        g.groups[m.key] = GroupSpec(queue="ab"[i % 2])
    now = 0.0
    for op, i, n in ops:
        m, now = pods[i], now + 1.0
        uid = m.pod.uid
        if op == "pending":
            g.pending(Member(pod=m.pod, key=m.key, request=m.request))
        elif op == "dispatch":
            g.dispatch(now)
        elif op == "decided":
            g.decided(uid, {"nvidia.count": float(n), "nvidia.memory": 1000.5 * n})
        elif op == "failed":
            attempt = g.pods[uid].attempt if uid in g.pods else 0
            g.failed([uid], attempt, unresolvable=False, now=now)
        elif op == "bound":
            g.bound_now(uid)
        elif op == "gone":
            g.forget(uid)
        else:  # its PodGroup moves to the other queue
            g.groups[m.key] = GroupSpec(queue="ba"["ab".index(g.groups[m.key].queue)])
        used, demand, _ = g.shares()
        want_used, want_demand = summed(g)
        for got, want in ((used, want_used), (demand, want_demand)):
            assert set(got) == set(want)
            for q in want:  # a dimension at 0 is one not named (it limits nothing)
                for k in {*got[q], *want[q]}:
                    assert math.isclose(got[q].get(k, 0.0), want[q].get(k, 0.0), abs_tol=1e-6)


STEPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "pending",
                "dispatch",
                "decided",
                "failed",
                "unresolvable",
                "bind-failed",
                "bind-refused",
                "withdrawn",
                "released",
                "node-changed",
                "bound",
                "gone",
                "group",
            ]
        ),
        st.integers(0, 3),
        st.sampled_from([0.5, 2.0, INFLIGHT_TIMEOUT_S + 1]),
    ),
    max_size=80,
)


@given(steps=STEPS)
@example(steps=[("pending", 0, 0.5), ("unresolvable", 0, 0.5), ("node-changed", 0, 0.5)])
@example(steps=[("pending", 0, 0.5), ("failed", 0, 0.5), ("released", 0, 0.5)])
@example(steps=[("pending", 0, 0.5), ("dispatch", 0, 0.5), ("decided", 0, 0.5)])
@example(
    steps=[
        ("pending", 0, 0.5),
        ("dispatch", 0, 0.5),
        ("pending", 2, 0.5),
        ("dispatch", 0, 0.5),
        ("dispatch", 0, INFLIGHT_TIMEOUT_S + 0.25),
        ("dispatch", 0, 0.5),
    ]
)
def test_a_dispatch_reads_the_pods_by_state_as_a_scan_of_every_pod_would_find_them(
    steps: list[tuple[str, int, float]],
) -> None:
    """The coordinator keeps its waiting pods indexed by state, so a dispatch reads only
    the pending ones and those due; whatever happens, each index holds exactly the pods a
    scan of every pod finds in its state, the earliest retry is the parked pods' earliest,
    and after a dispatch no pod is left parked past its retry time or in flight past
    ``INFLIGHT_TIMEOUT_S``. Fails if a move between states misses an index, if a release
    or a node change does not make the parked pods due, or if a resend keeps its old
    place in the in-flight order."""
    g = gangs(cards=4)
    pods = [member(f"g{i}" if i % 2 else None) for i in range(4)]
    for m in pods[1::2]:
        g.groups[m.key] = GroupSpec(min_member=1)
    now = 0.0
    for op, i, step in steps:
        m, now = pods[i], now + step
        uid = m.pod.uid
        attempt = g.pods[uid].attempt if uid in g.pods else 0
        if op == "pending":
            g.pending(Member(pod=m.pod, key=m.key, request=m.request))
        elif op == "dispatch":
            g.dispatch(now)
            waiting = g.pods.values()
            assert not [w for w in waiting if w.state == "parked" and w.retry_at <= now]
            late = [w for w in waiting if w.state == "inflight"]
            assert not [w for w in late if now - w.sent_at > INFLIGHT_TIMEOUT_S]
        elif op == "decided":
            g.decided(uid, {"nvidia.count": 1.0})
        elif op in ("failed", "unresolvable"):
            g.failed([uid], attempt, unresolvable=op == "unresolvable", now=now)
        elif op == "bind-failed":
            g.bind_failed(uid)
        elif op == "bind-refused":
            g.bind_failed(uid, refused_at=now)
        elif op == "withdrawn":
            g.withdraw(uid)
        elif op in ("released", "node-changed"):
            g.helpful(node_changed=op == "node-changed")
            for w in g.pods.values():  # each parked one it can help is due now
                helps = op == "node-changed" or not w.unresolvable
                if w.state == "parked" and helps and not w.refused:
                    assert w.retry_at == 0.0
        elif op == "bound":
            g.bound_now(uid)
        elif op == "gone":
            g.forget(uid)
        elif not m.key.lone and g.groups.pop(m.key, None) is None:  # it goes, or comes back
            g.groups[m.key] = GroupSpec(min_member=1)
        by_state: dict[str, set[PodUID]] = {}
        for w in g.pods.values():
            by_state.setdefault(w.state, set()).add(w.pod.uid)
        assert set(g._pending) == by_state.get("pending", set())
        assert set(g._inflight) == by_state.get("inflight", set())
        sent_at = [w.sent_at for w in g._inflight.values()]
        assert sent_at == sorted(sent_at)
        assert {u for placed in g._placed.values() for u in placed} == by_state.get("placed", set())
        assert all(w.key == k for k, placed in g._placed.items() for w in placed.values())
        assert {*g._backing_off, *g._unresolvable} <= by_state.get("parked", set())
        parked = [w for w in g.pods.values() if w.state == "parked"]
        assert g.next_retry() == min((w.retry_at for w in parked), default=math.inf)


# --- retries ----------------------------------------------------------------------------


def test_a_failed_gang_backs_off_doubling_and_a_release_retries_it_now() -> None:
    g = gangs(retry_backoff_s=1.0)
    m = member()
    g.pending(m)
    for attempt, backoff in ((1, 1.0), (2, 2.0), (3, 4.0)):
        [ready] = g.dispatch(100.0 * attempt).ready
        assert ready.attempt == attempt
        g.failed([m.pod.uid], attempt, unresolvable=False, now=100.0 * attempt)
        assert m.retry_at == 100.0 * attempt + backoff
    assert g.dispatch(300.0 + 3.9).ready == ()
    g.helpful(node_changed=False)  # a release could help
    assert len(g.dispatch(303.95).ready) == 1
    m.attempt = 20
    g.failed([m.pod.uid], 20, unresolvable=False, now=0.0)
    assert m.retry_at == MAX_BACKOFF_S


def test_a_refused_binding_waits_out_its_backoff_whatever_comes_free() -> None:
    """A pod whose Binding the API server refused goes again after its backoff, not at
    the release of its own reservation (which follows every failed bind): that was a
    retry about 19 times a second for as long as the refusal lasted."""
    g = gangs(retry_backoff_s=1.0)
    m = member()
    g.pending(m)
    for attempt, backoff in ((1, 1.0), (2, 2.0)):
        now = 100.0 * attempt
        [ready] = g.dispatch(now).ready
        assert ready.attempt == attempt
        g.decided(m.pod.uid, {"nvidia.count": 1.0})
        g.bind_failed(m.pod.uid, refused_at=now)
        assert (m.state, m.retry_at) == ("parked", now + backoff)
        g.helpful(node_changed=True)  # its released reservation, a node change
        assert g.dispatch(now + backoff - 0.01).ready == ()
        assert g.next_retry() == now + backoff
    g.bind_failed(m.pod.uid)  # out of reach: the binder's own retries were the wait
    assert len(g.dispatch(200.0).ready) == 1


def test_a_pod_refused_for_its_gates_waits_uncounted_until_announced_again() -> None:
    """Withdrawn, a gated member neither goes nor counts toward its group's
    ``minMember``; announced again (ungated) it goes with a new attempt: one repeated
    would be dropped by the bus as a duplicate of the first."""
    g = gangs()
    first, gated = member("pair"), member("pair")
    g.groups[first.key] = GroupSpec(min_member=2)
    for m in (first, gated):
        g.pending(m)
    [ready] = g.dispatch(0.0).ready
    assert ready.attempt == 1
    g.decided(first.pod.uid, {"nvidia.count": 1.0})
    g.decided(gated.pod.uid, {"nvidia.count": 1.0})
    g.bind_failed(first.pod.uid)  # say the binds of both failed: one for its gates
    g.withdraw(gated.pod.uid)
    assert gated.pod.uid not in g.pods
    assert g.dispatch(1.0).ready == ()  # one of two: the gang waits whole
    again = Member(pod=gated.pod, key=gated.key, request=gated.request)
    assert g.pending(again)
    [ready] = g.dispatch(2.0).ready
    assert ready.attempt == 2
    assert {m.pod.uid for m in ready.members} == {first.pod.uid, gated.pod.uid}
    g.withdraw(gated.pod.uid)
    g.forget(gated.pod.uid)  # deleted while withdrawn: nothing kept
    assert g.pending(Member(pod=gated.pod, key=gated.key, request=gated.request))
    assert g.pods[gated.pod.uid].attempt == 0


def test_an_unresolvable_gang_waits_for_a_node_change_only() -> None:
    g = gangs()
    m = member()
    g.pending(m)
    g.dispatch(0.0)
    g.failed([m.pod.uid], 1, unresolvable=True, now=0.0)
    assert m.retry_at == math.inf
    assert g.next_retry() == math.inf
    g.helpful(node_changed=False)
    assert g.dispatch(1e9).ready == ()
    g.helpful(node_changed=True)
    assert len(g.dispatch(1e9).ready) == 1


def test_a_gang_failing_after_a_change_that_came_while_it_was_in_flight_goes_again_now() -> None:
    # The allocator may judge a gang before it has read a change the coordinator read
    # first (an uncordoned card, a freed grant): such a failure must not wait for the
    # next change, or for a backoff of up to a minute.
    g = gangs(retry_backoff_s=30.0)
    unresolvable, failed, before = member(), member(), member()
    for m in (unresolvable, failed, before):
        g.pending(m)
    g.dispatch(0.0)
    g.failed([before.pod.uid], 1, unresolvable=False, now=0.0)  # no change since it went
    assert g.dispatch(1.0).ready == ()
    g.helpful(node_changed=False)  # a release: no help for the unresolvable one
    assert [r.members[0] for r in g.dispatch(2.0).ready] == [before]
    g.failed([unresolvable.pod.uid], 1, unresolvable=True, now=3.0)
    g.failed([failed.pod.uid], 1, unresolvable=False, now=3.0)
    assert unresolvable.retry_at == math.inf
    assert [r.members[0] for r in g.dispatch(3.0).ready] == [failed]
    g.helpful(node_changed=True)  # a node changed while these two were in flight
    g.failed([failed.pod.uid, before.pod.uid], 2, unresolvable=True, now=5.0)
    assert {r.members[0].pod.uid for r in g.dispatch(5.0).ready} == {
        unresolvable.pod.uid,  # parked before the change: the change made it due
        failed.pod.uid,
        before.pod.uid,
    }


def test_a_stale_answer_is_ignored_and_an_unanswered_gang_is_sent_again() -> None:
    g = gangs()
    m = member()
    g.pending(m)
    g.dispatch(0.0)
    g.failed([m.pod.uid], 7, unresolvable=True, now=0.0)  # not this attempt
    assert m.state == "inflight"
    assert g.dispatch(INFLIGHT_TIMEOUT_S / 2).ready == ()
    [again] = g.dispatch(INFLIGHT_TIMEOUT_S + 1).ready
    assert again.attempt == 2


def test_a_changed_request_unparks_a_pod() -> None:
    g = gangs()
    m = member(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1_000_000})
    g.pending(m)
    g.dispatch(0.0)
    g.failed([m.pod.uid], 1, unresolvable=True, now=0.0)
    fixed = Member(
        pod=m.pod, key=m.key, request=request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    )
    assert g.pending(fixed)
    assert len(g.dispatch(1.0).ready) == 1


# --- victims ----------------------------------------------------------------------------


def bind(g: Gangs, m: Member, vector: dict[str, float] | None = None) -> None:
    g.pending(m)
    g.decided(m.pod.uid, vector or {"nvidia.count": 1})
    g.bound_now(m.pod.uid)


def failed_once(g: Gangs, m: Member) -> Any:
    g.pending(m)
    [first] = g.dispatch(0.0).ready
    g.failed([p.pod.uid for p in first.members], first.attempt, unresolvable=False, now=0.0)
    [again] = g.dispatch(1000.0).ready
    return again


def test_lower_priority_pods_are_offered_cheapest_first_and_a_gang_never_below_min() -> None:
    g = gangs()
    lone_low = member(priority=1)
    bind(g, lone_low)
    team = [member("team", priority=2) for _ in range(3)]
    g.groups[team[0].key] = GroupSpec(min_member=2)
    for m in team:
        bind(g, m)
    same = member(priority=9)
    bind(g, same)
    waiting = failed_once(g, member(priority=9))
    offered = [tuple(p.uid for p in v.pods) for v in waiting.victims]
    assert offered[0] == (lone_low.pod.uid,)  # lowest priority first
    singles = [o for o in offered if len(o) == 1 and o[0] in {m.pod.uid for m in team}]
    assert len(singles) == 1  # one member beyond minMember 2 of 3
    whole = [o for o in offered if len(o) == 3]
    assert len(whole) == 1  # then the whole gang, never just two
    assert (same.pod.uid,) not in offered  # equal priority is never preempted
    assert "all of gang team (never below minMember 2)" in waiting.victims[-1].why


def test_nothing_is_offered_without_lower_priority_or_a_queue_over_its_share() -> None:
    g = gangs()
    bind(g, member(priority=5))
    assert failed_once(g, member(priority=5)).victims == ()
    quiet = gangs(preemption=False)
    bind(quiet, member(priority=0))
    assert failed_once(quiet, member(priority=9)).victims == ()


def test_a_queue_over_its_share_gives_back_unless_it_is_not_reclaimable() -> None:
    for reclaimable in (True, False):
        g = gangs(cards=2)
        g.queues["greedy"] = QueueSpec(name="greedy", reclaimable=reclaimable)
        g.queues["fair"] = QueueSpec(name="fair")
        hogs = [member(f"hog{i}") for i in range(2)]
        for m in hogs:
            g.groups[m.key] = GroupSpec(queue="greedy")
            bind(g, m, {"nvidia.count": 10, "nvidia.cores": 100, "nvidia.memory": 81920})
        mine = member("mine")
        g.groups[mine.key] = GroupSpec(queue="fair")
        waiting = failed_once(g, mine)
        offered = {p.uid for v in waiting.victims for p in v.pods}
        if reclaimable:
            assert offered & {m.pod.uid for m in hogs}
            assert all("over its deserved share" in v.why for v in waiting.victims)
        else:
            assert offered == set()


@given(
    priorities=st.lists(st.integers(0, 5), min_size=1, max_size=8),
    top=st.integers(0, 6),
)
def test_every_offer_is_of_lower_priority_than_the_waiting_gang(
    priorities: list[int], top: int
) -> None:
    g = gangs()
    bound = [member(priority=p) for p in priorities]
    for m in bound:
        bind(g, m)
    waiting = failed_once(g, member(priority=top))
    by_uid = {m.pod.uid: m for m in bound}
    offered: set[PodUID] = set()
    for v in waiting.victims:
        for p in v.pods:
            assert by_uid[p.uid].priority < top
            offered.add(p.uid)
    assert offered == {m.pod.uid for m in bound if m.priority < top}
    costs = [by_uid[v.pods[0].uid].priority for v in waiting.victims]
    assert costs == sorted(costs)
