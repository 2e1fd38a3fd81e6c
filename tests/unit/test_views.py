"""The live views' contents from the core: per-node verdicts with hints (explain), the
ledger as people read it, queue status and queue figures; and the hint texts."""

from __future__ import annotations

from services.device_allocator.views import explain_view, ledger_view
from services.gang_coordinator.queues import Why, queue_status, snapshot
from shared import events as ev
from shared import views
from shared.config import parse as parse_config
from shared.core.gangs import Gangs, Member
from shared.core.model import GangKey, PodRef, PodUID
from shared.core.queues import GroupSpec, QueueSpec, resource_list
from shared.core.request import ResourceTable
from shared.core.status import UNRESOLVABLE, Reason, Status
from tests.unit.corekit import gpus, place, placer, ref, request

TABLE = ResourceTable.build(parse_config({}).devices)


def test_each_reason_says_what_would_make_the_node_take_the_pod() -> None:
    cpu = Reason(kind="insufficient", resource="cpu", requested=2000, free=500, capacity=4000)
    assert cpu.hint() == "1500m more cpu free on the node (500m of 4000m free)"
    memory = Reason(
        kind="insufficient", resource="memory", requested=8 << 30, free=2 << 30, capacity=64 << 30
    )
    assert memory.hint() == "6144Mi more memory free on the node (2048Mi of 65536Mi free)"
    card = Reason(
        kind="device-insufficient",
        resource="nvidia.com/gpumem",
        requested=30000,
        free=12000,
        capacity=81920,
    )
    assert card.hint() == (
        "18000MiB more nvidia.com/gpumem free on one device (best: 12000MiB of 81920MiB free)"
    )
    cores = Reason(
        kind="device-insufficient", resource="nvidia.com/gpucores", requested=60, free=40
    )
    assert cores.hint().startswith("20% more nvidia.com/gpucores")
    big = Reason(
        kind="larger-than-card", code=UNRESOLVABLE, resource="nvidia.com/gpumem", capacity=81920
    )
    assert big.hint() == "ask for at most 81920 nvidia.com/gpumem"
    assert "toleration" in Reason(kind="taint").hint()
    assert Reason(kind="node-unschedulable").hint() == "uncordon the node (kubectl uncordon)"
    assert Reason(kind="no-devices").hint() == ""  # nothing to suggest


def test_explain_answers_for_every_node_those_that_fit_first() -> None:
    pl = placer({"a": gpus(1), "b": gpus(1)})
    full = place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 70000}).node
    free = "b" if full == "a" else "a"
    who = ref("wants")
    asked = request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000})
    answer = explain_view(pl, views.ExplainQuery(pod=who, request=asked))
    assert [v.node for v in answer.nodes] == [free, full]
    assert answer.nodes[0].fits
    assert not answer.nodes[1].fits
    assert answer.nodes[1].texts == ("insufficient nvidia.com/gpumem",)
    assert answer.nodes[1].hints[0].startswith("18080MiB more nvidia.com/gpumem")
    assert answer.message == "1/2 nodes would take it now"
    # Nothing was placed by asking.
    assert who.uid not in pl.ledger.pods

    huge = request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 90000})
    answer = explain_view(pl, views.ExplainQuery(pod=ref("huge"), request=huge))
    assert answer.unresolvable
    assert "larger than any nvidia card" in answer.message
    assert answer.nodes == ()  # refused before any node is tried


def test_explain_over_shards_reads_as_one_allocator_over_every_node() -> None:
    # Two shards, one node each: a full card on one, a small one on the other.
    one = placer({"a": gpus(1)})
    place(one, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 70000})
    other = placer({"b": gpus(1)})
    place(other, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 60000})
    asked = views.ExplainQuery(
        pod=ref("wants"), request=request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000})
    )
    parts = [explain_view(one, asked), explain_view(other, asked)]
    assert [p.message for p in parts] == [
        "0/1 nodes are available: 1 insufficient nvidia.com/gpumem.",
        "0/1 nodes are available: 1 insufficient nvidia.com/gpumem.",
    ]
    both = views.merged(list(parts))
    assert isinstance(both, views.ExplainView)
    assert both.message == "0/2 nodes are available: 2 insufficient nvidia.com/gpumem."
    assert [v.node for v in both.nodes] == ["a", "b"]
    assert both.status is not None
    assert both.status.nodes == 2
    # A node that fits anywhere: the message counts it over both shards.
    fits = views.merged([parts[0], explain_view(placer({"c": gpus(1)}), asked)])
    assert isinstance(fits, views.ExplainView)
    assert fits.message == "1/2 nodes would take it now"
    assert [v.node for v in fits.nodes] == ["c", "a"]
    assert fits.status is None


def test_the_ledger_view_shows_each_grant_on_its_card_reserved_or_bound() -> None:
    pl = placer({"a": gpus(2)})
    first = place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30})
    second = place(pl, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000})
    view = ledger_view(pl.ledger, {second.pod.uid}, {}, views.LedgerQuery(), "me")
    (node,) = view.nodes
    grants = {g.pod: g for d in node.devices for g in d.grants}
    assert grants[first.pod.name].bound
    assert not grants[second.pod.name].bound
    assert (grants[first.pod.name].memory_mib, grants[first.pod.name].cores) == (20000, 30)
    for d in node.devices:
        assert d.used_memory_mib == sum(g.memory_mib for g in d.grants)
        assert d.memory_mib == 81920
    refused = ledger_view(pl.ledger, set(), {"b": "abc"}, views.LedgerQuery(nodes=("b",)), "me")
    assert [(n.name, n.refused) for n in refused.nodes] == [
        ("b", "runs config abc, not this allocator's")
    ]


def test_a_queue_vector_is_written_with_the_names_users_write() -> None:
    vector = {"nvidia.count": 2.0, "nvidia.memory": 16000.0, "nvidia.cores": 50.0}
    assert resource_list(TABLE, vector) == {
        "nvidia.com/gpu": 2.0,
        "nvidia.com/gpumem": 16000.0,
        "nvidia.com/gpucores": 50.0,
    }


def test_queue_status_counts_podgroups_by_phase_and_what_the_queue_holds() -> None:
    gangs = Gangs()
    gangs.queues["q"] = QueueSpec(name="q", weight=2)
    for name in ("a", "b", "c"):
        gangs.groups[GangKey("ns", name)] = GroupSpec(min_member=1, queue="q")
    waiting = Member(
        pod=PodRef(namespace="ns", name="w", uid=PodUID("w")),
        key=GangKey("ns", "c"),
        request=request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}),
        queue="q",
        vector={"nvidia.count": 1.0, "nvidia.memory": 1000.0},
    )
    gangs.pending(waiting)
    phases = {GangKey("ns", "a"): "Running", GangKey("ns", "b"): "Inqueue"}
    why = {GangKey("ns", "c"): Why("0/1 nodes are available: 1 insufficient nvidia.com/gpumem.")}
    snap = snapshot(gangs, phases, why, now=waiting.since + 5)
    (q,) = [q for q in snap.queues if q.name == "q"]
    assert q.podgroups == {"Running": 1, "Inqueue": 1, "Pending": 1}
    assert q.weight == 2
    assert q.request == {"nvidia.count": 1.0, "nvidia.memory": 1000.0}
    status = queue_status(q, TABLE)
    assert status["state"] == "Open"
    assert (status["running"], status["inqueue"], status["pending"]) == (1, 1, 1)
    assert status["allocated"] == {}
    (gang,) = snap.gangs
    assert gang.why.startswith("0/1 nodes")
    assert gang.pods == {"pending": 1}
    assert gang.waiting_s == 5


def test_a_waiting_gang_is_counted_by_the_reason_found_on_most_nodes() -> None:
    status = Status(
        nodes=5,
        reasons=(
            Reason(kind="taint", nodes=1),
            Reason(kind="device-insufficient", resource="nvidia.com/gpumem", nodes=4),
        ),
    )
    pod = PodRef(namespace="ns", name="p", uid=PodUID("p"))
    why = Why.of(ev.AllocationFailed.of((pod,), status))
    assert why.reason == "device-insufficient"
    assert why.text.startswith("0/5 nodes are available")
    assert not why.unresolvable
