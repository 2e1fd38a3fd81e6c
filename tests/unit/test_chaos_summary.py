"""bench/chaos.py's verdict: a service exit the benchmark did not cause fails the run, and
each fault's recovery is printed against its target (the run itself takes many minutes:
bench/RESULTS.md)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def chaos() -> Iterator[Any]:
    """bench/chaos.py, imported from its path (it imports bench/harness.py as a script
    would: bench/ first on the path)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        spec = importlib.util.spec_from_file_location("bench_chaos", BENCH / "chaos.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, "bench_chaos", module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        yield module


def test_a_service_exit_the_benchmark_did_not_cause_fails_the_run(chaos: Any) -> None:
    killed = chaos.Exit("binder-0", 101, -9, 12.0, killed=True)
    stopped = chaos.Exit("watcher-1", 102, 0, 90.0, killed=False, at_stop=True)
    code, line = chaos.verdict(chaos.Audit(), chaos.uncaused([killed, stopped]), [])
    assert code == 0, line
    assert line.startswith("chaos: PASS: ")

    crashed = chaos.Exit("device-allocator-1", 103, 1, 30.0, killed=False)
    unexpected = chaos.uncaused([killed, crashed, stopped])
    assert unexpected == [crashed]
    code, line = chaos.verdict(chaos.Audit(), unexpected, [])
    assert code == 1
    assert line.startswith("chaos: FAIL (1 service exits we did not cause): "), line


def test_each_recovery_is_printed_against_its_target(chaos: Any) -> None:
    assert chaos.TARGET_RECOVERY_S == 5.0
    faults = [
        chaos.Fault("kill", "binder", recovery_s=2.0),
        chaos.Fault("kill", "watcher", recovery_s=1.0, stall_s=7.5),
        chaos.Fault("nats-restart", "0", leaders_s=6.0, recovery_s=9.0),
        chaos.Fault("apiserver-restart", "", recovery_note="nothing left to bind"),
    ]
    lines = chaos.recoveries(faults)
    assert lines[1:] == [
        "   1. SIGKILL active binder: 2.00s against 5s: met",
        "   2. SIGKILL active watcher: 7.50s against 5s: MISSED",
        "   3. restart nats-server-0: 3.00s against 5s: met",
        "   4. restart kube-apiserver: not measured (nothing left to bind) against 5s: MISSED",
    ]
    # Missed recoveries are counted in the verdict; they do not fail the run.
    code, line = chaos.verdict(chaos.Audit(), [], faults)
    assert code == 0
    assert line.endswith("recovery target 5s missed by 2 of 4 faults"), line
