"""The one config: defaults match upstream names, merges are deep, bad input names the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared import config
from shared.core.spec import names


def test_defaults_accept_hami_and_volcano_names_at_once() -> None:
    nvidia = config.Config().devices.nvidia
    assert names(nvidia.resource_count_name) == ("nvidia.com/gpu", "volcano.sh/vgpu-number")
    assert "volcano.sh/vgpu-memory" in names(nvidia.resource_memory_name)
    assert "nvidia.com/gpumem" in names(nvidia.resource_memory_name)
    assert names(nvidia.resource_whole_count_name) == ("volcano.sh/gpu-number",)
    assert names(nvidia.gpu_share_memory_name) == ("volcano.sh/gpu-memory",)
    assert nvidia.device_split_count == 10
    assert nvidia.default_gpu_num == 1
    cfg = config.Config()
    assert cfg.scheduler.node_policy == "binpack"
    assert cfg.scheduler.device_policy == "spread"
    assert {c.common_word for c in cfg.devices.vnpus} >= {
        "Ascend910A",
        "Ascend910B2",
        "Ascend910B3",
        "Ascend910B4",
        "Ascend310P",
        "Ascend910C",
    }


def test_partial_file_merges_over_defaults(tmp_path: Path) -> None:
    f = tmp_path / "tessera.yaml"
    f.write_text(
        "scheduler:\n  names: [tessera, volcano]\n"
        "devices:\n  nvidia:\n    deviceSplitCount: 4\n    defaultGPUNum: 2\n"
        "nodeConfigs:\n  - name: gpu-1\n    operatingMode: mig\n"
        "    filterDevices: {uuid: [GPU-x], index: [3]}\n"
    )
    cfg = config.load(f)
    assert cfg.scheduler.names == ["tessera", "volcano"]
    assert cfg.devices.nvidia.device_split_count == 4
    assert cfg.devices.nvidia.default_gpu_num == 2
    # untouched keys of the same block keep their defaults
    assert "nvidia.com/gpu" in names(cfg.devices.nvidia.resource_count_name)
    override = cfg.node_override("gpu-1")
    assert override is not None
    assert override.operating_mode == "mig"
    assert override.filter_devices.index == [3]
    assert cfg.node_override("other") is None


def test_env_variable_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "t.yaml"
    f.write_text("nats: {url: 'nats://10.0.0.9:4222'}\n")
    monkeypatch.setenv(config.ENV_CONFIG, str(f))
    assert config.load().nats.url == "nats://10.0.0.9:4222"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"scheduler": {"nodePolicy": "fastest"}},
            ["`$.scheduler.nodePolicy`", "allowed values", "binpack", "spread"],
        ),
        (
            {"devices": {"nvidia": {"deviceSplitCount": 0}}},
            ["`$.devices.nvidia.deviceSplitCount`", ">= 1"],
        ),
        (
            {"devices": {"nvidia": {"devicesplitcount": 3}}},
            ["unknown field `devicesplitcount`", "deviceSplitCount"],
        ),
        (
            {"devices": {"nvidia": {"deviceMemoryScaling": -1}}},
            ["`$.devices.nvidia.deviceMemoryScaling`", "> 0"],
        ),
        (
            {"devices": {"nvidia": {"defaultCores": 150}}},
            ["`$.devices.nvidia.defaultCores`", "<= 100"],
        ),
        (
            {"devices": {"nvidia": {"migStrategy": "single"}}},
            ["`$.devices.nvidia.migStrategy`", "mixed", "none"],
        ),
        (
            {"nodeConfigs": [{"name": "n1", "operatingMode": "vgpu"}]},
            ["`$.nodeConfigs[0].operatingMode`", "hami-core", "mig", "mps"],
        ),
        (
            {"nodeConfigs": [{"name": "n1"}, {"name": "n1"}]},
            ["`$.nodeConfigs[1].name`", "listed twice"],
        ),
        (
            {"devices": {"amd": {"resourceCountName": "nvidia.com/gpu"}}},
            [
                "'nvidia.com/gpu'",
                "`$.devices.nvidia.resourceCountName`",
                "`$.devices.amd.resourceCountName`",
            ],
        ),
        ({"nats": {"url": 4222}}, ["`$.nats.url`", "Expected `str`"]),
        ({"telemetry": {"typo": 1}}, ["unknown field `typo`", "otlpEndpoint"]),
        ({"scheduler": {"names": []}}, ["`$.scheduler.names`", "at least one"]),
        ({"compat": {"annotations": "kueue"}}, ["`$.compat.annotations`", "hami", "volcano"]),
    ],
)
def test_bad_config_names_the_key_and_the_fix(data: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.parse(data)
    for fragment in expected:
        assert fragment in str(info.value)


def test_bad_yaml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(bad)
    with pytest.raises(config.ConfigError, match="cannot read config"):
        config.load(tmp_path / "absent.yaml")
    top = tmp_path / "list.yaml"
    top.write_text("- a\n- b\n")
    with pytest.raises(config.ConfigError, match="mapping at the top level"):
        config.load(top)


def test_hash_is_stable_and_tracks_effective_values() -> None:
    a = config.config_hash(config.Config())
    assert a == config.config_hash(config.parse({}))
    assert a == config.config_hash(config.parse({"devices": {"nvidia": {"deviceSplitCount": 10}}}))
    assert a != config.config_hash(config.parse({"devices": {"nvidia": {"deviceSplitCount": 4}}}))


def test_dump_reloads_to_the_same_config(tmp_path: Path) -> None:
    cfg = config.parse({"scheduler": {"devicePolicy": "binpack"}})
    f = tmp_path / "dumped.yaml"
    f.write_text(config.dump(cfg))
    assert config.load(f) == cfg


def test_cli_reports_a_malformed_config_and_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("devices:\n  nvidia:\n    deviceSplitCount: many\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "config", "--file", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "$.devices.nvidia.deviceSplitCount" in proc.stderr
    assert str(f) in proc.stderr


def test_a_service_refuses_to_start_on_a_malformed_config(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("scheduler:\n  nodePolicy: random\n")
    proc = subprocess.run(
        [sys.executable, "-m", "services.binder", "--config", str(f)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "$.scheduler.nodePolicy" in proc.stderr


def test_every_placement_knob_is_read_from_the_scheduler_key() -> None:
    from services.device_allocator.service import placement_config
    from shared.core.placement import PlacementConfig

    # The shipped defaults are the core's (bench/packing.py's "Tessera default").
    assert placement_config(config.Config().scheduler) == PlacementConfig()
    changed = msgspec.convert(
        {
            "nodePolicy": "fgd",
            "devicePolicy": "binpack",
            "topologyAware": True,
            "allowMoreDevicesThanCards": True,
            "memoryLargerThanCard": "clamp",
            "fgdCandidates": 3,
            "scoreWindow": 5,
            "deviceScoreWeight": 7,
            "fragmentationGuard": 0,
        },
        config.SchedulerConfig,
    )
    assert placement_config(changed) == PlacementConfig(
        node_policy="fgd",
        device_policy="binpack",
        topology_aware=True,
        allow_more_devices_than_cards=True,
        memory_larger_than_card="clamp",
        fgd_candidates=3,
        score_window=5,
        device_score_weight=7,
        fragmentation_guard=0,
    )
