"""What a node registers with its kubelet and advertises (services/node_agent/resources.py):
every registered resource's capacity is the device IDs its plugin lists, so the kubelet's
own count agrees with what the allocator places."""

from __future__ import annotations

from services.node_agent.resources import capacity, count_resources
from shared.config import parse as parse_config
from tests.unit.corekit import gpu, npu


def test_gpu_share_and_npu_core_are_registered_one_id_per_unit() -> None:
    cfg = parse_config(
        {
            "devices": {"nvidia": {"gpuMemoryFactor": 16, "deviceMemoryScaling": 1.5}},
            "nodeConfigs": [
                {"name": "n", "deviceMemoryScaling": 2.0, "filterDevices": {"index": [2]}}
            ],
        }
    )
    devices = (
        gpu(0, memory=81920),
        gpu(1, memory=40960),
        gpu(2, memory=40960),  # filtered: never offered
        npu(0, chip="310P3", memory=21527),
        npu(1, chip="910B3"),
    )
    by_name = {r.name: r for r in count_resources(cfg, "n", devices)}
    share = by_name["volcano.sh/gpu-memory"]
    # the card's memory as the ledger counts it (the node's scaling), in 16 MiB units
    assert [n for _, n in share.devices] == [81920 * 2 // 16, 40960 * 2 // 16]
    assert (share.units, share.channel) == (True, "gpu-share")
    cores = by_name["huawei.com/npu-core"]
    assert ([d.chip for d, _ in cores.devices], [n for _, n in cores.devices]) == (["310P3"], [8])
    assert cores.channel == "npu-core"
    assert by_name["nvidia.com/gpu"].channel == "nvidia"
    assert not by_name["nvidia.com/gpu"].units
    # What the Node advertises of each registered name is what its IDs add up to.
    advertised = capacity(cfg, "n", devices)
    for r in by_name.values():
        assert advertised[r.name] == str(sum(n for _, n in r.devices)), r.name
    assert advertised["volcano.sh/gpu-memory"] == str((81920 + 40960) * 2 // 16)
    assert advertised["huawei.com/npu-core"] == "8"
    # Turned off, gpu-share is neither registered nor advertised.
    off = parse_config({"devices": {"nvidia": {"gpuShareMemoryName": ""}}})
    assert "volcano.sh/gpu-memory" not in capacity(off, "n", devices)
    assert "volcano.sh/gpu-memory" not in {r.name for r in count_resources(off, "n", devices)}
