"""bench/topology.py on a tiny fabric: both modes replay the same stream, the
topology-aware one keeps every gang one rack could hold inside one rack, and the
table has a column per mode."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def topology() -> Iterator[Any]:
    """bench/topology.py, imported from its path."""
    with pytest.MonkeyPatch.context() as patch:
        spec = importlib.util.spec_from_file_location("bench_topology", BENCH / "topology.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, "bench_topology", module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        yield module


def test_a_small_stream_keeps_gangs_in_one_rack(topology: Any) -> None:
    outcomes = topology.run(64, 60, seed=3)
    blind, aware = outcomes["topology-blind"], outcomes["topology-aware"]
    assert aware.rack_fit > 0
    assert aware.rack_kept == aware.rack_fit
    assert aware.spine_kept == aware.spine_fit
    assert blind.placed + blind.dropped == aware.placed + aware.dropped
    assert len(aware.decisions) == aware.placed
    lines = topology.report(outcomes, 64, 60)
    assert "topology-blind" in lines[1]
    assert "topology-aware" in lines[1]
    assert any(line.startswith("placed in one rack") for line in lines)
