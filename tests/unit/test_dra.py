"""The node agent as a DRA driver, the pure parts: the ResourceSlice an inventory makes,
the grant an allocated device stands for, and a claim's CDI spec against the device
plugin's Allocate answer for the same grant."""

from __future__ import annotations

import msgspec
import pytest

from services.node_agent.deviceplugin.allocation import to_proto
from services.node_agent.dra import cdi
from services.node_agent.dra.slices import dra_devices, grant_of, resource_slice
from services.node_agent.isolation import handout
from shared.config import Config, ConfigError, parse
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceInfo,
    DeviceUUID,
    MigInstance,
    NodeName,
    PodRef,
    PodUID,
)

NODE = NodeName("gpu-0")
H100 = DeviceInfo(
    uuid=DeviceUUID("GPU-h100"),
    index=0,
    vendor="nvidia",
    model="NVIDIA-H100-80GB-HBM3",
    memory_mib=81559,
    numa=1,
    pci_bus_id="0000:3b:00.0",
    architecture="Hopper",
    compute_capability="9.0",
    driver_version="580.65.06",
)
A100_MIG = DeviceInfo(
    uuid=DeviceUUID("GPU-a100"),
    index=1,
    vendor="nvidia",
    model="NVIDIA-A100-SXM4-40GB",
    memory_mib=40960,
    mode="mig",
    mig_geometry=(
        MigInstance(profile="3g.20gb", memory_mib=19968, placement=0, uuid="MIG-one"),
        MigInstance(profile="3g.20gb", memory_mib=19968, placement=1),  # not created yet
    ),
)
NPU = DeviceInfo(
    uuid=DeviceUUID("npu-uuid"),
    index=2,
    vendor="ascend",
    model="Ascend910B3",
    memory_mib=65536,
    chip="910B3",
    healthy=False,
)
CFG = Config()


def test_the_slice_offers_a_shared_card_mig_instances_and_an_npu_in_one_pool() -> None:
    body = resource_slice(CFG, NODE, (H100, A100_MIG, NPU), generation=3)
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["metadata"]["name"] == "gpu-0-gpu.tessera.io"
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"]) == ("gpu.tessera.io", "gpu-0")
    assert spec["pool"] == {"name": "gpu-0", "generation": 3, "resourceSliceCount": 1}
    card, mig, npu = spec["devices"]
    assert card["name"] == "gpu-0"
    assert card["allowMultipleAllocations"] is True
    assert card["attributes"] == {
        "type": {"string": "gpu"},
        "index": {"int": 0},
        "uuid": {"string": "GPU-h100"},
        "productName": {"string": "NVIDIA-H100-80GB-HBM3"},
        "numaNode": {"int": 1},
        "architecture": {"string": "Hopper"},
        "pciBusID": {"string": "0000:3b:00.0"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.65.6"},
    }
    # HAMi's DRA driver's capacity names and shapes: the whole card by default.
    assert card["capacity"] == {
        "cores": {
            "value": "100",
            "requestPolicy": {
                "default": "100",
                "validRange": {"min": "1", "max": "100", "step": "1"},
            },
        },
        "memory": {
            "value": "81559Mi",
            "requestPolicy": {
                "default": "81559Mi",
                "validRange": {"min": "1Mi", "max": "81559Mi", "step": "1Mi"},
            },
        },
    }
    # Only a running MIG instance is a device; whole, no consumable capacity.
    assert mig["name"] == "gpu-1-mig-0"
    assert "allowMultipleAllocations" not in mig
    assert mig["capacity"] == {"memory": {"value": "19968Mi"}}
    assert mig["attributes"]["uuid"] == {"string": "MIG-one"}
    assert mig["attributes"]["parentUUID"] == {"string": "GPU-a100"}
    assert mig["attributes"]["profile"] == {"string": "3g.20gb"}
    assert npu["name"] == "npu-2"
    assert npu["attributes"]["type"] == {"string": "npu"}
    assert npu["attributes"]["chip"] == {"string": "910B3"}
    assert npu["taints"] == [
        {"key": "gpu.tessera.io/unhealthy", "value": "true", "effect": "NoSchedule"}
    ]


def test_filtered_cards_and_other_driver_names_follow_the_config() -> None:
    cfg = parse(
        {
            "nodeAgent": {"dra": {"driverName": "gpu.example.com"}},
            "nodeConfigs": [{"name": "gpu-0", "filterDevices": {"index": [0]}}],
        }
    )
    body = resource_slice(cfg, NODE, (H100, NPU), generation=1)
    assert body["spec"]["driver"] == "gpu.example.com"
    assert [d["name"] for d in body["spec"]["devices"]] == ["npu-2"]


def test_a_share_a_whole_card_and_a_mig_instance_as_grants() -> None:
    card, mig, npu = dra_devices(CFG, NODE, (H100, A100_MIG, NPU))
    share = grant_of(card, {"cores": "30", "memory": "4Gi"})
    assert (share.memory_mib, share.cores, share.exclusive) == (4096, 30, False)
    # rounded up to whole MiB, as requestPolicy rounds a request up
    assert grant_of(card, {"memory": "1500000000"}).memory_mib == 1431
    for whole in (None, {}, {"cores": "100", "memory": "81559Mi"}):
        assert grant_of(card, whole).exclusive
    got = grant_of(mig, None)
    assert (got.uuid, got.mig_profile, got.mig_placement) == ("GPU-a100", "3g.20gb", 0)
    assert grant_of(npu, None).vendor == "ascend"


@pytest.mark.parametrize(
    ("grants", "inventory"),
    [
        # a 30 % / 4 GiB share: HAMi-core's limits, accounting file, library and preload
        ((DeviceGrant(uuid=H100.uuid, memory_mib=4096, cores=30),), {H100.uuid: H100}),
        # a whole card: its UUID only
        ((DeviceGrant(uuid=H100.uuid, memory_mib=81559, cores=100, exclusive=True),), {}),
        # a MIG instance: its UUID
        (
            (
                DeviceGrant(
                    uuid=A100_MIG.uuid,
                    memory_mib=19968,
                    exclusive=True,
                    mig_profile="3g.20gb",
                    mig_placement=0,
                ),
            ),
            {A100_MIG.uuid: A100_MIG},
        ),
        # an Ascend NPU: its index and device nodes
        ((DeviceGrant(uuid=NPU.uuid, index=2, vendor="ascend", exclusive=True),), {}),
        # an MPS client (the card's daemon running): pipes, shm, its limits
        (
            (DeviceGrant(uuid=H100.uuid, memory_mib=8192, cores=50),),
            {H100.uuid: msgspec.structs.replace(H100, mode="mps", mps="running")},
        ),
    ],
)
def test_the_cdi_spec_hands_what_allocate_hands_for_the_same_grant(
    grants: tuple[DeviceGrant, ...], inventory: dict[DeviceUUID, DeviceInfo]
) -> None:
    claim = PodRef(namespace="ml", name="c", uid=PodUID("claim-uid"))
    grant = ContainerGrant(container="claim", devices=grants)
    given = handout(CFG, NODE, claim, grant, inventory)
    spec = cdi.claim_spec("gpu.tessera.io", "claim-uid", given)
    assert spec["kind"] == "gpu.tessera.io/claim"
    assert spec["devices"][0]["name"] == "claim-uid"
    # The device plugin's Allocate answer and the CDI edits, message for message.
    assert to_proto(cdi.handout_of(spec)) == to_proto(given)
    edits = spec["devices"][0]["containerEdits"]
    assert sorted(edits["env"]) == sorted(f"{k}={v}" for k, v in given.envs.items())
    assert len(edits.get("mounts", [])) == len(given.mounts)
    assert cdi.device_id("gpu.tessera.io", "claim-uid") == "gpu.tessera.io/claim=claim-uid"


def test_a_node_offers_its_devices_through_one_api_never_both() -> None:
    cfg = parse(
        {
            "nodeAgent": {"deviceApi": "dra"},
            "nodeConfigs": [{"name": "old", "deviceApi": "device-plugin"}],
        }
    )
    assert (cfg.device_api("gpu-0"), cfg.device_api("old")) == ("dra", "device-plugin")
    with pytest.raises(ConfigError, match="never both"):
        parse({"nodeConfigs": [{"name": "gpu-0", "deviceApi": ["device-plugin", "dra"]}]})
    with pytest.raises(ConfigError, match="never both"):
        parse({"nodeAgent": {"deviceApi": "both"}})
