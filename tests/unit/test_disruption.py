"""PodDisruptionBudgets as preemption reads them (shared/core/disruption.py): what each
allows, from its status when current, otherwise computed from its spec as the
disruption controller does; which victims it covers; and the counts kept as pods
change."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.watcher.budgets import BudgetWatch
from shared import events as ev
from shared.core.disruption import (
    Budget,
    Budgets,
    BudgetSpec,
    Counted,
    allowed,
    counted,
    read_budget,
    scaled,
)
from shared.core.hosts import label_selector
from shared.core.model import PodUID

APP = {"matchLabels": {"app": "web"}}


def pdb(
    spec: dict[str, Any],
    status: dict[str, Any] | None = None,
    generation: int = 1,
    selector: dict[str, Any] | None = APP,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "web", "generation": generation},
        "spec": {**spec, "selector": selector} if selector is not None else spec,
    }
    if status is not None:
        body["status"] = status
    return body


def pod(
    name: str,
    *,
    ready: bool = True,
    labels: dict[str, str] | None = None,
    managed: bool = True,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"u-{name}"}
    meta["labels"] = {"app": "web"} if labels is None else labels
    if managed:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web", "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"conditions": [condition]}}


@pytest.mark.parametrize(
    ("spec", "pods", "managed", "healthy", "expected"),
    [
        ({"minAvailable": 2}, 3, 3, 3, 1),  # a number: healthy - minAvailable
        ({"minAvailable": 2}, 3, 0, 3, 1),  # counted against every pod, bare ones too
        ({"minAvailable": 3}, 3, 3, 2, 0),  # never below zero
        ({"minAvailable": "50%"}, 4, 3, 3, 1),  # of the controlled pods, rounded up: 2
        ({"minAvailable": "50%"}, 4, 0, 4, 0),  # no controlled pod: nothing is expected
        ({"maxUnavailable": 1}, 3, 3, 3, 1),
        ({"maxUnavailable": 1}, 3, 3, 2, 0),  # one is down already
        ({"maxUnavailable": "34%"}, 3, 3, 3, 2),  # 34% of 3 rounds up to 2
        ({"maxUnavailable": 1}, 2, 0, 2, 0),  # bare pods only: the controller allows none
        ({}, 3, 3, 3, 0),  # neither: nothing expected, nothing allowed
        ({"minAvailable": "half"}, 3, 3, 3, 0),  # not a percentage: cannot be computed
        ({"minAvailable": 0}, 0, 0, 0, 0),  # no pod at all
    ],
)
def test_allowed_is_the_disruption_controllers_arithmetic(
    spec: dict[str, Any], pods: int, managed: int, healthy: int, expected: int
) -> None:
    assert allowed(read_budget(pdb(spec)), pods, managed, healthy) == expected


def test_a_current_status_wins_and_a_stale_one_is_recomputed() -> None:
    status = {"observedGeneration": 2, "disruptionsAllowed": 5, "disruptedPods": {"w-1": "t"}}
    current = read_budget(pdb({"minAvailable": 1}, status, generation=2))
    assert current.status_allowed == 5
    assert allowed(current, 1, 1, 1) == 5
    assert current.disrupted == ("w-1",)
    stale = read_budget(pdb({"minAvailable": 1}, status, generation=3))
    assert stale.status_allowed is None
    assert allowed(stale, 3, 3, 3) == 2
    fresh = read_budget(pdb({"minAvailable": 1}, {"disruptionsAllowed": 0}))  # no controller
    assert fresh.status_allowed is None


def test_scaled_rounds_a_percentage_up() -> None:
    assert scaled("10%", 3) == 1
    assert scaled("100%", 7) == 7
    assert scaled(4, 100) == 4
    assert scaled("10", 3) is None


def test_covers_is_kube_schedulers_rule() -> None:
    budget = Budget(namespace="ns", name="web", selector=label_selector(APP), disrupted=("w-0",))
    assert budget.covers("ns", "w-1", {"app": "web", "tier": "x"})
    assert not budget.covers("other", "w-1", {"app": "web"})  # its namespace only
    assert not budget.covers("ns", "w-1", {})  # a pod without labels matches no PDB
    assert not budget.covers("ns", "w-1", {"app": "db"})
    assert not budget.covers("ns", "w-0", {"app": "web"})  # counted already
    everything = Budget(namespace="ns", name="all", selector=label_selector({}))
    assert not everything.covers("ns", "w-1", {"app": "web"})  # empty selector: nothing
    nil = Budget(namespace="ns", name="nil", selector=label_selector(None))
    assert not nil.covers("ns", "w-1", {"app": "web"})


def test_a_pod_is_counted_as_ready_controlled_and_being_deleted() -> None:
    assert counted(pod("a")) == Counted(name="a", labels={"app": "web"}, ready=True, managed=True)
    gone = counted(pod("b", ready=False, managed=False, deleting=True))
    assert (gone.ready, gone.managed, gone.deleting) == (False, False, True)


def test_budgets_follow_readiness_deletion_and_relists() -> None:
    b = Budgets()
    b.set_pod("ns", PodUID("u-a"), counted(pod("a")))
    b.set_pod("ns", PodUID("u-b"), counted(pod("b", ready=False)))
    first = b.set_budget(read_budget(pdb({"minAvailable": 1})))
    assert first is not None
    assert (first.allowed, first.computed) == (0, True)  # one healthy, one must stay
    [ready] = b.set_pod("ns", PodUID("u-b"), counted(pod("b")))
    assert ready.allowed == 1
    assert b.set_pod("ns", PodUID("u-b"), counted(pod("b"))) == []  # nothing changed
    assert b.set_pod("other", PodUID("u-x"), counted(pod("x"))) == []  # no budget there
    [deleting] = b.set_pod("ns", PodUID("u-a"), counted(pod("a", deleting=True)))
    assert deleting.allowed == 0
    assert b.keep_only([PodUID("u-b")]) == []  # a's going did not change what is allowed
    assert b.remove_budget("ns", "web")
    assert not b.remove_budget("ns", "web")


def test_a_current_status_needs_no_pod() -> None:
    b = Budgets()
    status = {"observedGeneration": 1, "disruptionsAllowed": 3}
    budget = b.set_budget(read_budget(pdb({"minAvailable": 1}, status)))
    assert budget is not None
    assert (budget.allowed, budget.computed) == (3, False)


PODS = st.lists(
    st.tuples(
        st.integers(0, 5),  # which pod
        st.booleans(),  # ready
        st.sampled_from(["web", "db", ""]),  # app label
        st.booleans(),  # managed
        st.booleans(),  # gone
    ),
    max_size=30,
)


@given(changes=PODS, spec=st.sampled_from([{"minAvailable": 1}, {"maxUnavailable": "50%"}]))
def test_the_kept_counts_are_a_recount_of_the_pods(
    changes: list[tuple[int, bool, str, bool, bool]], spec: dict[str, Any]
) -> None:
    b = Budgets()
    b.set_budget(read_budget(pdb(spec)))
    live: dict[int, dict[str, Any]] = {}
    for i, ready, app, managed, gone in changes:
        obj = pod(f"p{i}", ready=ready, labels={"app": app} if app else {}, managed=managed)
        b.set_pod("ns", PodUID(f"u-p{i}"), None if gone else counted(obj))
        if gone:
            live.pop(i, None)
        else:
            live[i] = obj
    matched = [counted(o) for o in live.values() if o["metadata"]["labels"].get("app") == "web"]
    recount = allowed(
        BudgetSpec(namespace="ns", name="web", selector=label_selector(APP), **_limits(spec)),
        len(matched),
        sum(p.managed for p in matched),
        sum(p.ready for p in matched),
    )
    assert b.current[("ns", "web")].allowed == recount


def _limits(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "min_available": spec.get("minAvailable"),
        "max_unavailable": spec.get("maxUnavailable"),
    }


async def test_the_watcher_publishes_each_budget_as_pods_and_budgets_change() -> None:
    published: list[ev.Event] = []

    async def publish(event: ev.Event) -> None:
        published.append(event)

    watch = BudgetWatch(publish)
    await watch.on_pod("ADDED", pod("a"))
    await watch.on_relist([pdb({"maxUnavailable": 1})])
    [first] = published
    assert isinstance(first, ev.PdbUpdated)
    assert first.budget.allowed == 1  # one controlled, Ready pod; one may go
    await watch.on_pod("MODIFIED", {**pod("a"), "status": {"phase": "Succeeded"}})
    assert published[-1].budget.allowed == 0  # type: ignore[attr-defined]
    await watch.on_pod("ADDED", {"metadata": {}})  # unreadable: not counted, never raised
    await watch.on_event("ADDED", {"metadata": {"name": "broken"}})  # logged and skipped
    assert [type(e) for e in watch.known()] == [ev.PdbUpdated]
    await watch.on_relist([])  # gone while the watch was down
    gone = published[-1]
    assert isinstance(gone, ev.PdbDeleted)
    assert (gone.namespace, gone.name) == ("ns", "web")
    assert watch.known() == []
