"""Each service runs as its own process, answers pings with its config hash, stops cleanly;
and one scheduling attempt is one trace across watcher, coordinator, allocator, binder."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nats
import nats.errors
import nats.js.errors
import pytest
import yaml
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.binder.service import Binder
from services.device_allocator.service import Allocator
from services.gang_coordinator.service import Coordinator
from services.watcher.service import Watcher
from shared import events as ev
from shared.bus import connect
from shared.config import NatsConfig, config_hash, load
from shared.runtime import run_service
from shared.telemetry import setup_tracing
from tests.helpers import eventually, readyz
from tests.integration.pipeline import Pipeline, pod, reset_stream, start_pipeline
from tools.cli import SERVICES, _ping
from tools.localcluster import free_port, service_settings

pytestmark = pytest.mark.integration


def write_config(tmp_path: Path, nats_admin: NatsConfig, kubeconfig: Path) -> Path:
    cfg = tmp_path / "tessera.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "nats": service_settings(nats_admin),
                "kubernetes": {"kubeconfig": str(kubeconfig)},
                "scheduler": {"leaderLeaseS": 3.0},
                "security": {"unsignedGrants": True},  # a throwaway cluster: no grant key
            }
        )
    )
    return cfg


@pytest.mark.parametrize("service", list(SERVICES))
async def test_service_process_answers_ping_and_stops_on_sigterm(
    service: str, nats_admin: NatsConfig, kubeconfig: Path, tmp_path: Path
) -> None:
    await reset_stream(nats_admin)
    cfg = write_config(tmp_path, nats_admin, kubeconfig)
    port = free_port()
    args = [sys.executable, "-m", SERVICES[service], "--config", str(cfg), f"--http-port={port}"]
    if service == "node-agent":
        empty = tmp_path / "inventory.yaml"
        empty.write_text("nodes: []\n")
        args += ["--simulate", str(empty)]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        hellos: list[dict[str, object]] = []
        async with asyncio.timeout(30):
            while not hellos:
                hellos = [h for h in await _ping(nats_admin, 0.5) if h["service"] == service]
        assert hellos[0]["config_hash"] == config_hash(load(cfg))
        # Ready once active: connected to NATS and the API server, its consumer caught up.
        ready = await eventually(lambda: readyz(port), what=f"{service} ready")
        checks = {"[+]nats ok", "[+]role ok", "[+]kube-apiserver ok"}
        if service not in ("watcher", "node-agent"):  # they consume nothing (a simulator)
            checks.add("[+]consumer ok")
        assert checks <= set(ready.splitlines()), ready
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as answer,
        ):
            assert answer.status == 200, await answer.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    assert f"{service} stopped" in out.decode()


@pytest.fixture
async def traced(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path: Path
) -> AsyncIterator[tuple[InMemorySpanExporter, Pipeline]]:
    """Four services in this process (sharing one in-memory span exporter) and a
    simulated node agent beside them."""
    memory = InMemorySpanExporter()
    setup_tracing("tests", load().telemetry, processor=SimpleSpanProcessor(memory))
    p = await start_pipeline(
        tmp_path,
        kubeconfig,
        nats_admin,
        {
            "nodes": [
                {
                    "name": "tr-a100",
                    "devices": [
                        {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920}
                    ],
                },
            ]
        },
    )
    for service in ("watcher", "gang-coordinator", "device-allocator", "binder"):
        await p.stop(service)
    cfg = load(p.config)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(run_service(service, cfg, stop=stop), name=f"in-proc:{service.NAME}")
        for service in (Watcher, Coordinator, Allocator, Binder)
    ]
    try:

        async def all_alive() -> bool:
            return await p.alive() >= set(SERVICES)

        await eventually(all_alive, what="the in-process services answering pings")
        yield memory, p
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await p.close()


async def test_one_trace_spans_the_four_services_for_one_pod(
    traced: tuple[InMemorySpanExporter, Pipeline],
) -> None:
    memory, p = traced
    ns = await p.namespace()
    created = await p.create(ns, pod("traced", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}))
    await p.bound(ns, "traced")
    uid = created["metadata"]["uid"]

    def trace_of_pod() -> set[str] | None:
        spans = memory.get_finished_spans()
        roots = [
            s
            for s in spans
            if (s.attributes or {}).get("k8s.pod.uid") == uid and s.name.startswith("schedule ")
        ]
        if not roots or roots[0].context is None:
            return None
        trace_id = roots[0].context.trace_id
        return {
            str((s.attributes or {}).get("tessera.service"))
            for s in spans
            if s.context is not None and s.context.trace_id == trace_id
        }

    wanted = {"watcher", "gang-coordinator", "device-allocator", "binder"}

    async def spans_of_all_four() -> bool:
        found = trace_of_pod()
        return found is not None and found >= wanted

    await eventually(spans_of_all_four, timeout_s=10, what="one trace with all four services")
    bind = [
        s
        for s in memory.get_finished_spans()
        if s.name.startswith("bind ") and (s.attributes or {}).get("k8s.pod.uid") == uid
    ]
    assert bind[0].attributes is not None
    assert bind[0].attributes["k8s.node.name"] == "tr-a100"
    assert bind[0].attributes["tessera.devices"]
    await p.delete(ns, "traced")


async def test_a_resync_reaches_a_consumer_that_missed_the_first_announcement(
    nats_admin: NatsConfig, kubeconfig: Path, tmp_path: Path
) -> None:
    """Regression: a re-announced Queue kept its first event id, so JetStream dropped it
    as a duplicate and a coordinator that started after the watcher never learned the
    ``default`` Queue (its pods waited, told the queue did not exist)."""
    await reset_stream(nats_admin)
    cfg = write_config(tmp_path, nats_admin, kubeconfig)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", SERVICES["watcher"], "--config", str(cfg), "--http-port=0"
    )
    nc = await connect(nats_admin, "admin")
    try:
        js = nc.jetstream()

        async def default_queues() -> int:
            try:
                sub = await js.pull_subscribe("tessera.v1.queue.updated", stream="TESSERA")
            except nats.js.errors.NotFoundError:
                return 0  # the stream is not there yet
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except nats.errors.TimeoutError:
                return 0
            finally:
                await sub.unsubscribe()
            return sum(b'"name":"default"' in m.data for m in msgs)

        await eventually(default_queues, timeout_s=30, what="the default Queue announced")
        first = await default_queues()
        await nc.request(ev.CONTROL_RESYNC_SUBJECT, b"", timeout=5)

        async def announced_again() -> bool:
            # The watcher's outbox publishes after answering: wait for it, not a moment.
            return await default_queues() == first + 1

        await eventually(announced_again, timeout_s=10, what="the default Queue announced again")
        assert await default_queues() == first + 1
    finally:
        await nc.close()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.wait()
