"""Tessera's DRA allocation core against the real structured allocator (tools/parity in
its ``-dra`` mode, v1.36.3): a fixed-seed slice of bench/parity_dra.py's random cases
must show no disagreement, and the slice must hold cases of each outcome (so a harness
or comparison that silently agreed on nothing would fail here too)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _load_bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "bench" / "parity_dra.py"
    spec = importlib.util.spec_from_file_location("bench_parity_dra", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_parity_dra"] = module
    spec.loader.exec_module(module)
    return module


parity = _load_bench()
SEED = 20260101
CASES = 300


def test_a_seeded_slice_agrees_with_the_allocator() -> None:
    if shutil.which("go") is None:
        if os.environ.get("CI"):
            pytest.fail("go is needed to build tools/parity")
        pytest.skip("go is not installed")
    binary = parity.build_harness()
    cases = [parity.generate(SEED, i) for i in range(CASES)]
    lines = "".join(json.dumps(c) + "\n" for c in cases)
    proc = subprocess.run(
        [str(binary), "-dra"], input=lines, capture_output=True, text=True, check=True
    )
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == CASES
    outcomes: Counter[str] = Counter()
    for case, kube in zip(cases, answers, strict=True):
        outcomes[kube["outcome"]] += 1
        assert parity.differences(kube, parity.tessera(case)) == [], case["id"]
    assert outcomes["fit"] >= 30
    assert outcomes["unschedulable"] >= 30
    assert outcomes["error"] >= 3
