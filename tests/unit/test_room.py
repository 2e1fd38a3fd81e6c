"""What the allocator does for a gang it cannot place (services/device_allocator/room.py
``Room.make_room``) and how the binder writes a preemptor's nominated node
(services/binder/nominated.py), on the pure core's ledger and a fake API."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.binder import nominated
from services.device_allocator.room import Room
from shared import events as ev
from shared.core.model import GangKey, NodeName, PodRef, VictimUnit
from shared.core.placement import GangMember, Placement
from shared.core.preemption import NEVER, NOT_ELIGIBLE
from shared.core.status import Code, Reason, Status
from tests.unit.corekit import gpus, place, placer, ref, request

WHOLE = {"nvidia.com/gpu": 1}
NO_ROOM = Status(
    code=Code.UNSCHEDULABLE, nodes=1, reasons=(Reason(kind="insufficient", resource="x"),)
)


def gang(pod: PodRef, victims: tuple[VictimUnit, ...] = (), policy: str = "") -> ev.GangReady:
    pending = ev.PodPending(
        pod=pod, request=request(WHOLE), scheduler_name="tessera", preemption_policy=policy
    )
    ref_ = ev.GangRef(namespace=pod.namespace, name=pod.name, lone=True)
    return ev.GangReady(gang=ref_, min_member=1, members=(pending,), victims=victims)


def full() -> tuple[Room, list[Placement]]:
    pl = placer({"a": gpus(1)})
    return Room(pl), [place(pl, WHOLE)]


def test_a_preemption_names_the_node_and_no_second_one_starts_while_victims_leave() -> None:
    room, held = full()
    top = ref()
    members = [GangMember(pod=top, request=request(WHOLE))]
    offered = (VictimUnit(pods=(held[0].pod,), why="priority 0 < 9"),)
    made = room.make_room(gang(top, offered), members, NO_ROOM, preempt=True)
    [decided] = made.events
    assert isinstance(decided, ev.PreemptionDecided)
    assert made.nominated == {top.uid: NodeName("a")}
    assert made.note == "Preempting 1 pod(s) to make room on a."
    # Asked again while its victim is still leaving: nothing more is evicted, the
    # nominated node stays as it is.
    again = room.make_room(gang(top, offered), members, NO_ROOM, preempt=True)
    assert (again.events, again.note, again.nominated) == ((), "", {})


def test_a_gang_no_room_is_made_for_any_more_has_its_nominated_node_cleared() -> None:
    room, held = full()
    top = ref()
    members = [GangMember(pod=top, request=request(WHOLE))]
    offered = (VictimUnit(pods=(held[0].pod,)),)
    room.make_room(gang(top, offered), members, NO_ROOM, preempt=True)
    room.end_nomination(GangKey.of(top, None))  # its victims are gone, or it lapsed
    cleared = room.make_room(gang(top), members, NO_ROOM, preempt=True)
    assert cleared.nominated == {top.uid: NodeName("")}
    assert room.make_room(gang(top), members, NO_ROOM, preempt=True).nominated == {}
    room.make_room(gang(top, offered), members, NO_ROOM, preempt=True)
    room.end_nomination(GangKey.of(top, None))
    room.placed(GangKey.of(top, None))  # bound: the API server clears it
    assert room.make_room(gang(top), members, NO_ROOM, preempt=True).nominated == {}


def test_a_gang_with_a_pod_of_preemption_policy_never_waits_and_says_so() -> None:
    room, held = full()
    top = ref()
    members = [GangMember(pod=top, request=request(WHOLE))]
    offered = (VictimUnit(pods=(held[0].pod,)),)
    made = room.make_room(gang(top, offered, NEVER), members, NO_ROOM, preempt=True)
    assert (made.events, made.nominated) == ((), {})
    assert made.note == NOT_ELIGIBLE
    assert room.doomed == {}
    quiet = room.make_room(gang(top, offered, NEVER), members, NO_ROOM, preempt=False)
    assert quiet.note == ""  # no preemption at all: no PostFilter to say anything


async def test_a_binding_waits_for_the_nominated_node_on_its_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = asyncio.Event()
    patches: list[tuple[str, Any]] = []

    async def patch_status(_api: Any, path: str, status: dict[str, Any]) -> bool:
        await release.wait()
        patches.append((path, status["nominatedNodeName"]))
        return True

    monkeypatch.setattr(nominated.kube, "patch_status", patch_status)
    writer = nominated.Nominator()
    a, b, c = ref("a"), ref("b"), ref("c")
    failed = ev.AllocationFailed(
        pods=(a, b, c),
        message="m",
        nominated={a.uid: NodeName("n1"), b.uid: NodeName(""), c.uid: NodeName("")},
    )
    writing = asyncio.create_task(writer.write(None, failed, {b.uid}))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    binding = asyncio.create_task(writer.settled(a.uid))
    await asyncio.sleep(0.01)
    assert not binding.done()  # the Binding of a waits for its patch
    release.set()
    await asyncio.gather(writing, binding)
    # "" clears (null in the merge patch); b is bound already: its Binding cleared it.
    assert sorted(patches) == [
        ("/api/v1/namespaces/ns/pods/a/status", "n1"),
        ("/api/v1/namespaces/ns/pods/c/status", None),
    ]
    assert writer.writing == {}
