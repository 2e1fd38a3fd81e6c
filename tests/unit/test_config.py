"""The one config: defaults match upstream names, merges are deep, bad input names the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from shared import config
from shared.core.spec import names

REPO = Path(__file__).resolve().parents[2]


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


def test_the_preemption_and_starvation_switches_are_the_profiles_postfilters() -> None:
    default = config.parse({}).scheduler
    assert (default.preempts(), default.starvation_window()) == (True, 300.0)
    off = config.parse({"scheduler": {"preemption": False, "starvationGuardS": 0}}).scheduler
    assert (off.preempts(), off.starvation_window(), off.profile().post_filters) == (False, 0, ())
    disabled = {"disabled": [{"name": "DefaultPreemption"}, {"name": "StarvationHold"}]}
    same = config.parse({"scheduler": {"plugins": {"postFilter": disabled}}}).scheduler
    assert (same.preempts(), same.starvation_window()) == (False, 0)


def test_consolidation_is_off_by_default_and_its_switch_is_the_profiles_postfilter() -> None:
    default = config.parse({}).scheduler
    assert not default.consolidates()
    assert default.consolidation.max_moves == 4
    on = config.parse({"scheduler": {"consolidation": {"enabled": True, "maxMoves": 2}}})
    assert on.scheduler.consolidates()
    assert on.scheduler.profile().post_filters[0].name == "Consolidation"
    assert on.scheduler.consolidation.max_moves == 2
    for wrong in ({"maxMoves": 0}, {"reserveS": 0}, {"maxMove": 3}):
        with pytest.raises(config.ConfigError, match="consolidation"):
            config.parse({"scheduler": {"consolidation": wrong}})


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
        (
            {"scheduler": {"plugins": {"filter": {"disabled": [{"name": "NodePortz"}]}}}},
            ["`$.scheduler.plugins`", "'NodePortz'", "no such plugin"],
        ),
        (
            {"scheduler": {"plugins": {"score": {"enabled": [{"name": "NodePorts"}]}}}},
            ["`$.scheduler.plugins`", "'NodePorts' has no score extension point"],
        ),
        (
            {
                "scheduler": {
                    "plugins": {"score": {"enabled": [{"name": "NodeAffinity", "weight": 0}]}}
                }
            },
            ["`$.scheduler.plugins.score.enabled[0].weight`", ">= 1"],
        ),
        (
            {"scheduler": {"plugins": {"score": {"disabled": [{"name": "Binpack"}]}}}},
            ["`$.scheduler.nodePolicy` is 'binpack'", "disables"],
        ),
        (
            {"scheduler": {"plugins": {"score": {"enabled": [{"name": "FGD", "weight": 3}]}}}},
            ["`$.scheduler.plugins`", "'FGD' chooses by its own measure"],
        ),
        (
            {"scheduler": {"deviceScoreWeight": 7}},
            ["unknown field `deviceScoreWeight`", "it moved", "name: Binpack, weight: 7"],
        ),
        (
            {"scheduler": {"plugins": {"filter": {"enabled": [{"name": "Spread"}]}}}},
            ["'Spread' has no filter extension point"],
        ),
        (
            {"scheduler": {"usage": {"halfLifeS": -1}}},
            ["Expected `float` >= 0.0", "$.scheduler.usage.halfLifeS"],
        ),
        (
            {"scheduler": {"usage": {"weight": -0.5}}},
            ["Expected `float` >= 0.0", "$.scheduler.usage.weight"],
        ),
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


def test_a_service_signing_or_checking_grants_needs_a_key(tmp_path: Path) -> None:
    """The binder, the device-allocator and the node agents refuse a config without
    ``security.grantKeyFile`` (naming the key and the way out), unless
    ``security.unsignedGrants`` is set; an unreadable key is refused too. The other
    services never read the key."""
    bare = config.Config()
    for service in config.GRANT_KEY_HOLDERS:
        with pytest.raises(config.ConfigError) as info:
            config.check_grant_key(bare, service)
        assert "security.grantKeyFile is not set" in str(info.value)
        assert "security.unsignedGrants: true" in str(info.value)
    for service in ("watcher", "gang-coordinator", "job-controller", "webhook"):
        config.check_grant_key(bare, service)

    unsigned = config.parse({"security": {"unsignedGrants": True}})
    key = tmp_path / "grant.key"
    key.write_text("k" * 64)
    keyed = config.parse({"security": {"grantKeyFile": str(key)}})
    gone = config.parse({"security": {"grantKeyFile": str(tmp_path / "absent.key")}})
    for service in config.GRANT_KEY_HOLDERS:
        config.check_grant_key(unsigned, service)
        config.check_grant_key(keyed, service)
        with pytest.raises(config.ConfigError, match=r"security\.grantKeyFile: cannot read"):
            config.check_grant_key(gone, service)


def test_the_key_holders_are_the_services_that_read_the_key() -> None:
    from services.binder.service import Binder
    from services.device_allocator.service import Allocator
    from services.node_agent.service import NodeAgent

    assert {Binder.NAME, Allocator.NAME, NodeAgent.NAME} == config.GRANT_KEY_HOLDERS


@pytest.mark.parametrize("service", sorted(config.GRANT_KEY_HOLDERS))
def test_a_service_refuses_to_start_without_a_grant_key(service: str, tmp_path: Path) -> None:
    """At once, before it reaches the bus (nothing listens at this URL), one line naming
    the key."""
    f = tmp_path / "tessera.yaml"
    f.write_text("nats:\n  url: nats://127.0.0.1:9\n")
    module = "services." + service.replace("-", "_")
    proc = subprocess.run(
        [sys.executable, "-m", module, "--config", str(f)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"tessera {service}: security.grantKeyFile is not set"), (
        proc.stderr
    )


def _shipped_workloads() -> list[dict[str, Any]]:
    """Every Deployment and DaemonSet in deploy/kustomize (base and overlays), unrendered."""
    docs = []
    for path in sorted((REPO / "deploy/kustomize").rglob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return [d for d in docs if d.get("kind") in ("Deployment", "DaemonSet")]


def _shipped_configs() -> dict[str, dict[str, Any]]:
    """Every tessera.yaml deploy/kustomize ships: files, and configMapGenerator literals."""
    configs = {}
    for path in sorted((REPO / "deploy/kustomize").rglob("tessera.yaml")):
        configs[str(path.relative_to(REPO))] = yaml.safe_load(path.read_text())
    for path in sorted((REPO / "deploy/kustomize").rglob("kustomization.yaml")):
        for generator in yaml.safe_load(path.read_text()).get("configMapGenerator", []):
            for literal in generator.get("literals", []):
                name, _, text = literal.partition("=")
                if name == "tessera.yaml":
                    configs[str(path.relative_to(REPO))] = yaml.safe_load(text)
    return configs


def test_the_manifests_give_the_grant_key_to_every_service_that_needs_it() -> None:
    """Each workload running a service of ``GRANT_KEY_HOLDERS`` (simulated nodes too)
    mounts the Secret tessera-grant-key, no other does, and every shipped config reads
    the key from where it is mounted: the manifests start as they are."""
    mounted_at = set()
    for workload in _shipped_workloads():
        pod = workload["spec"]["template"]["spec"]
        [container] = pod["containers"]
        args = container["args"]
        keys = {
            v["name"]
            for v in pod.get("volumes", [])
            if (v.get("secret") or {}).get("secretName") == "tessera-grant-key"
        }
        mounts = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in keys]
        runs_a_holder = args[0] in config.GRANT_KEY_HOLDERS and args[1] == "--config"
        assert bool(mounts) == runs_a_holder, workload["metadata"]["name"]
        mounted_at.update(mounts)
    assert len(mounted_at) == 1
    configs = _shipped_configs()
    assert len(configs) == 3  # base, overlays/dev (a literal), overlays/volcano-coexist
    for where, data in configs.items():
        cfg = config.parse(data)
        assert not cfg.security.unsigned_grants, where
        assert Path(cfg.security.grant_key_file).parent == Path(*mounted_at), where


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
        fragmentation_guard=0,
    )
