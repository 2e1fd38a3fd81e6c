"""The node's metrics endpoint, scraped over HTTP and parsed as Prometheus text."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.node_agent import metrics as m
from shared.core.model import DeviceInfo, DeviceUUID, PodRef, PodUID
from shared.health import Health
from shared.metrics import Metrics

GPU = DeviceInfo(
    uuid=DeviceUUID("GPU-aaaa"), index=0, vendor="nvidia", model="NVIDIA-A100", memory_mib=81920
)
SICK = DeviceInfo(
    uuid=DeviceUUID("GPU-bbbb"),
    index=1,
    vendor="nvidia",
    model="NVIDIA-A100",
    memory_mib=81920,
    healthy=False,
)


def region(devices: list[tuple[str, int]], procs: list[tuple[int, list[int], list[int]]]) -> bytes:
    """A HAMi-core 1.2 accounting region: (uuid, limit) per device; per process its pid,
    memory total per device and SM utilisation per device."""
    data = bytearray(m.REGION_SIZE)
    struct.pack_into("<iIIiQ32sQ", data, 0, m.MAGIC, 1, 2, 0, 4242, b"", len(devices))
    for i, (uuid, limit) in enumerate(devices):
        data[m.UUIDS_AT + i * 96 : m.UUIDS_AT + i * 96 + len(uuid)] = uuid.encode()
        struct.pack_into("<Q", data, m.LIMITS_AT + i * 8, limit)
    for slot, (pid, totals, utils) in enumerate(procs):
        base = m.PROCS_AT + slot * m.SLOT_SIZE
        struct.pack_into("<ii", data, base, pid, pid + 1000)
        for dev, (total, util) in enumerate(zip(totals, utils, strict=True)):
            struct.pack_into("<Q", data, base + m.USED_AT + dev * 64 + 32, total)
            struct.pack_into("<Q", data, base + m.UTIL_AT + dev * 48 + 16, util)
    return bytes(data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_accounting_region_is_read_and_a_foreign_one_is_refused() -> None:
    data = region([("GPU-aaaa", 10 << 30)], [(7, [1 << 30], [20]), (9, [2 << 30], [15])])
    (a,) = m.read_accounting(data) or []
    assert (a.uuid, a.limit_bytes, a.used_bytes, a.sm_util) == ("GPU-aaaa", 10 << 30, 3 << 30, 35)
    old = bytearray(data)
    struct.pack_into("<I", old, 8, 1)  # layout 1.1
    assert m.read_accounting(bytes(old)) is None
    assert m.read_accounting(b"\0" * 100) is None


async def test_metrics_are_scraped_and_parsed(tmp_path: Path) -> None:
    pod = PodRef(namespace="ml", name="infer", uid=PodUID("u-1"))
    (tmp_path / "u-1_main").mkdir()
    (tmp_path / "u-1_main" / "u-1_main.cache").write_bytes(
        region([("GPU-aaaa", 10 << 30)], [(7, [3 << 30], [40])])
    )
    (tmp_path / "u-2_side").mkdir()
    (tmp_path / "u-2_side" / "u-2_side.cache").write_bytes(b"not a region")
    node = m.NodeMetrics(
        Metrics("test"),
        "gpu-0",
        lambda: (GPU, SICK),
        lambda: {"GPU-aaaa": (5 << 30, 61.0), "GPU-bbbb": (0, 0.0)},
        tmp_path,
        lambda: {pod.uid: pod},
        lambda: 2,
    )
    node.allocations.add(3, {"resource": "nvidia.com/gpu", "result": "ok"})
    port = free_port()
    health = Health(alive=lambda: None, routes=[node.metrics.route()])
    runner = await health.serve(port, host="127.0.0.1")
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            assert response.status == 200
            text = await response.text()
    finally:
        await runner.cleanup()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        found = [
            v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()
        ]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    assert value("hami_host_gpu_memory_used_bytes", deviceuuid="GPU-aaaa", deviceidx="0") == 5 << 30
    assert value("hami_host_gpu_utilization_ratio", deviceuuid="GPU-aaaa") == 61.0
    container = {
        "podnamespace": "ml",
        "podname": "infer",
        "ctrname": "main",
        "deviceuuid": "GPU-aaaa",
    }
    assert value("hami_vgpu_memory_limit_bytes", **container) == 10 << 30
    assert value("hami_vgpu_memory_used_bytes", **container) == 3 << 30
    assert value("hami_container_device_memory_bytes", **container) == 3 << 30
    assert value("hami_container_device_utilization_ratio", **container) == 40
    assert value("tessera_node_devices", healthy="true") == 1
    assert value("tessera_node_devices", healthy="false") == 1
    assert value("tessera_admissions_waiting") == 2
    assert value("tessera_allocate_total", resource="nvidia.com/gpu", result="ok") == 3
    # The unreadable region is skipped, not misread.
    assert not [k for k in samples if ("ctrname", "side") in k[1]]
