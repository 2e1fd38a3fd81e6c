"""Integration fixtures shared by the modules that run a pipeline of their own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared import kube
from tests.integration.pipeline import Pipeline, claims_released


@pytest.fixture
async def ns(pipeline: Pipeline) -> AsyncIterator[str]:
    """A fresh namespace on the module's pipeline; its pods are deleted afterwards."""
    name = await pipeline.namespace()
    yield name
    for item in (await kube.request(pipeline.api, "GET", f"/api/v1/namespaces/{name}/pods"))[
        "items"
    ]:
        await pipeline.delete(name, item["metadata"]["name"])


@pytest.fixture
async def released_claims(pipeline: Pipeline, ns: str) -> AsyncIterator[None]:
    """Each test's pods and ResourceClaims go after it, the claims deallocated and
    deleted by kube-controller-manager: their devices are free for the next test (the DRA
    modules use it: ``pytest.mark.usefixtures("released_claims")``)."""
    yield
    await claims_released(pipeline, ns)
