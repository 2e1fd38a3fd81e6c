"""The watcher's kept pod specs (services/watcher/service.py ``Watcher._spec``): the same
PodSpec as reading the pod afresh after any change, and no fresh read for a binding or
a status update."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from services.watcher import service as watcher
from shared.core.hosts import pod_spec
from shared.core.model import PodUID
from tests.unit.corekit import MANAGED

BASE: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "p", "uid": "u1", "labels": {"app": "a"}},
    "spec": {
        "schedulerName": "tessera",
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        "nodeSelector": {"pool": "a"},
    },
    "status": {"phase": "Pending"},
}


def _bind(pod: dict[str, Any]) -> None:
    pod["spec"]["nodeName"] = "n1"


def _status(pod: dict[str, Any]) -> None:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"]["tier"] = "web"


def _toleration(pod: dict[str, Any]) -> None:
    pod["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]


def _resize(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"


def _delete(pod: dict[str, Any]) -> None:
    pod["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"


CHANGES = {
    "bind": _bind,
    "status": _status,
    "label": _label,
    "toleration": _toleration,
    "resize": _resize,
    "delete": _delete,
}
READ_AGAIN = {"label", "toleration", "resize", "delete"}
"""The changes to what ``pod_spec`` reads (a binding is ``nodeName`` alone)."""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(CHANGES)), max_size=8))
def test_a_kept_spec_is_the_spec_read_afresh_and_only_reads_again_on_a_change(
    changes: list[str],
) -> None:
    reads: list[int] = []

    def counted(obj: Any, managed: Any = ()) -> Any:
        reads.append(1)
        return pod_spec(obj, managed)

    with mock.patch.object(watcher, "pod_spec", counted):
        _replay(changes, reads)


def _replay(changes: list[str], reads: list[int]) -> None:
    fake = SimpleNamespace(specs={}, shapes={}, managed=MANAGED)
    pod = copy.deepcopy(BASE)
    uid = PodUID("u1")
    assert watcher.Watcher._spec(fake, uid, pod) == pod_spec(pod, MANAGED)  # type: ignore[arg-type]
    for change in changes:
        before = len(reads)
        pod = copy.deepcopy(pod)  # each watch event is a new object
        CHANGES[change](pod)
        got = watcher.Watcher._spec(fake, uid, pod)  # type: ignore[arg-type]
        assert got == pod_spec(pod, MANAGED)
        fresh = len(reads) - before
        if change not in READ_AGAIN:
            assert fresh == 0, change
