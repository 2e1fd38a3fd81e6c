"""Traces leave the services through the standard OpenTelemetry environment alone.

The five services run as processes (tests/integration/pipeline.py) with
``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``OTEL_EXPORTER_OTLP_INSECURE`` in their
environment and ``telemetry.otlpEndpoint`` empty, and export to a real OTLP/gRPC
receiver (tests/otlp.py). One pod's scheduling attempt is one trace: the watcher's
``schedule`` span is its root, and the bus carries its context (W3C headers,
shared/bus.py) through gang-coordinator, device-allocator and binder, every span's
parent in the same trace. Each service says where its traces go in one ``traces:`` line.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.config import NatsConfig
from tests.integration.pipeline import Pipeline, pod, start_pipeline
from tests.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tools.cli import SERVICES

pytestmark = pytest.mark.integration

INVENTORY = {
    "nodes": [
        {
            "name": "trace-{i}",
            "replicas": 2,
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        }
    ]
}
PATH = ("watcher", "gang-coordinator", "device-allocator", "binder")


@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
async def pipeline(
    receiver: OtlpReceiver,
    kubeconfig: Path,
    nats_admin: NatsConfig,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Pipeline]:
    # The service processes inherit this environment (a restarted one too): only the
    # standard variables say where traces go, the config key stays empty.
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("OTEL_")]:  # the machine's own
            env.delenv(name)
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        env.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # ms: export soon, not every 5 s
        p = await start_pipeline(
            tmp_path_factory.mktemp("tracing"), kubeconfig, nats_admin, INVENTORY
        )
        yield p
        await p.close()


def _attempt(spans: list[ReceivedSpan], uid: str) -> list[ReceivedSpan] | None:
    """The trace of the pod's scheduling attempt once every service on the path has
    exported its part and each span's parent is there too; None until then."""
    for root in (s for s in spans if s.attributes.get("k8s.pod.uid") == uid):
        if root.service != "watcher" or root.parent_id:
            continue
        found = [s for s in spans if s.trace_id == root.trace_id]
        ids = {s.span_id for s in found}
        binds = [s for s in found if s.service == "binder" and s.name.startswith("bind ")]
        if (
            {s.service for s in found} >= set(PATH)
            and any(b.attributes.get("k8s.pod.uid") == uid for b in binds)
            and all(s.parent_id in ids for s in found if s is not root)
        ):
            return found
    return None


async def test_one_pod_is_one_trace_across_the_services(
    pipeline: Pipeline, receiver: OtlpReceiver, ns: str
) -> None:
    created = await pipeline.create(
        ns, pod("traced", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096})
    )
    uid = created["metadata"]["uid"]
    await pipeline.bound(ns, "traced")
    found: list[ReceivedSpan] = await receiver.wait_for(
        lambda spans: _attempt(spans, uid),
        timeout_s=30,
        what=f"the spans of {ns}/traced from {', '.join(PATH)} in one trace",
    )
    by_service = Counter(s.service for s in found)
    assert set(PATH) <= set(by_service), by_service
    names = {(s.service, s.name) for s in found}
    assert ("watcher", f"schedule {ns}/traced") in names, names
    assert any(service == "device-allocator" and n.startswith("place ") for service, n in names)
    assert all(s.resource["service.namespace"] == "tessera" for s in found)
    assert pipeline.restarts == []


async def test_each_service_says_where_its_traces_go(
    pipeline: Pipeline, receiver: OtlpReceiver
) -> None:
    for service in SERVICES:
        lines = [line for line in pipeline.log(service).splitlines() if " traces: " in line]
        assert lines == [line for line in lines if "INFO" in line], lines  # no warning
        assert len(lines) == 1, (service, lines)
        assert lines[0].endswith(
            f"traces: OTLP gRPC to 127.0.0.1:{receiver.port} (plaintext, from "
            "OTEL_EXPORTER_OTLP_ENDPOINT), sampler parentbased_traceidratio 1, "
            f"service.name {service}"
        ), lines[0]
