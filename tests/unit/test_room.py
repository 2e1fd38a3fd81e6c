"""Room made for a gang that does not fit (shared/core/room.py): preemption nominations
and starvation holds, on the pure core's ledger, with the time given."""

from __future__ import annotations

import pytest

from shared.core.framework import PluginRef, Plugins, PluginSet, Profile
from shared.core.ledger import Ledger
from shared.core.model import GangKey, NodeName, PodRef, VictimUnit
from shared.core.placement import GangMember, Placement, Placer
from shared.core.preemption import NEVER, NOT_ELIGIBLE
from shared.core.room import HOLD_S, Room, Unplaced
from shared.core.status import Code, Reason, Status
from tests.unit.corekit import gpus, place, placer, ref, request

WHOLE = {"nvidia.com/gpu": 1}
NO_ROOM = Status(
    code=Code.UNSCHEDULABLE, nodes=1, reasons=(Reason(kind="insufficient", resource="x"),)
)
NOW = 1_000_000.0


def gang(
    pod: PodRef, victims: tuple[VictimUnit, ...] = (), policy: str = "", *, hold: bool = False
) -> Unplaced:
    """A lone pod asking a whole card, as making room reads it."""
    return Unplaced(
        key=key(pod),
        members=[GangMember(pod=pod, request=request(WHOLE))],
        min_member=1,
        policies=(policy,),
        victims=victims,
        hold=hold,
    )


def key(pod: PodRef) -> GangKey:
    return GangKey.of(pod, None)


def full(nodes: int = 1) -> tuple[Room, list[Placement]]:
    """Nodes of one card each, every card taken."""
    pl = placer({f"n{i}": gpus(1) for i in range(nodes)})
    return Room(pl), [place(pl, WHOLE) for _ in range(nodes)]


def preempting(room: Room, held: Placement) -> PodRef:
    """A gang that preempts ``held``'s pod, at ``NOW``."""
    top = ref()
    made = room.make_room(gang(top, (VictimUnit(pods=(held.pod,)),)), NO_ROOM, now=NOW)
    assert made.preempting is not None
    return top


def preempting_both(room: Room, held: list[Placement]) -> PodRef:
    """A gang of two pods (both needed) that preempts both ``held`` pods, at ``NOW``;
    its first pod."""
    top = ref()
    two = Unplaced(
        key=key(top),
        members=[GangMember(pod=p, request=request(WHOLE)) for p in (top, ref())],
        min_member=2,
        victims=tuple(VictimUnit(pods=(h.pod,)) for h in held),
    )
    assert room.make_room(two, NO_ROOM, now=NOW).preempting is not None
    return top


def test_a_preemption_names_the_node_and_no_second_one_starts_while_victims_leave() -> None:
    room, held = full()
    top = ref()
    offered = (VictimUnit(pods=(held[0].pod,), why="priority 0 < 9"),)
    made = room.make_room(gang(top, offered), NO_ROOM, now=NOW)
    assert made.preempting is not None
    assert made.preempting.victims == offered
    assert made.preempting.nodes == (NodeName("n0"),)
    assert made.preempting.pods == (held[0].pod.uid,)
    assert made.nominated == {top.uid: NodeName("n0")}
    assert made.note == "Preempting 1 pod(s) to make room on n0."
    # Asked again while its victim is still leaving: nothing more is evicted, the
    # nominated node stays as it is.
    again = room.make_room(gang(top, offered), NO_ROOM, now=NOW)
    assert (again.preempting, again.note, again.nominated) == (None, "", {})


def test_a_gang_no_room_is_made_for_any_more_has_its_nominated_node_cleared() -> None:
    room, held = full()
    top = ref()
    offered = (VictimUnit(pods=(held[0].pod,)),)
    room.make_room(gang(top, offered), NO_ROOM, now=NOW)
    room.end_nomination(key(top))  # its victims are gone, or it lapsed
    cleared = room.make_room(gang(top), NO_ROOM, now=NOW)
    assert cleared.nominated == {top.uid: NodeName("")}
    assert room.make_room(gang(top), NO_ROOM, now=NOW).nominated == {}
    room.make_room(gang(top, offered), NO_ROOM, now=NOW)
    room.end_nomination(key(top))
    room.placed(key(top))  # bound: the API server clears it
    assert room.make_room(gang(top), NO_ROOM, now=NOW).nominated == {}


def test_a_gang_with_a_pod_of_preemption_policy_never_waits_and_says_so() -> None:
    room, held = full()
    top = ref()
    offered = (VictimUnit(pods=(held[0].pod,)),)
    made = room.make_room(gang(top, offered, NEVER), NO_ROOM, now=NOW)
    assert (made.preempting, made.nominated) == (None, {})
    assert made.note == NOT_ELIGIBLE
    assert room.doomed == {}
    no_preemption = Plugins(post_filter=PluginSet(disabled=[PluginRef(name="DefaultPreemption")]))
    room.placer.ledger.hosts.profile = Profile.build(no_preemption)
    quiet = room.make_room(gang(top, offered, NEVER), NO_ROOM, now=NOW)
    assert quiet.note == ""  # no preemption at all: no PostFilter to say anything


def test_a_gone_victims_devices_stay_booked_until_its_gang_comes_back() -> None:
    room, held = full()
    top = preempting(room, held[0])
    ledger = room.placer.ledger
    assert room.waiting(key(top), NOW) == "waiting for 1 preempted pod(s) to exit"
    assert room.gone(held[0].pod) == key(top)
    assert room.gone(ref()) is None  # not preempted: the caller releases it
    assert room.all_gone(key(top))
    assert held[0].pod.uid in ledger.pods  # kept for the gang: no other pod takes it
    assert room.waiting(key(top), NOW) is None  # all gone: the devices are its now
    assert ledger.pods == {}
    assert room.doomed == {}
    assert room.nominations == {}


def test_a_nomination_whose_victims_never_leave_lapses_at_the_time_given() -> None:
    room, held = full()
    top = preempting(room, held[0])
    assert room.waiting(key(top), NOW + HOLD_S - 1) is not None
    assert room.waiting(key(top), NOW + HOLD_S) is None
    assert held[0].pod.uid in room.placer.ledger.pods  # still running: not freed
    assert room.doomed == {}


def test_a_lapsed_nomination_gives_its_gone_victims_devices_back() -> None:
    room, held = full(2)
    top = preempting_both(room, held)
    room.gone(held[0].pod)
    assert room.lapsed(NOW + HOLD_S - 1).freed == {}
    lapsed = room.lapsed(NOW + HOLD_S)
    assert {k: [g.pod for g in grants] for k, grants in lapsed.freed.items()} == {
        key(top): [held[0].pod]
    }
    assert list(room.placer.ledger.pods) == [held[1].pod.uid]  # the one still running
    assert room.nominated == {}
    assert room.nominations == {}


def test_ending_a_nomination_gives_back_all_its_devices_or_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    room, held = full(2)
    top = preempting_both(room, held)
    for h in held:
        room.gone(h.pod)
    ledger = room.placer.ledger
    before = ledger.snapshot()
    release = Ledger.release
    calls = 0

    def failing(self: Ledger, uid: str) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("midway")
        return release(self, uid)  # type: ignore[arg-type]

    monkeypatch.setattr(Ledger, "release", failing)
    with pytest.raises(RuntimeError, match="midway"):
        room.end_nomination(key(top))
    monkeypatch.setattr(Ledger, "release", release)
    assert ledger.snapshot() == before  # the first release undone
    assert key(top) in room.nominations  # and the nomination kept, to end again
    assert len(room.end_nomination(key(top))) == 2
    assert ledger.pods == {}


def test_a_starved_gang_has_nodes_held_renewed_and_lapsing_at_the_times_given() -> None:
    room, _ = full(2)
    pl: Placer = room.placer
    top = ref()
    made = room.make_room(gang(top, hold=True), NO_ROOM, now=NOW)
    [node] = made.starved
    assert pl.reserved_nodes == {node: key(top)}
    assert made.note == f"It has waited long: nodes {node} are held for it until their pods finish."
    renewed = room.make_room(gang(top, hold=True), NO_ROOM, now=NOW + 60)
    assert (renewed.starved, renewed.note) == ((), made.note)  # renewed, not new
    assert room.lapsed(NOW + HOLD_S).holds == ()  # renewed at NOW + 60
    assert room.lapsed(NOW + 60 + HOLD_S).holds == (key(top),)
    assert pl.reserved_nodes == {}
    room.make_room(gang(top, hold=True), NO_ROOM, now=NOW)
    room.placed(key(top))  # placed: its hold ends
    assert pl.reserved_nodes == {}
    assert room.holds == {}


def test_no_hold_for_a_gang_that_could_never_fit() -> None:
    room, _ = full()
    top = ref()
    unresolvable = Status(code=Code.UNRESOLVABLE, reasons=(Reason(kind="no-devices"),))
    made = room.make_room(gang(top, hold=True), unresolvable, now=NOW)
    assert (made.starved, made.note) == ((), "")
    assert room.placer.reserved_nodes == {}


def test_the_postfilters_are_the_profiles() -> None:
    # Without StarvationHold a starved gang holds nothing. With StarvationHold first, a
    # starved gang that may preempt has nodes held and then preempts: the round ends
    # with the first PostFilter that evicts, and says what the earlier ones did.
    room, held = full(2)
    top = ref()
    without_hold = Plugins(post_filter=PluginSet(disabled=[PluginRef(name="StarvationHold")]))
    room.placer.ledger.hosts.profile = Profile.build(without_hold)
    made = room.make_room(gang(top, hold=True), NO_ROOM, now=NOW)
    assert (made.starved, made.note, room.placer.reserved_nodes) == ((), "", {})
    hold_first = Plugins(
        post_filter=PluginSet(
            disabled=[PluginRef(name="*")],
            enabled=[PluginRef(name="StarvationHold"), PluginRef(name="DefaultPreemption")],
        )
    )
    room.placer.ledger.hosts.profile = Profile.build(hold_first)
    offered = (VictimUnit(pods=(held[0].pod,)),)
    made = room.make_room(gang(top, offered, hold=True), NO_ROOM, now=NOW)
    assert made.preempting is not None
    [node] = made.starved
    assert room.placer.reserved_nodes == {node: key(top)}
    assert made.note.startswith(f"It has waited long: nodes {node} are held for it")
    assert made.note.endswith(f"Preempting 1 pod(s) to make room on {held[0].node}.")
