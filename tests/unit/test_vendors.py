"""Every vendor as HAMi's own device code reads it (docs/compat.md, section 1's tables).

Each test names the HAMi file it follows (``pkg/device/<vendor>/`` at the commit
../shared/UPSTREAM.md records) and says, in our words, what that code does: resource
units and scaling, defaults, the type and UUID annotations it reads, the exclusive-card
rule, and the annotations its scheduler writes on the pod at bind.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from services.node_agent.resources import capacity
from services.node_agent.simulate import Inventory, expand
from shared.config import ConfigError
from shared.config import parse as parse_config
from shared.core import annotations as ann
from shared.core.model import (
    ContainerGrant,
    DeviceGrant,
    DeviceInfo,
    DeviceRequest,
    DeviceUUID,
    NodeName,
    PodRequest,
    RequestError,
    Vendor,
)
from shared.core.placement import Failure, Placement, Placer
from shared.core.request import RequestParser
from tests.unit.corekit import (
    PARSER,
    gpu,
    gpus,
    ledger,
    npu,
    place,
    placer,
    pod_json,
    ref,
    request,
)

NODE = NodeName("n1")
NOW = 1700000000.0


def only(limits: dict[str, Any], **kw: Any) -> DeviceRequest:
    [c] = request(limits, **kw).containers
    [d] = c.devices
    return d


def errors(limits: dict[str, Any]) -> list[RequestError]:
    parsed = PARSER.parse(pod_json(limits))
    assert isinstance(parsed, tuple), parsed
    return list(parsed)


def card(vendor: Vendor, index: int = 0, model: str = "", memory: int = 32768) -> DeviceInfo:
    return gpu(
        index,
        vendor=vendor,
        model=model or f"{vendor}-card",
        memory=memory,
        uuid=f"{vendor}-{index}",
    )


def chosen(devices: list[DeviceInfo], limits: dict[str, Any], **kw: Any) -> DeviceGrant:
    """The first device a pod asking ``limits`` gets on a fresh node of ``devices``."""
    return grants(place(placer({"n": devices}), limits, **kw))[0]


def grants(p: Placement) -> list[DeviceGrant]:
    return [g for c in p.grants for g in c.devices]


def fail(pl: Placer, limits: dict[str, Any], **kw: Any) -> Failure:
    result = pl.place(ref(), request(limits, **kw), None)
    assert isinstance(result, Failure), result
    return result


def bound(*devices: DeviceGrant, containers: int = 1) -> dict[str, str]:
    """The annotations a pod bound with ``devices`` (in its last container) gets."""
    found = [ContainerGrant(container=f"c{i}") for i in range(containers - 1)]
    found.append(ContainerGrant(container="main", devices=devices))
    return ann.grant_annotations(NODE, found, NOW, "hami")


def dev(vendor: Vendor, index: int = 0, **kw: Any) -> DeviceGrant:
    return DeviceGrant(uuid=DeviceUUID(f"{vendor}-{index}"), index=index, vendor=vendor, **kw)


# --- Cambricon ---------------------------------------------------------------------------


def test_cambricon_memory_counts_256_mib_and_cores_default_to_a_whole_card() -> None:
    """HAMi pkg/device/cambricon/device.go: a vmemory unit is 256 MiB (MemoryFactor), and
    without a vcore limit the request books 100 cores, which keeps the card to itself."""
    d = only({"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 8})
    assert (d.memory_mib, d.cores, d.exclusive) == (2048, 100, True)
    shared = only(
        {
            "cambricon.com/vmlu": 1,
            "cambricon.com/mlu.smlu.vmemory": 8,
            "cambricon.com/mlu.smlu.vcore": 30,
        }
    )
    assert (shared.memory_mib, shared.cores, shared.exclusive) == (2048, 30, False)


def test_cambricon_mlutype_and_uuid_annotations_pick_the_card() -> None:
    """HAMi pkg/device/cambricon/device.go declares cambricon.com/use-mlutype (its Fit does
    not read it; Tessera does) and reads cambricon.com/use-gpuuuid / nouse-gpuuuid."""
    devs = [card("cambricon", 0, "MLU370-X8"), card("cambricon", 1, "MLU590")]
    limits = {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vcore": 10}
    typed = chosen(devs, limits, annotations={"cambricon.com/use-mlutype": "mlu590"})
    assert typed.model == "MLU590"
    excluded = chosen(devs, limits, annotations={"cambricon.com/nouse-gpuuuid": "cambricon-1"})
    assert excluded.index == 0
    refused = fail(placer({"n": devs}), limits, annotations={"cambricon.com/use-mlutype": "MLU220"})
    assert "gpu type excluded" in refused.message


def test_cambricon_bind_annotations() -> None:
    """HAMi pkg/device/cambricon/device.go PatchAnnotations: the device list under
    hami.io/cambricon-mlu-devices-to-allocate and -allocated (type MLU),
    CAMBRICON_DSMLU_ASSIGNED=false and CAMBRICON_DSMLU_PROFILE=<index>_<cores>_<mem/256>
    of the first device."""
    out = bound(dev("cambricon", 2, model="MLU370", memory_mib=2048, cores=30))
    assert out["hami.io/cambricon-mlu-devices-to-allocate"] == "cambricon-2,MLU,2048,30:;"
    assert out["hami.io/cambricon-mlu-devices-allocated"] == "cambricon-2,MLU,2048,30:;"
    assert out["CAMBRICON_DSMLU_ASSIGNED"] == "false"
    assert out["CAMBRICON_DSMLU_PROFILE"] == "2_30_8"
    assert "hami.io/vgpu-devices-to-allocate" not in out  # NVIDIA's key holds NVIDIA's


# --- Hygon -------------------------------------------------------------------------------


def test_hygon_cores_default_to_100_and_dcutype_selects_the_model() -> None:
    """HAMi pkg/device/hygon/device.go: corenum starts at 100 (no dcucores: the card to
    itself), dcumem is MiB (memoryFactor 1); hygon.com/use-dcutype / nouse-dcutype are
    read with device.CheckType, hygon.com/use-gpuuuid with CheckUUID."""
    d = only({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000})
    assert (d.memory_mib, d.cores, d.exclusive) == (2000, 100, True)
    devs = [card("hygon", 0, "DCU-Z100"), card("hygon", 1, "DCU-K100")]
    limits = {"hygon.com/dcunum": 1, "hygon.com/dcucores": 10}
    assert chosen(devs, limits, annotations={"hygon.com/use-dcutype": "K100"}).index == 1
    assert chosen(devs, limits, annotations={"hygon.com/nouse-dcutype": "z100"}).index == 1
    for i in (0, 1):
        assert chosen(devs, limits, annotations={"hygon.com/use-gpuuuid": f"hygon-{i}"}).index == i


def test_hygon_bind_annotations() -> None:
    """HAMi pkg/device/hygon/device.go PatchAnnotations: hami.io/dcu-devices-to-allocate
    and hami.io/dcu-devices-allocated, type DCU."""
    out = bound(dev("hygon", 0, model="DCU-Z100", memory_mib=2000, cores=10), containers=2)
    assert out["hami.io/dcu-devices-to-allocate"] == ";hygon-0,DCU,2000,10:;"
    assert out["hami.io/dcu-devices-allocated"] == ";hygon-0,DCU,2000,10:;"


# --- MetaX -------------------------------------------------------------------------------


def test_metax_sgpu_memory_is_gib_unless_written_with_a_suffix() -> None:
    """HAMi pkg/device/metax/sdevice.go: a bare vmemory is GiB (MemoryFactor 1024); a
    quantity with a unit is bytes, divided down to MiB; vcore defaults to 100."""
    assert only({"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 4}).memory_mib == 4096
    suffixed = only({"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": "512Mi"})
    assert suffixed.memory_mib == 512
    d = only({"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": "2Gi"})
    assert (d.memory_mib, d.cores, d.exclusive) == (2048, 100, True)
    assert only({"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 20}).cores == 20
    [error] = errors({"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 16385})  # GiB
    assert "16778240 MiB is more than any device has" in error.message


def test_metax_gpu_is_whole_cards() -> None:
    """HAMi pkg/device/metax/device.go: metax-tech.com/gpu asks whole cards (100 % of the
    memory, 100 cores), a device type of its own (Metax-GPU)."""
    d = only({"metax-tech.com/gpu": 2})
    assert (d.kind, d.count, d.exclusive) == ("gpu-number", 2, True)


def test_metax_uuid_annotation_and_bind_annotations() -> None:
    """HAMi pkg/device/metax/sdevice.go: metax-tech.com/use-gpuuuid is read; at bind the
    list goes under hami.io/metax-sgpu-devices-to-allocate / -allocated (type Metax-SGPU),
    plus metax-tech.com/gpu-devices-allocated (per container, per device: uuid, compute,
    vRam) and metax-tech.com/predicate-time; whole cards under hami.io/metax-gpu-*."""
    devs = [card("metax", 0), card("metax", 1)]
    limits = {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 10}
    for i in (0, 1):
        picked = chosen(devs, limits, annotations={"metax-tech.com/use-gpuuuid": f"metax-{i}"})
        assert picked.index == i
    out = bound(dev("metax", 1, model="C500", memory_mib=4096, cores=40))
    assert out["hami.io/metax-sgpu-devices-to-allocate"] == "metax-1,Metax-SGPU,4096,40:;"
    assert json.loads(out["metax-tech.com/gpu-devices-allocated"]) == [
        [{"uuid": "metax-1", "compute": 40, "vRam": 4096}]
    ]
    assert out["metax-tech.com/predicate-time"] == str(int(NOW * 1e9))
    whole = bound(dev("metax", 0, model="C500", memory_mib=65536, cores=100, whole=True))
    assert whole["hami.io/metax-gpu-devices-allocated"] == "metax-0,Metax-GPU,65536,100:;"
    assert "hami.io/metax-sgpu-devices-allocated" not in whole


# --- Moore Threads -----------------------------------------------------------------------


def test_mthreads_memory_is_512_mib_blocks_of_listed_sizes() -> None:
    """HAMi pkg/device/mthreads/device.go: sgpu-memory counts 512 MiB (MemoryFactor) and
    its webhook refuses sizes other than 2, 4, 8, 16, 32, 64 or 96."""
    d = only({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8})
    assert (d.memory_mib, d.exclusive) == (4096, False)
    [error] = errors({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 3})
    assert "one of 2, 4, 8, 16, 32, 64, 96" in error.message


def test_mthreads_cores_count_16_a_card() -> None:
    """HAMi pkg/device/mthreads/device.go: a card has 16 cores (coresPerMthreadsGPU), so
    sgpu-core 4 is a quarter of it and 16 the whole card; more is refused."""
    d = only({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 4})
    assert d.cores == 25
    whole = only(
        {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 16}
    )
    assert (whole.cores, whole.exclusive) == (100, True)
    [error] = errors(
        {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 17}
    )
    assert "exceeds 16" in error.message


def test_mthreads_several_cards_or_no_memory_are_whole_cards() -> None:
    """HAMi pkg/device/mthreads/device.go MutateAdmission: a count above 1, or no
    sgpu-memory, gets a whole card's cores (16) and memory (96 blocks) per card."""
    several = only({"mthreads.com/vgpu": 2, "mthreads.com/sgpu-memory": 8})
    assert (several.count, several.exclusive, several.memory_percent) == (2, True, 100)
    cores_only = only({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-core": 4})
    assert (cores_only.exclusive, cores_only.memory_percent) == (True, 100)


def test_mthreads_uuid_annotation_and_bind_annotations() -> None:
    """HAMi pkg/device/mthreads/device.go: mthreads.ai/use-gpuuuid is read; at bind only
    hami.io/mthreads-vgpu-devices-allocated (type Mthreads), mthreads.com/gpu-index (the
    indexes of the last container with devices), mthreads.com/predicate-node and -time."""
    devs = [card("mthreads", 0), card("mthreads", 1)]
    limits = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 2}
    for i in (0, 1):
        picked = chosen(devs, limits, annotations={"mthreads.ai/nouse-gpuuuid": f"mthreads-{i}"})
        assert picked.index == 1 - i
    out = bound(dev("mthreads", 3, model="MTT S4000", memory_mib=4096, cores=25))
    assert out["hami.io/mthreads-vgpu-devices-allocated"] == "mthreads-3,Mthreads,4096,25:;"
    assert "hami.io/mthreads-vgpu-devices-to-allocate" not in out
    assert (out["mthreads.com/gpu-index"], out["mthreads.com/predicate-node"]) == ("3", "n1")
    assert out["mthreads.com/predicate-time"] == str(int(NOW * 1e9))


# --- Enflame -----------------------------------------------------------------------------


def test_enflame_gcu_is_whole_cards_and_drs_gcu_slices_one_card() -> None:
    """HAMi pkg/device/enflame/gcu.go: enflame.com/gcu takes whole idle cards;
    pkg/device/enflame/device.go: drs-gcu N asks ONE card (Nums 1) with an N-slice
    profile, whose core share is ceil(N * 100 / slices a card)."""
    whole = only({"enflame.com/gcu": 2})
    assert (whole.kind, whole.count, whole.exclusive) == ("gpu-number", 2, True)
    d = only({"enflame.com/drs-gcu": 3})
    assert (d.count, d.memory_percent, d.cores, d.exclusive) == (1, 30, 30, False)
    all_slices = only({"enflame.com/drs-gcu": 10})
    assert (all_slices.count, all_slices.exclusive) == (1, True)
    [error] = errors({"enflame.com/drs-gcu": 11})
    assert "more than one device has" in error.message
    [error] = errors({"enflame.com/drs-gcu": 1, "enflame.com/gcu-core": 40})
    assert "slice(s) of one device by itself" in error.message


def test_enflame_memory_and_cores_alone_ask_one_card_with_no_count_added() -> None:
    """HAMi pkg/device/enflame/device.go: gcu-memory / gcu-core without drs-gcu ask one
    card (its webhook adds no count name: the DRS device plugin serves those names)."""
    limits = {"enflame.com/gcu-memory": 8192, "enflame.com/gcu-core": 40}
    d = only(limits)
    assert (d.count, d.memory_mib, d.cores) == (1, 8192, 40)
    assert PARSER.missing_counts(pod_json(limits)) == []


def test_enflame_uuid_annotation_and_bind_annotations() -> None:
    """HAMi pkg/device/enflame/device.go: enflame.com/use-gpuuuid is read; a DRS slice is
    written under hami.io/enflame-vgpu-devices-allocated (type Enflame) with
    enflame.com/gcu-assigned=false, -assigned-time, -assigned-index/-id; gcu.go: whole
    cards under hami.io/enflame-gcu-devices-to-allocate / -allocated (type GCU)."""
    devs = [card("enflame", 0), card("enflame", 1)]
    limits = {"enflame.com/drs-gcu": 1}
    for i in (0, 1):
        picked = chosen(devs, limits, annotations={"enflame.com/use-gpuuuid": f"enflame-{i}"})
        assert picked.index == i
    out = bound(dev("enflame", 1, model="S60", memory_mib=4096, cores=17))
    assert out["hami.io/enflame-vgpu-devices-allocated"] == "enflame-1,Enflame,4096,17:;"
    assert out["enflame.com/gcu-assigned"] == "false"
    assert out["enflame.com/gcu-assigned-index"] == out["enflame.com/gcu-assigned-id"] == "1"
    whole = bound(dev("enflame", 0, model="S60", memory_mib=49152, cores=100, whole=True))
    assert whole["hami.io/enflame-gcu-devices-to-allocate"] == "enflame-0,GCU,49152,100:;"


# --- Kunlunxin ---------------------------------------------------------------------------


def test_kunlunxin_vxpu_memory_rounds_up_to_a_template_which_fixes_the_cores() -> None:
    """HAMi pkg/device/kunlun/vdevice.go trimMemory: vxpu-memory rounds up to 24576,
    49152 or 98304 MiB, and the cores are that share of 98304; no memory is the card."""
    d = only({"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 30000})
    assert (d.memory_mib, d.cores, d.exclusive) == (49152, 50, False)
    full = only({"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 60000})
    assert (full.memory_mib, full.cores, full.exclusive) == (98304, 100, True)
    assert only({"kunlunxin.com/vxpu": 1}).exclusive
    [error] = errors({"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 100000})
    assert "larger than the largest slice (98304 MiB)" in error.message


def test_kunlunxin_card_holds_one_slice_size_at_a_time() -> None:
    """HAMi pkg/device/kunlun/vdevice.go FitVXPU: a used card takes only a slice of the
    size it already holds (its used memory over its slices)."""
    pl = placer({"n": [card("kunlunxin", 0, "P800", memory=98304)]})
    place(pl, {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576})
    failure = fail(pl, {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 49152})
    assert "slices of another size" in failure.message
    place(pl, {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 20000})


def test_kunlunxin_uuid_annotations_and_bind_annotations() -> None:
    """HAMi pkg/device/kunlun/vdevice.go reads hami.io/use-xpu-uuid and
    baidu.com/use-gpuuuid; vXPU slices go under hami.io/xpu-devices-to-allocate /
    -allocated (type XPU); device.go: whole xpu cards under hami.io/kunlun-allocated with
    BAIDU_COM_DEVICE_IDX (the indexes)."""
    devs = [card("kunlunxin", i, "P800", memory=98304) for i in range(2)]
    limits = {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576}
    for key in ("hami.io/use-xpu-uuid", "baidu.com/use-gpuuuid"):
        for i in (0, 1):
            assert chosen(devs, limits, annotations={key: f"kunlunxin-{i}"}).index == i
    out = bound(dev("kunlunxin", 1, model="P800", memory_mib=24576, cores=25))
    assert out["hami.io/xpu-devices-to-allocate"] == "kunlunxin-1,XPU,24576,25:;"
    whole = bound(
        dev("kunlunxin", 4, memory_mib=98304, cores=100, whole=True),
        dev("kunlunxin", 5, memory_mib=98304, cores=100, whole=True),
    )
    assert whole["BAIDU_COM_DEVICE_IDX"] == "4,5"
    assert whole["hami.io/kunlun-allocated"].startswith("kunlunxin-4,kunlun,98304,100:")
    assert "hami.io/xpu-devices-allocated" not in whole


# --- Iluvatar ----------------------------------------------------------------------------


def test_iluvatar_resource_name_pins_the_model_and_memory_counts_256_mib() -> None:
    """HAMi pkg/device/iluvatar/device.go: one device type per chip (its resource names
    carry the chip, its Fit takes only devices of that type); vMem is in 256 MiB units."""
    d = only({"iluvatar.ai/BI-V100-vgpu": 1, "iluvatar.ai/BI-V100.vMem": 16})
    assert (d.model, d.memory_mib) == ("BI-V100", 4096)
    devs = [card("iluvatar", 0, "BI-V100"), card("iluvatar", 1, "MR-V50")]
    assert chosen(devs, {"iluvatar.ai/MR-V50-vgpu": 1, "iluvatar.ai/MR-V50.vMem": 4}).index == 1
    assert chosen(devs, {"iluvatar.ai/BI-V100-vgpu": 1, "iluvatar.ai/BI-V100.vMem": 4}).index == 0
    only_mr = placer({"n": [card("iluvatar", 0, "MR-V50")]})
    failure = fail(only_mr, {"iluvatar.ai/BI-V150-vgpu": 1, "iluvatar.ai/BI-V150.vMem": 4})
    assert "BI-V150" in failure.message


def test_iluvatar_several_devices_are_whole_and_uuid_keys_name_the_model() -> None:
    """HAMi pkg/device/iluvatar/device.go MutateAdmission: a count above 1 sets the cores
    to count x 100 (whole cards); hami.io/use-<chip>-uuid is read for that chip, and the
    grant goes under hami.io/<chip>-devices-to-allocate / -allocated."""
    d = only({"iluvatar.ai/MR-V50-vgpu": 2, "iluvatar.ai/MR-V50.vMem": 4})
    assert (d.count, d.exclusive) == (2, True)
    devs = [card("iluvatar", i, "BI-V100") for i in range(2)]
    limits = {"iluvatar.ai/BI-V100-vgpu": 1, "iluvatar.ai/BI-V100.vCore": 10}
    for i in (0, 1):
        key = "hami.io/no-use-BI-V100-uuid"
        assert chosen(devs, limits, annotations={key: f"iluvatar-{i}"}).index == 1 - i
    # another chip's key says nothing of these
    other = chosen(devs, limits, annotations={"hami.io/use-MR-V50-uuid": "iluvatar-1"})
    assert other.index in (0, 1)
    out = bound(dev("iluvatar", 1, model="BI-V100", memory_mib=1024, cores=10))
    assert out["hami.io/BI-V100-devices-to-allocate"] == "iluvatar-1,BI-V100,1024,10:;"
    assert out["hami.io/BI-V100-devices-allocated"] == "iluvatar-1,BI-V100,1024,10:;"


# --- AMD ---------------------------------------------------------------------------------


def test_amd_cores_default_to_100_and_gputype_and_gpu_uuid_keys() -> None:
    """HAMi pkg/device/amd/device.go: an omitted gpucores is 100 (all compute units);
    amd.com/use-gputype / nouse-gputype match the model (checkAMDType) and
    amd.com/use-gpu-uuid / nouse-gpu-uuid the device."""
    d = only({"amd.com/gpu": 1, "amd.com/gpumem": 16384})
    assert (d.memory_mib, d.cores, d.exclusive) == (16384, 100, True)
    devs = [card("amd", 0, "MI300X"), card("amd", 1, "MI210")]
    limits = {"amd.com/gpu": 1, "amd.com/gpucores": 10}
    for i, model in enumerate(("mi300x", "MI210")):
        assert chosen(devs, limits, annotations={"amd.com/use-gputype": model}).index == i
        assert chosen(devs, limits, annotations={"amd.com/nouse-gpu-uuid": f"amd-{i}"}).index != i


def test_amd_bind_annotations_keep_the_model() -> None:
    """HAMi pkg/device/amd/device.go PatchAnnotations: hami.io/amd-devices-to-allocate and
    -allocated, with the device's product type in the list."""
    out = bound(dev("amd", 0, model="MI300X", memory_mib=16384, cores=50))
    assert out["hami.io/amd-devices-to-allocate"] == "amd-0,MI300X,16384,50:;"


# --- AWS Neuron --------------------------------------------------------------------------


def test_neuroncore_alone_asks_cores_of_one_device_or_whole_devices() -> None:
    """HAMi pkg/device/awsneuron/device.go splitCoreRequest: neuroncore up to a device's
    cores (2) is one device; a multiple of 2 is that many whole devices; anything else is
    refused. The core name is asked on its own: no neuron count is added."""
    one = only({"aws.amazon.com/neuroncore": 1})
    assert (one.count, one.cores, one.exclusive) == (1, 1, False)
    four = only({"aws.amazon.com/neuroncore": 4})
    assert (four.count, four.cores) == (2, 2)
    [error] = errors({"aws.amazon.com/neuroncore": 3})
    assert "a multiple of 2" in error.message
    [error] = errors({"aws.amazon.com/neuroncore": 2050})  # 1,025 devices: too many
    assert "ask for at most 2048" in error.message
    assert PARSER.missing_counts(pod_json({"aws.amazon.com/neuroncore": 1})) == []


def test_neuron_count_is_whole_devices() -> None:
    """HAMi pkg/device/awsneuron/device.go: aws.amazon.com/neuron N books N whole devices
    (all their cores)."""
    d = only({"aws.amazon.com/neuron": 2})
    assert (d.kind, d.count, d.exclusive) == ("gpu-number", 2, True)
    pl = placer({"n": [gpu(i, vendor="awsneuron", model="trn1", cores=2) for i in range(2)]})
    place(pl, {"aws.amazon.com/neuroncore": 1})
    assert grants(place(pl, {"aws.amazon.com/neuron": 1}))[0].index == 1


def test_neuron_uuid_annotation_and_bind_annotations() -> None:
    """HAMi pkg/device/awsneuron/device.go: aws.amazon.com/use-neuron-uuid is read; at bind
    hami.io/aws-neuron-devices-allocated (type AWSNeuron) and, for whole devices,
    AWS_NEURON_IDS (every container's device indexes), NEURON_ALLOCATED=false,
    NEURON_ALLOC_TIME, aws.amazon.com/predicate-node."""
    devs = [card("awsneuron", i, "trn1") for i in range(2)]
    for i in (0, 1):
        key = "aws.amazon.com/use-neuron-uuid"
        assert (
            chosen(
                devs, {"aws.amazon.com/neuroncore": 1}, annotations={key: f"awsneuron-{i}"}
            ).index
            == i
        )
    out = bound(
        dev("awsneuron", 0, cores=2, whole=True, exclusive=True),
        dev("awsneuron", 1, cores=2, whole=True, exclusive=True),
    )
    assert out["hami.io/aws-neuron-devices-allocated"].startswith("awsneuron-0,AWSNeuron,0,2:")
    assert (out["AWS_NEURON_IDS"], out["NEURON_ALLOCATED"]) == ("0,1", "false")
    assert out["aws.amazon.com/predicate-node"] == "n1"


# --- Biren and VastAI --------------------------------------------------------------------

# The container of HAMi's examples/biren/default_use.yaml and examples/vastai/default_use.yaml,
# its resources as written there.
EXAMPLES: dict[str, dict[str, Any]] = {
    "biren": {"name": "pod1", "resources": {"limits": {"birentech.com/gpu": 1}}},
    "vastai": {"name": "test", "resources": {"limits": {"vastaitech.com/va": 1}}},
}
SIMULATED: dict[str, dict[str, Any]] = {
    "biren": {"vendor": "biren", "model": "Biren166M", "memory": 65024},
    "vastai": {"vendor": "vastai", "model": "VA16", "memory": 32768},
}
"""An inventory file's device group of each (services/node_agent/simulate.py)."""
COUNT_NAME = {"biren": "birentech.com/gpu", "vastai": "vastaitech.com/va"}
TIME_SLICED = pytest.mark.parametrize("vendor", ["biren", "vastai"])


def simulated(vendor: str, count: int = 2) -> list[DeviceInfo]:
    """A simulated node's ``count`` devices of ``vendor``, as the node agent plays them."""
    group = SIMULATED[vendor] | {"count": count}
    inventory = msgspec.convert({"nodes": [{"name": "sim", "devices": [group]}]}, Inventory)
    return list(expand(inventory)[NodeName("sim")][1])


def example(vendor: str) -> PodRequest:
    pod = pod_json(containers=[EXAMPLES[vendor]])
    assert PARSER.missing_counts(pod) == []  # MutateAdmission adds nothing
    parsed = PARSER.parse(pod)
    assert isinstance(parsed, PodRequest), parsed
    return parsed


@TIME_SLICED
def test_time_sliced_example_pod_takes_a_task_slot_of_a_simulated_device(vendor: str) -> None:
    """HAMi pkg/device/biren/device.go and pkg/device/vastai/device.go
    GenerateResourceRequests: the count name alone (limits, else requests) asks that many
    devices with no memory and no cores; Fit takes a device while its registered count
    (one a device) exceeds its users. HAMi's example pod, parsed unchanged, lands on a
    simulated node of that vendor, one pod a device."""
    [d] = example(vendor).containers[0].devices
    assert (d.vendor, d.count, d.memory_mib, d.cores, d.exclusive) == (vendor, 1, 0, 0, False)
    pl = placer({"nv": gpus(1), "sim": simulated(vendor)})
    taken = []
    for _ in range(2):
        result = pl.place(ref(), example(vendor), None)
        assert isinstance(result, Placement), result
        [g] = grants(result)
        assert (result.node, g.vendor, g.memory_mib, g.cores) == ("sim", vendor, 0, 0)
        taken.append(g.index)
    assert sorted(taken) == [0, 1]
    full = pl.place(ref(), example(vendor), None)
    assert isinstance(full, Failure), full
    assert "device split count reached" in full.message


@TIME_SLICED
def test_time_sliced_device_shares_as_many_tasks_as_its_split_count(vendor: str) -> None:
    """HAMi pkg/device/biren/device.go and vastai/device.go Fit check only the device's
    registered count against its users (no memory, no cores): a plugin registering more
    tasks a device time-slices it, which devices.<vendor>.deviceSplitCount says here."""
    cfg = parse_config({"devices": {vendor: {"deviceSplitCount": 3}}})
    pl = Placer(ledger({"sim": simulated(vendor, 1)}, specs=cfg.devices))
    parser = RequestParser(cfg.devices)
    for _ in range(3):
        assert grants(place(pl, {}, containers=[EXAMPLES[vendor]], parser=parser))[0].index == 0
    assert "split count" in fail(pl, {COUNT_NAME[vendor]: 1}, parser=parser).message


@TIME_SLICED
def test_time_sliced_vendors_read_uuid_keys_only(vendor: str) -> None:
    """HAMi pkg/device/biren/device.go (birentech.com/use-gpuuuid, nouse-gpuuuid) and
    vastai/device.go (vastaitech.com/...) read the UUID keys with device.CheckUUID; the
    type keys they declare (birentech.com/use-biren, vastaitech.com/use-va) are never
    read."""
    devs = simulated(vendor)
    limits = {COUNT_NAME[vendor]: 1}
    domain = COUNT_NAME[vendor].split("/")[0]
    for d in devs:
        use = {f"{domain}/use-gpuuuid": d.uuid}
        assert chosen(devs, limits, annotations=use).uuid == d.uuid
        nouse = {f"{domain}/nouse-gpuuuid": d.uuid}
        assert chosen(devs, limits, annotations=nouse).uuid != d.uuid
    type_key = "birentech.com/use-biren" if vendor == "biren" else "vastaitech.com/use-va"
    assert chosen(devs, limits, annotations={type_key: "nothing-like-it"}).vendor == vendor


@TIME_SLICED
def test_time_sliced_bind_annotations(vendor: str) -> None:
    """HAMi pkg/device/biren/device.go and vastai/device.go PatchAnnotations: the device
    list under hami.io/<Biren|Vastai>-devices-to-allocate and -allocated, type Biren or
    Vastai, with the 0 MiB and 0 cores the request booked."""
    word = {"biren": "Biren", "vastai": "Vastai"}[vendor]
    out = bound(dev(vendor, 1, model=SIMULATED[vendor]["model"]), containers=2)
    assert out[f"hami.io/{word}-devices-to-allocate"] == f";{vendor}-1,{word},0,0:;"
    assert out[f"hami.io/{word}-devices-allocated"] == f";{vendor}-1,{word},0,0:;"
    assert f"hami.io/{word}-devices-allocated" in set(ann.COMPAT_KEYS["hami"].values())


@TIME_SLICED
def test_simulated_node_advertises_one_task_a_device(vendor: str) -> None:
    """The node agent registers a count name with deviceSplitCount IDs a device
    (services/node_agent/resources.py), as Biren's plugin registers each device once
    (biren-device-plugin pkg/brgpu/register.go): two devices, two."""
    cfg = parse_config({})
    devices = tuple(simulated(vendor))
    assert capacity(cfg, "sim", devices) == {COUNT_NAME[vendor]: "2"}


# --- NVIDIA and Ascend -------------------------------------------------------------------


def test_nvidia_type_and_uuid_keys_filter_nvidia_devices_only() -> None:
    """HAMi pkg/device/nvidia/device.go reads nvidia.com/use-gputype and use-gpuuuid in the
    NVIDIA type's Fit only; another vendor's request is not filtered by them."""
    devs = [card("hygon", 0, "DCU-Z100")]
    limits = {"hygon.com/dcunum": 1, "hygon.com/dcucores": 10}
    assert chosen(devs, limits, annotations={"nvidia.com/use-gputype": "A100"}).index == 0
    assert chosen(devs, limits, annotations={"nvidia.com/nouse-gpuuuid": "hygon-0"}).index == 0
    nvidia = [gpu(0, uuid="GPU-0"), gpu(1, uuid="GPU-1")]
    picked = chosen(nvidia, {"nvidia.com/gpu": 1}, annotations={"nvidia.com/use-gpuuuid": "GPU-1"})
    assert picked.index == 1


def test_ascend_uuid_keys_name_the_chip() -> None:
    """HAMi pkg/device/ascend/device.go: hami.io/use-<common word>-uuid and
    hami.io/no-use-<common word>-uuid, per chip."""
    devs = [npu(0), npu(1)]
    limits = {"huawei.com/Ascend910B3": 1}
    for d in devs:
        picked = chosen(devs, limits, annotations={"hami.io/use-Ascend910B3-uuid": d.uuid})
        assert picked.uuid == d.uuid
    # another chip's key says nothing of a 910B3
    assert chosen(devs, limits, annotations={"hami.io/use-Ascend310P-uuid": "x"}).index == 0


def test_hami_annotations_give_each_vendor_its_own_keys() -> None:
    """HAMi pkg/scheduler/scheduler.go: every device type's PatchAnnotations writes its own
    keys, each with that type's devices per container (a container without any keeps its
    ';'); pkg/device/ascend/device.go adds huawei.com/<word> (UUID, template, memory,
    cores) and predicate-time."""
    nvidia = DeviceGrant(
        uuid=DeviceUUID("GPU-0"), model="NVIDIA-A100-SXM4-80GB", memory_mib=1000, cores=10
    )
    ascend = DeviceGrant(
        uuid=DeviceUUID("npu-0"),
        vendor="ascend",
        model="Ascend310P3",
        memory_mib=3072,
        ai_cores=1,
        vnpu_template="vir01",
    )
    out = ann.grant_annotations(
        NODE,
        [
            ContainerGrant(container="a", devices=(nvidia,)),
            ContainerGrant(container="b", devices=(ascend,)),
        ],
        NOW,
        "hami",
    )
    assert out["hami.io/vgpu-devices-to-allocate"] == "GPU-0,NVIDIA-A100-SXM4-80GB,1000,10:;;"
    assert out["hami.io/Ascend310P-devices-to-allocate"] == ";npu-0,Ascend310P,3072,0:;"
    assert json.loads(out["huawei.com/Ascend310P"]) == [
        {"UUID": "npu-0", "temp": "vir01", "memory": 3072, "core": 1}
    ]
    assert out["predicate-time"] == str(int(NOW))
    volcano = ann.grant_annotations(
        NODE, [ContainerGrant(container="b", devices=(ascend,))], NOW, "volcano"
    )
    assert volcano["volcano.sh/devices-to-allocate"] == ";"  # Volcano's plugin: NVIDIA only


@pytest.mark.parametrize(
    "key",
    [
        "hami.io/dcu-devices-to-allocate",
        "hami.io/kunlun-allocated",
        "hami.io/amd-devices-allocated",
    ],
)
def test_vendor_bind_keys_are_the_schedulers_alone(key: str) -> None:
    """The webhook refuses a new pod that brings a key only the scheduler writes
    (services/webhook/validation.py reads COMPAT_KEYS)."""
    assert key in set(ann.COMPAT_KEYS["hami"].values())


def test_vendor_rules_are_config_keys() -> None:
    """Each rule is a key of the vendor's block (HAMi's hygon block has ``memoryFactor``,
    Tessera's ``gpuMemoryFactor``); a per-model key needs its models."""
    cfg = parse_config({"devices": {"hygon": {"gpuMemoryFactor": 2, "defaultCores": 0}}})
    parser = RequestParser(cfg.devices)
    parsed = parser.parse(pod_json({"hygon.com/dcunum": 1, "hygon.com/dcumem": 100}))
    assert isinstance(parsed, PodRequest)
    [d] = parsed.containers[0].devices
    assert (d.memory_mib, d.cores, d.exclusive) == (200, 0, False)
    with pytest.raises(ConfigError, match="no `models`"):
        parse_config({"devices": {"amd": {"useUuidAnnotation": "amd.com/{model}-uuid"}}})
