"""The fragmentation guard a gang is placed with: chosen from the load it meets
(shared/core/pace.py), and given to the placer per call (``Placer.place_gang``)."""

from __future__ import annotations

from typing import Any

from shared.core.hosts import pod_spec
from shared.core.model import PodRequest
from shared.core.pace import NARROW_GUARD, OPEN_BEHIND, fragmentation_guard
from shared.core.placement import GangMember, Placer
from shared.core.policy import Shape, Workload
from tests.unit.corekit import MANAGED, PARSER, gpus, ref
from tests.unit.test_policy import cluster, pinned, share

NOW = 1_000_000.0
GUARD = 16


def guard(
    *, late_s: float = 0.0, age_s: float | None = None, attempt: int = 1, open_binds: int = 0
) -> int:
    """The guard for a gang sent ``late_s`` ago whose newest pod is ``age_s`` old."""
    return fragmentation_guard(
        GUARD,
        now=NOW,
        emitted_at=NOW - late_s,
        attempt=attempt,
        newest_created=0.0 if age_s is None else NOW - age_s,
        open_binds=open_binds,
    )


def test_behind_a_burst_the_allocator_weighs_fewer_nodes_per_pod() -> None:
    assert guard() == GUARD
    assert guard(late_s=3.0) == NARROW_GUARD  # waited in the stream
    assert guard(late_s=0.1) == GUARD  # caught up
    assert guard(age_s=10.0) == NARROW_GUARD  # queued upstream of the allocator
    assert guard(age_s=0.5) == GUARD
    assert guard(age_s=60.0, attempt=3) == GUARD  # a retried pod is old, not late
    assert guard(open_binds=OPEN_BEHIND + 1) == NARROW_GUARD  # the binder is behind
    assert guard(open_binds=OPEN_BEHIND) == GUARD
    assert (
        fragmentation_guard(0, now=NOW, emitted_at=NOW, attempt=1, newest_created=0.0, open_binds=0)
        == 0
    )


def member(cpu: str, limits: dict[str, Any]) -> GangMember:
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": cpu}, "limits": limits}}
            ]
        },
    }
    request = PARSER.parse(obj)
    assert isinstance(request, PodRequest), request
    return GangMember(pod=ref(), request=request, spec=pod_spec(obj, managed=MANAGED))


def test_the_guard_given_to_a_placement_overrides_the_configured_one_for_that_call() -> None:
    # As in test_policy.py: weighed, a 40 % pod goes where its rest stays usable
    # ("roomy"); binpack's first fit (no window) takes "tight".
    workload = Workload.of([(Shape(1, 0.4), 1.0)])

    def chosen(**kw: Any) -> str:
        pl = Placer(cluster({"tight": ("64", gpus(1)), "roomy": ("64", gpus(1))}), None, workload)
        pinned(pl, "1", share(50), "tight")
        pinned(pl, "1", share(20), "roomy")
        result = pl.place_gang([member("1", share(40))], 1, **kw)
        assert result.ok, result.status
        assert pl.config.fragmentation_guard == GUARD  # the config is left as it was
        return result.placed[0].node

    assert chosen() == "roomy"
    assert chosen(fragmentation_guard=NARROW_GUARD) == "tight"
    assert chosen(fragmentation_guard=GUARD) == "roomy"
