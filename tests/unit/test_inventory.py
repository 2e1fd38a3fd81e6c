"""Inventory sources: NVML against a recorded inventory, Ascend from npu-smi output."""

from __future__ import annotations

import threading
from pathlib import Path

from services.node_agent.ascend import AscendSource, parse_npu_smi
from services.node_agent.nvml import NvmlSource, numa_of
from shared.config import Config
from tests.unit.fake_nvml import DATA, FakeNvml


def sysfs(tmp_path: Path, numa: dict[str, str]) -> Path:
    for bus, node in numa.items():
        (tmp_path / bus).mkdir(parents=True)
        (tmp_path / bus / "numa_node").write_text(node + "\n")
    return tmp_path


def test_nvml_inventory_of_a_recorded_a100_host(tmp_path: Path) -> None:
    root = sysfs(
        tmp_path,
        {"0000:07:00.0": "0", "0000:0f:00.0": "-1", "0000:87:00.0": "1", "0000:90:00.0": "1"},
    )
    source = NvmlSource(Config(), FakeNvml.load("nvml-a100-80gb-x4.json"), sysfs=root)
    devices = source.read()
    assert [(d.index, d.model, d.memory_mib, d.sm_count, d.numa, d.mode) for d in devices] == [
        (0, "NVIDIA-A100-SXM4-80GB", 81920, 108, 0, "hami-core"),
        (1, "NVIDIA-A100-SXM4-80GB", 81920, 108, 0, "mig"),  # -1 (unknown) reads as 0
        (2, "NVIDIA-A100-SXM4-80GB", 81920, 108, 1, "hami-core"),
        (3, "NVIDIA-A100-SXM4-80GB", 81920, 108, 1, "hami-core"),
    ]
    assert devices[0].uuid == "GPU-3f1c2a9e-5b7d-4e21-9a0c-1d2e3f405161"
    # MIG instances in placement order, named by the configured geometries.
    assert [(m.profile, m.memory_mib, m.placement, m.uuid) for m in devices[1].mig_geometry] == [
        ("3g.40gb", 40192, 0, "MIG-2b9e7c1d-4f3a-5e6b-8c7d-9e0f1a2b3c44"),
        ("3g.40gb", 40192, 1, "MIG-6d0f6f4a-1c8e-5d3b-9a6f-0e4b2c8d7a11"),
    ]
    assert all(d.healthy for d in devices)
    source.close()


def test_a_critical_xid_takes_a_gpu_out_and_an_application_xid_does_not(tmp_path: Path) -> None:
    nvml = FakeNvml.load("nvml-a100-80gb-x4.json")
    source = NvmlSource(Config(), nvml, sysfs=tmp_path)
    changed = threading.Event()
    source.watch_health(changed.set)
    nvml.xids.put((0, 43))  # a user's kernel faulted: the card is fine
    nvml.xids.put((2, 79))  # fallen off the bus
    assert changed.wait(5)
    health = {d.index: d.healthy for d in source.read()}
    assert health == {0: True, 1: True, 2: False, 3: True}
    assert source.unhealthy == {"GPU-c4d5e6f7-0819-4a2b-8c3d-4e5f60718293": "XID 79"}
    source.close()
    assert not nvml.initialised


def test_numa_of_reads_sysfs_with_a_four_digit_domain(tmp_path: Path) -> None:
    root = sysfs(tmp_path, {"0000:3b:00.0": "1"})
    assert numa_of("00000000:3B:00.0", root) == 1
    assert numa_of("00000000:AF:00.0", root) == 0  # no such device: NUMA unknown


def test_npu_smi_910b3() -> None:
    chips = parse_npu_smi((DATA / "npu-smi-910b3.txt").read_text())
    assert [(c.npu, c.logic_id, c.name, c.health, c.bus_id, c.memory_mib) for c in chips] == [
        (0, 0, "910B3", "OK", "0000:C1:00.0", 65536),
        (1, 1, "910B3", "OK", "0000:C2:00.0", 65536),
        (2, 2, "910B3", "Critical", "0000:81:00.0", 65536),
        (3, 3, "910B3", "Warning", "0000:82:00.0", 65536),
    ]
    devices = AscendSource(Config(), run=lambda: (DATA / "npu-smi-910b3.txt").read_text()).read()
    assert [(d.index, d.chip, d.ai_cores, d.healthy) for d in devices] == [
        (0, "910B3", 20, True),
        (1, "910B3", 20, True),
        (2, "910B3", 20, False),  # Critical: out of new placements
        (3, "910B3", 20, True),  # Warning: still usable
    ]
    assert len({d.uuid for d in devices}) == 4


def test_npu_smi_310p_duo_cards_have_two_chips_each() -> None:
    chips = parse_npu_smi((DATA / "npu-smi-310p.txt").read_text())
    assert [(c.npu, c.chip, c.logic_id, c.name, c.memory_mib) for c in chips] == [
        (8, 0, 0, "310P3", 44280),
        (8, 1, 1, "310P3", 43693),
        (9, 0, 2, "310P3", 44280),
        (9, 1, 3, "310P3", 43693),
    ]
    devices = AscendSource(Config(), run=lambda: (DATA / "npu-smi-310p.txt").read_text()).read()
    assert [d.index for d in devices] == [0, 1, 2, 3]  # ASCEND_VISIBLE_DEVICES uses these
    assert {d.ai_cores for d in devices} == {8}
    assert len({d.uuid for d in devices}) == 4
