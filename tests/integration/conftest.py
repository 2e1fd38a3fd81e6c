"""Integration fixtures shared by the modules that run a pipeline of their own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared import kube
from tests.integration.pipeline import Pipeline


@pytest.fixture
async def ns(pipeline: Pipeline) -> AsyncIterator[str]:
    """A fresh namespace on the module's pipeline; its pods are deleted afterwards."""
    name = await pipeline.namespace()
    yield name
    for item in (await kube.request(pipeline.api, "GET", f"/api/v1/namespaces/{name}/pods"))[
        "items"
    ]:
        await pipeline.delete(name, item["metadata"]["name"])
