"""bench/fairness.py on a tiny input: both queue modes replay a small multi-tenant
workload, hold no more GPUs than there are, account for every pod, count evictions,
and in ``capacity`` mode serve a queue that asks less than its share what it asked."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.core.hosts import node_spec
from shared.core.model import DeviceInfo, DeviceUUID, NodeName

BENCH = Path(__file__).resolve().parents[2] / "bench"
HORIZON = 1800.0
STEP = 10.0


@pytest.fixture(scope="module")
def fairness() -> Iterator[Any]:
    """bench/fairness.py, imported from its path (it imports bench/packing.py as a
    script would: bench/ first on the path)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        spec = importlib.util.spec_from_file_location("bench_fairness", BENCH / "fairness.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, "bench_fairness", module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        yield module


def nodes(fairness: Any, count: int = 4, cards: int = 4) -> list[Any]:
    """``count`` nodes of ``cards`` 32 GiB cards, with cpu and memory to spare."""
    out = []
    for n in range(count):
        name = f"node-{n}"
        obj = {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
        }
        devices = [
            DeviceInfo(
                uuid=DeviceUUID(f"{name}-{i}"),
                index=i,
                vendor="nvidia",
                model="V100M32",
                memory_mib=32768,
            )
            for i in range(cards)
        ]
        out.append(fairness.Node(NodeName(name), devices, node_spec(obj)))
    return out


def offers(fairness: Any, gpus: int, seed: int = 3) -> list[Any]:
    """A tiny workload of whole cards and shares of one, run times from a small table."""
    task = fairness.Task
    tasks = [
        task("whole", 1, 1000, "", 4000, 8192),
        task("half", 1, 500, "", 2000, 4096),
        task("two", 2, 1000, "", 8000, 16384),
    ]
    durations = {"whole": 600.0, "half": 300.0, "two": 900.0}
    made, _ = fairness.workload(tasks, durations, fairness.TENANTS, gpus, 96, HORIZON, seed, STEP)
    return list(made)


@pytest.fixture(scope="module")
def runs(fairness: Any) -> dict[str, tuple[Any, list[Any]]]:
    """Both modes as the coordinator runs by default (its starvation guard on)."""
    cluster = nodes(fairness)
    gpus = sum(len(n.devices) for n in cluster)
    workload = offers(fairness, gpus)
    return {
        mode: (fairness.replay(mode, cluster, workload, fairness.TENANTS, HORIZON, STEP), workload)
        for mode in fairness.MODES
    }


def test_both_modes_hold_no_more_than_the_cluster_and_account_for_every_pod(
    runs: dict[str, tuple[Any, list[Any]]],
) -> None:
    assert set(runs) == {"proportion", "capacity", "capacity+usage"}
    for mode, (out, workload) in runs.items():
        assert out.peak <= out.gpus + 1e-9, mode
        assert sum(out.used.values()) <= out.available + 1e-6, mode
        assert 0.5 < out.allocation <= 1.0, (mode, out.allocation)
        for queue, used in out.used.items():
            # work is kept across evictions: no queue holds more than it asked
            assert 0.0 <= used <= out.asked[queue] + 1e-6, (mode, queue)
        for queue, states in out.states.items():
            mine = [o for o in workload if o.tenant == queue]
            assert sum(states.values()) == len(mine), (mode, queue, states)
            # not created at the end: only a pod evicted, awaiting its re-creation
            assert states["future"] <= out.evictions[queue], (mode, queue, states)
        done = sum(s["done"] for s in out.states.values())
        running = sum(s["running"] for s in out.states.values())
        waiting = sum(s["waiting"] for s in out.states.values())
        assert done > 0, mode
        # every pod started finished, was evicted, or still runs
        assert out.placed == done + running + sum(out.evictions.values()), mode
        # a wait is counted for every start, and for every pod still waiting
        assert sum(len(w) for w in out.waits.values()) == out.placed + waiting, mode


def test_evictions_are_counted(fairness: Any, runs: dict[str, tuple[Any, list[Any]]]) -> None:
    for mode, (out, _) in runs.items():
        assert set(out.evictions) == {t.name for t in fairness.TENANTS}, mode
        # vision floods the cluster early: the others reclaim from it as they come
        assert out.evictions["vision"] > 0, mode


def test_a_queue_asking_less_than_its_share_gets_what_it_asked_under_capacity(
    fairness: Any,
) -> None:
    # With the starvation guard on, as by default: only a gang within its queue's share
    # holds nodes (one borrowing beyond it held nodes serving could not reclaim, and
    # serving got less: shared/core/gangs.py).
    cluster = nodes(fairness)
    gpus = sum(len(n.devices) for n in cluster)
    workload = offers(fairness, gpus)
    out = fairness.replay("capacity", cluster, workload, fairness.TENANTS, HORIZON, STEP)
    # serving asks about 40 % of its deserved share: it gets about all of it
    assert out.asked["serving"] < 0.5 * 0.25 * out.available
    assert out.used["serving"] >= 0.9 * out.asked["serving"]
    assert sum(out.evictions.values()) > 0


def test_the_report_puts_both_modes_side_by_side(
    fairness: Any, runs: dict[str, tuple[Any, list[Any]]]
) -> None:
    lines = fairness.report([out for out, _ in runs.values()], fairness.TENANTS)
    text = "\n".join(lines)
    assert "got (proportion)" in text
    assert "got (capacity)" in text
    assert any(line.startswith("proportion: max relative gap") for line in lines)
    assert any(line.startswith("capacity: max relative gap") for line in lines)


def test_what_a_queue_is_owed_is_never_above_its_fair_share_and_short_is_one_sided(
    fairness: Any, runs: dict[str, tuple[Any, list[Any]]]
) -> None:
    # owed: min(deserved, what it held and waited for) at each step; either mode's fair
    # division gives at least that (weights follow deserved), so owed <= fair
    for mode, (out, _) in runs.items():
        assert set(out.owed) == {t.name for t in fairness.TENANTS}, mode
        for queue, owed in out.owed.items():
            assert 0.0 < owed <= out.fair[queue] + 1e-6, (mode, queue)
        rows = fairness.rows(out, fairness.TENANTS)
        for name, r in rows.items():
            assert r.shortfall == pytest.approx(max(0.0, r.owed - r.got) / r.owed), name
    text = "\n".join(fairness.report([out for out, _ in runs.values()], fairness.TENANTS))
    assert "short (capacity)" in text
    assert "vision - nlp" in text


def test_the_fair_share_at_a_step_follows_each_modes_policy(fairness: Any) -> None:
    wants = {"vision": 100.0, "nlp": 0.0, "serving": 1.0, "batch": 100.0}
    flat = fairness.fair_now("proportion", fairness.TENANTS, 10.0, wants)
    tree = fairness.fair_now("capacity", fairness.TENANTS, 10.0, wants)
    # flat: serving's unused share goes to vision and batch alike
    assert flat == pytest.approx({"vision": 4.5, "nlp": 0.0, "serving": 1.0, "batch": 4.5})
    # tree: half to each parent; serving's unused part of prod's half goes to batch
    assert tree == pytest.approx({"vision": 5.0, "nlp": 0.0, "serving": 1.0, "batch": 4.0})
