"""bench/packing.py's derived variants: ``gpuspec<N>`` made from the public gpuspec10
list as that list is made from the default one (the openb trace must be present:
shared/traces/openb beside the repository, as the benchmark reads it)."""

from __future__ import annotations

import importlib.util
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def packing() -> Iterator[Any]:
    """bench/packing.py, imported from its path (bench/ first on the path, as a script)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        spec = importlib.util.spec_from_file_location("bench_packing", BENCH / "packing.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, "bench_packing", module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        if not (module.TRACE / "openb_pod_list_gpuspec10.csv").exists():
            pytest.skip("the openb trace is not beside the repository")
        yield module


def test_a_third_typed_as_gpuspec10_is(packing: Any) -> None:
    base = packing.load_tasks(packing.TRACE / "openb_pod_list_gpuspec10.csv")
    label, tasks = packing.pod_list("gpuspec33")
    assert "33 %" in label
    assert [t.name for t in tasks] == [t.name for t in base]
    gpu = [t for t in tasks if t.gpus > 0]
    assert sum(1 for t in gpu if t.spec) == round(0.33 * len(gpu))  # 2,331 of 7,064

    def shape(t: Any) -> tuple[int, bool]:
        return (t.gpus, t.gpus == 1 and t.milli < 1000)

    seen: dict[tuple[int, bool], set[str]] = defaultdict(set)
    for t in base:
        if t.spec:
            seen[shape(t)].add(t.spec)
    for old, new in zip(base, tasks, strict=True):
        assert packing.replace(new, spec=old.spec) == old  # only the spec may change
        if old.spec:
            assert new.spec == old.spec  # gpuspec10's typed tasks stay as they are
        elif new.spec:
            assert new.gpus > 0
            assert new.spec in seen[shape(new)]
    assert packing.gpuspec_tasks(33) == tasks  # one fixed list per name
    with pytest.raises(SystemExit):
        packing.gpuspec_tasks(5)  # gpuspec10 types more than that already
