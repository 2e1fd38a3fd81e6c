"""The DRA driver against a real gRPC peer playing the kubelet, over unix sockets: the
registration service, then NodePrepareResources and NodeUnprepareResources as the
kubelet calls them. The claims come from a stand-in for the API server (a dict); the
real kubelet and API server are tests/integration/test_dra_realnode.py's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from kubernetes_asyncio.client import ApiException

from services.node_agent.dra import api_pb2 as pb
from services.node_agent.dra import cdi
from services.node_agent.dra import registration_pb2 as reg
from services.node_agent.dra.plugin import DraPlugin
from services.node_agent.dra.prepare import ClaimError
from shared.config import parse
from shared.core.model import DeviceInfo, DeviceUUID, MigInstance, NodeName
from tests.kubelet import plugin_dir

_ = plugin_dir  # the fixture (a short temp directory: a socket path has 108 bytes)
NODE = NodeName("gpu-0")
CARDS = tuple(
    DeviceInfo(
        uuid=DeviceUUID(f"GPU-{i}"),
        index=i,
        vendor="nvidia",
        model="NVIDIA-H100",
        memory_mib=81920,
    )
    for i in range(2)
)
DRA = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"


def claim(name: str, *results: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "uid": uid or f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": list(results)}}} if results else {},
    }


def result(device: str, request: str = "gpu", **kw: Any) -> dict[str, Any]:
    return {"request": request, "driver": "gpu.tessera.io", "pool": "gpu-0", "device": device, **kw}


class Claims:
    """The API server's ResourceClaims, by (namespace, name); ``reads`` counts the GETs."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(self, obj: dict[str, Any]) -> None:
        self.objects[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    async def read(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        if name == "boom":
            raise ApiException(status=500, reason="the API server broke")
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise ClaimError("it does not exist") from None


@pytest.fixture
async def driver(plugin_dir: Path) -> AsyncIterator[tuple[DraPlugin, Claims]]:
    dirs = plugin_dir
    vgpu = dirs / "vgpu"
    cfg = parse(
        {
            "nodeAgent": {
                "deviceApi": "dra",
                "dra": {
                    "pluginsDir": str(dirs / "plugins"),
                    "registryDir": str(dirs / "reg"),
                    "cdiDir": str(dirs / "cdi"),
                },
                "isolation": {"cacheHostDir": str(vgpu / "c"), "lockDir": str(vgpu / "lock")},
            }
        }
    )
    plugin = DraPlugin(cfg, NODE, None, lambda: CARDS)
    claims = Claims()
    plugin.read_claim = claims.read
    await plugin.start()
    yield plugin, claims
    await plugin.stop()


def unary(channel: grpc.aio.Channel, path: str, response: Any) -> Any:
    return channel.unary_unary(
        path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )


async def test_registers_as_a_v1_dra_plugin(driver: tuple[DraPlugin, Claims]) -> None:
    plugin, _ = driver
    async with grpc.aio.insecure_channel(f"unix://{plugin.registration}") as ch:
        info = await unary(ch, "/pluginregistration.Registration/GetInfo", reg.PluginInfo)(
            reg.InfoRequest()
        )
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            "gpu.tessera.io",
            str(plugin.endpoint),
        )
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
        assert plugin.endpoint.name == "dra.sock"
        assert plugin.registration.name == "gpu.tessera.io-reg.sock"
        notify = unary(
            ch,
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            reg.RegistrationStatusResponse,
        )
        await notify(reg.RegistrationStatus(plugin_registered=True))
    assert plugin.registered.is_set()


async def test_prepare_answers_every_claim_idempotently_and_unprepare_removes_the_spec(
    driver: tuple[DraPlugin, Claims],
) -> None:
    plugin, claims = driver
    claims.add(
        claim(
            "share",
            result("gpu-0", consumedCapacity={"cores": "30", "memory": "4Gi"}, shareID="s1"),
        )
    )
    claims.add(claim("pair", result("gpu-0", "a"), result("gpu-1", "a"), result("gpu-1", "b/x")))
    claims.add(claim("unallocated"))
    claims.add(claim("elsewhere", result("gpu-9")))
    claims.add(claim("replaced", result("gpu-0"), uid="uid-new"))
    asked = [
        pb.Claim(namespace="ml", name=n, uid=f"uid-{n}")
        for n in ("share", "missing", "pair", "unallocated", "elsewhere", "replaced", "boom")
    ]
    async with grpc.aio.insecure_channel(f"unix://{plugin.endpoint}") as ch:
        prepare = unary(ch, f"/{DRA}/NodePrepareResources", pb.NodePrepareResourcesResponse)
        unprepare = unary(ch, f"/{DRA}/NodeUnprepareResources", pb.NodeUnprepareResourcesResponse)
        got = await prepare(pb.NodePrepareResourcesRequest(claims=asked))
        # every claim answered; the failing ones each with its own reason
        assert set(got.claims) == {c.uid for c in asked}
        errors = {uid: a.error for uid, a in got.claims.items() if a.error}
        assert set(errors) == {
            "uid-missing",
            "uid-unallocated",
            "uid-elsewhere",
            "uid-replaced",
            "uid-boom",
        }
        assert "does not exist" in errors["uid-missing"]
        assert "not allocated" in errors["uid-unallocated"]
        assert "gpu-0/gpu-9 is not one this node offers" in errors["uid-elsewhere"]
        assert "replaced" in errors["uid-replaced"]
        assert errors["uid-boom"].startswith("ResourceClaim ml/boom (uid-boom): ApiException")
        share = got.claims["uid-share"].devices
        assert [(d.pool_name, d.device_name, list(d.request_names), d.share_id) for d in share] == [
            ("gpu-0", "gpu-0", ["gpu"], "s1")
        ]
        assert list(share[0].cdi_device_ids) == ["gpu.tessera.io/claim=uid-share"]
        # one CDI ID per request, on its first device (a container naming the whole claim
        # gets it once per request); a subrequest answers to its parent's name too
        pair = got.claims["uid-pair"].devices
        assert [(list(d.request_names), list(d.cdi_device_ids)) for d in pair] == [
            (["a"], ["gpu.tessera.io/claim=uid-pair"]),
            (["a"], []),
            (["b/x", "b"], ["gpu.tessera.io/claim=uid-pair"]),
        ]
        spec = json.loads(plugin.spec_of("uid-share").read_text())
        env = cdi.handout_of(spec).envs
        assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-0"
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
        assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
        # two whole cards and a second look at one of them: the cards in result order
        pair_env = cdi.handout_of(json.loads(plugin.spec_of("uid-pair").read_text())).envs
        assert pair_env == {"NVIDIA_VISIBLE_DEVICES": "GPU-0,GPU-1,GPU-1"}
        # again: the same answer, from the spec file, without reading the API server
        reads = claims.reads
        again = await prepare(pb.NodePrepareResourcesRequest(claims=[asked[0], asked[2]]))
        assert claims.reads == reads
        assert again.claims["uid-share"] == got.claims["uid-share"]
        assert again.claims["uid-pair"] == got.claims["uid-pair"]
        # unprepare, twice: the spec is gone, both answers clean
        for _ in range(2):
            done = await unprepare(pb.NodeUnprepareResourcesRequest(claims=[asked[0], asked[1]]))
            assert {uid: a.error for uid, a in done.claims.items()} == {
                "uid-share": "",
                "uid-missing": "",
            }
        assert not plugin.spec_of("uid-share").exists()
        assert plugin.spec_of("uid-pair").exists()


async def test_a_claim_mixing_mig_and_cards_is_refused(driver: tuple[DraPlugin, Claims]) -> None:
    plugin, claims = driver
    mig_card = DeviceInfo(
        uuid=DeviceUUID("GPU-m"),
        index=1,
        vendor="nvidia",
        model="NVIDIA-A100",
        memory_mib=40960,
        mode="mig",
        mig_geometry=(MigInstance(profile="7g.40gb", memory_mib=40192, placement=0, uuid="MIG-x"),),
    )
    plugin.devices = lambda: (CARDS[0], mig_card)
    claims.add(claim("mixed", result("gpu-0"), result("gpu-1-mig-0")))
    claims.add(claim("mig", result("gpu-1-mig-0")))
    answer = await plugin.node_prepare_resources(
        pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace="ml", name=n, uid=f"uid-{n}") for n in ("mixed", "mig")]
        ),
        None,
    )
    assert "MIG instances and cards together" in answer.claims["uid-mixed"].error
    assert answer.claims["uid-mig"].error == ""
    spec = json.loads(plugin.spec_of("uid-mig").read_text())
    assert cdi.handout_of(spec).envs == {"NVIDIA_VISIBLE_DEVICES": "MIG-x"}
