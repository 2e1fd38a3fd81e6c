"""How the binder writes a preemptor's nominated node (services/binder/nominated.py): the
``nominated`` of an ``AllocationFailed`` (shared/core/room.py ``Made``), written before
the pod's Binding, with the API server's status patch replaced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.binder import nominated
from shared import events as ev
from shared.core.model import NodeName
from tests.unit.corekit import ref


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
