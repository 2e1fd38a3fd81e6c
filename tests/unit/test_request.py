"""The request parser, row by row of docs/compat.md sections 1 and 2, and every bad input."""

from __future__ import annotations

from typing import Any

import pytest

from shared.config import parse as parse_config
from shared.core.model import DeviceRequest, PodRequest, RequestError
from shared.core.request import RequestParser
from shared.core.spec import DeviceSpecs
from tests.unit.corekit import PARSER, pod_json, request


def only_device(req: PodRequest) -> DeviceRequest:
    [container] = [c for c in req.containers if c.devices]
    [device] = container.devices
    return device


def errors(limits: dict[str, Any], parser: RequestParser = PARSER, **kw: Any) -> list[str]:
    parsed = parser.parse(pod_json(limits, **kw))
    assert not isinstance(parsed, PodRequest), f"expected errors, got {parsed}"
    return [f"{e.field}: {e.message}" for e in parsed]


# docs/compat.md section 1: every resource name, with what it must parse to.
# (limits, vendor, kind, count, memory_mib, memory_percent, cores, exclusive)
ROWS: list[tuple[dict[str, Any], str, str, int, int | None, int | None, int, bool]] = [
    # HAMi NVIDIA
    ({"nvidia.com/gpu": 1}, "nvidia", "vgpu", 1, None, 100, 100, True),
    ({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000}, "nvidia", "vgpu", 2, 3000, None, 0, False),
    (
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},
        "nvidia",
        "vgpu",
        1,
        None,
        50,
        0,
        False,
    ),
    (
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024, "nvidia.com/gpucores": 30},
        "nvidia",
        "vgpu",
        1,
        1024,
        None,
        30,
        False,
    ),
    # Volcano vGPU
    ({"volcano.sh/vgpu-number": 1}, "nvidia", "vgpu", 1, None, 100, 100, True),
    (
        {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 2048},
        "nvidia",
        "vgpu",
        1,
        2048,
        None,
        0,
        False,
    ),
    (
        {
            "volcano.sh/vgpu-number": 1,
            "volcano.sh/vgpu-memory-percentage": 25,
            "volcano.sh/vgpu-cores": 50,
        },
        "nvidia",
        "vgpu",
        1,
        None,
        25,
        50,
        False,
    ),
    # Volcano GPU share and GPU number
    ({"volcano.sh/gpu-memory": 4096}, "nvidia", "gpu-share", 1, 4096, None, 0, False),
    ({"volcano.sh/gpu-number": 2}, "nvidia", "gpu-number", 2, None, 100, 100, True),
    # other vendors
    (
        {
            "cambricon.com/vmlu": 1,
            "cambricon.com/mlu.smlu.vmemory": 16,  # 256 MiB units
            "cambricon.com/mlu.smlu.vcore": 20,
        },
        "cambricon",
        "vgpu",
        1,
        4096,
        None,
        20,
        False,
    ),
    (
        {"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000, "hygon.com/dcucores": 10},
        "hygon",
        "vgpu",
        1,
        2000,
        None,
        10,
        False,
    ),
    (
        {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 4, "metax-tech.com/vcore": 40},
        "metax",
        "vgpu",
        1,
        4096,
        None,
        40,
        False,
    ),
    ({"metax-tech.com/gpu": 1}, "metax", "gpu-number", 1, None, 100, 100, True),
    (
        {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 4},
        "mthreads",
        "vgpu",
        1,
        4096,  # 512 MiB blocks
        None,
        25,  # 4 of 16
        False,
    ),
    ({"enflame.com/vgcu-percentage": 25}, "enflame", "vgpu", 1, None, 25, 0, False),
    (
        {"enflame.com/gcu-memory": 1000, "enflame.com/gcu-core": 10},
        "enflame",
        "vgpu",
        1,
        1000,
        None,
        10,
        False,
    ),
    ({"enflame.com/gcu": 1}, "enflame", "gpu-number", 1, None, 100, 100, True),
    ({"enflame.com/drs-gcu": 1}, "enflame", "vgpu", 1, None, 10, 10, False),
    ({"kunlunxin.com/xpu": 2}, "kunlunxin", "gpu-number", 2, None, 100, 100, True),
    (
        {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576},
        "kunlunxin",
        "vgpu",
        1,
        24576,
        None,
        25,
        False,
    ),
    (
        {
            "iluvatar.ai/BI-V150-vgpu": 1,
            "iluvatar.ai/BI-V150.vMem": 32,  # 256 MiB units
            "iluvatar.ai/BI-V150.vCore": 50,
        },
        "iluvatar",
        "vgpu",
        1,
        8192,
        None,
        50,
        False,
    ),
    (
        {"amd.com/gpu": 1, "amd.com/gpumem": 16384, "amd.com/gpucores": 50},
        "amd",
        "vgpu",
        1,
        16384,
        None,
        50,
        False,
    ),
    ({"aws.amazon.com/neuroncore": 1}, "awsneuron", "vgpu", 1, 0, None, 1, False),
    ({"aws.amazon.com/neuron": 2}, "awsneuron", "gpu-number", 2, None, 100, 0, True),
    ({"birentech.com/gpu": 2}, "biren", "vgpu", 2, 0, None, 0, False),  # task slots only
    ({"vastaitech.com/va": 1}, "vastai", "vgpu", 1, 0, None, 0, False),
]


@pytest.mark.parametrize(
    ("limits", "vendor", "kind", "count", "memory", "percent", "cores", "exclusive"),
    ROWS,
    ids=lambda v: str(v) if isinstance(v, dict) else None,
)
def test_every_resource_name_parses(
    limits: dict[str, Any],
    vendor: str,
    kind: str,
    count: int,
    memory: int | None,
    percent: int | None,
    cores: int,
    exclusive: bool,
) -> None:
    d = only_device(request(limits))
    assert (d.vendor, d.kind, d.count, d.memory_mib, d.memory_percent, d.cores, d.exclusive) == (
        vendor,
        kind,
        count,
        memory,
        percent,
        cores,
        exclusive,
    )


@pytest.mark.parametrize(
    ("chip", "word"),
    [
        ("910A", "Ascend910A"),
        ("910B2", "Ascend910B2"),
        ("910B3", "Ascend910B3"),
        ("910B4", "Ascend910B4"),
        ("910B4-1", "Ascend910B4-1"),
        ("310P3", "Ascend310P"),
        ("910C", "Ascend910C"),
    ],
)
def test_every_ascend_chip_parses_in_template_and_hami_core_modes(chip: str, word: str) -> None:
    d = only_device(request({f"huawei.com/{word}": 1, f"huawei.com/{word}-memory": 2000}))
    assert (d.vendor, d.kind, d.chip, d.memory_mib, d.exclusive) == (
        "ascend",
        "npu-template",
        chip,
        2000,
        False,
    )
    whole = only_device(request({f"huawei.com/{word}": 2}))
    assert (whole.count, whole.exclusive, whole.memory_percent) == (2, True, 100)
    soft = only_device(
        request(
            {
                f"huawei.com/{word}": 1,
                f"huawei.com/{word}-memory": 2000,
                f"huawei.com/{word}-core": 30,
            },
            annotations={"huawei.com/vnpu-mode": "hami-core"},
        )
    )
    assert (soft.kind, soft.memory_mib, soft.cores) == ("vgpu", 2000, 30)


@pytest.mark.parametrize(
    ("cores", "count", "exclusive"),
    [(1, 1, False), (2, 1, False), (4, 1, False), (8, 1, True), (16, 2, True)],
)
def test_mindcluster_npu_core(cores: int, count: int, exclusive: bool) -> None:
    d = only_device(
        request({"huawei.com/npu-core": cores}, labels={"vnpu-level": "high", "vnpu-dvpp": "null"})
    )
    assert (d.kind, d.count, d.exclusive, d.chip) == ("npu-core", count, exclusive, "310P3")


def test_quantities_in_canonical_form_are_read() -> None:
    d = only_device(request({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20k"}))
    assert d.memory_mib == 20000


def test_defaults_and_memory_factor_apply() -> None:
    specs = parse_config(
        {
            "devices": {
                "nvidia": {
                    "defaultMemory": 2048,
                    "defaultCores": 15,
                    "defaultGPUNum": 2,
                    "gpuMemoryFactor": 1024,
                }
            }
        }
    ).devices
    parser = RequestParser(specs)
    d = only_device(request({"nvidia.com/gpu": 2, "nvidia.com/gpucores": 40}, parser))
    assert (d.count, d.memory_mib, d.cores, d.exclusive) == (2, 2048, 40, False)
    d = only_device(request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4}, parser))
    assert (d.memory_mib, d.cores) == (4096, 15)
    # gpu-share is in the same unit: its device plugin offers one ID per 1024 MiB
    d = only_device(request({"volcano.sh/gpu-memory": 4}, parser))
    assert (d.kind, d.memory_mib, d.units) == ("gpu-share", 4096, 4)
    # defaultGPUNum is the count the fix names (and the webhook adds)
    assert "add nvidia.com/gpu: 2 " in errors({"nvidia.com/gpucores": 40}, parser)[0]


def test_memory_or_cores_without_a_count_name_the_container_the_names_and_the_fix() -> None:
    found = errors(
        {},
        containers=[
            {"name": "a", "resources": {"limits": {"nvidia.com/gpumem": 1024}}},
            {
                "name": "b",
                "resources": {
                    "limits": {"volcano.sh/vgpu-memory": 1024, "volcano.sh/vgpu-cores": 20}
                },
            },
            {"name": "c", "resources": {"limits": {"amd.com/gpucores": 10}}},
            {"name": "d", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5}}},
        ],
    )
    assert found == [
        f"{field}: {asked} without a device count: the kubelet hands devices and limits only "
        f"to a container that asks for a count, so it would run with none; add {fix} "
        "(Tessera's admission webhook adds it when the pod is created: is it running?)"
        for field, asked, fix in (
            ("nvidia.com/gpumem (container a)", "nvidia.com/gpumem", "nvidia.com/gpu: 1"),
            (
                "volcano.sh/vgpu-memory (container b)",
                "volcano.sh/vgpu-memory, volcano.sh/vgpu-cores",
                "volcano.sh/vgpu-number: 1",
            ),
            ("amd.com/gpucores (container c)", "amd.com/gpucores", "amd.com/gpu: 1"),
        )
    ]
    # the names counted in units are registered with the kubelet themselves
    assert only_device(request({"volcano.sh/gpu-memory": 100})).units == 100
    assert only_device(request({"huawei.com/npu-core": 2})).units == 2
    whole = only_device(request({"huawei.com/npu-core": 16}))
    assert (whole.count, whole.units) == (2, 8)


def test_missing_counts_are_what_the_webhook_adds() -> None:
    pod = pod_json(
        {},
        init=[{"name": "fetch", "resources": {"limits": {"nvidia.com/gpumem-percentage": 10}}}],
        containers=[
            {"name": "main", "resources": {"requests": {"iluvatar.ai/MR-V50.vMem": 1000}}},
            {
                "name": "counted",
                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1}},
            },
            {"name": "whole", "resources": {"limits": {"volcano.sh/gpu-number": 1}}},
            {"name": "share", "resources": {"limits": {"volcano.sh/gpu-memory": 1}}},
            {"name": "npu", "resources": {"limits": {"huawei.com/npu-core": 1}}},
            {"name": "priority", "resources": {"limits": {"nvidia.com/priority": 1}}},
        ],
    )
    assert [
        (m.key, m.index, m.container, m.count_name, m.count) for m in PARSER.missing_counts(pod)
    ] == [
        ("initContainers", 0, "fetch", "nvidia.com/gpu", 1),
        ("containers", 0, "main", "iluvatar.ai/MR-V50-vgpu", 1),
    ]


def test_configured_names_replace_the_defaults() -> None:
    specs = parse_config(
        {
            "devices": {
                "nvidia": {
                    "resourceCountName": "example.com/vgpu",
                    "resourceMemoryName": "example.com/vgpu-mem",
                }
            }
        }
    ).devices
    parser = RequestParser(specs)
    d = only_device(request({"example.com/vgpu": 1, "example.com/vgpu-mem": 100}, parser))
    assert (d.resource, d.memory_mib, d.memory_resource) == (
        "example.com/vgpu",
        100,
        "example.com/vgpu-mem",
    )
    # the replaced name is no longer Tessera's: the pod asks nothing of it
    assert not parser.wants_devices(pod_json({"nvidia.com/gpu": 1}))
    assert not request({"nvidia.com/gpu": 1}, parser).wants_devices


def test_exclusive_by_cores_or_percentage() -> None:
    assert only_device(request({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100})).exclusive
    assert only_device(
        request({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100})
    ).exclusive
    assert not only_device(request({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 99})).exclusive


def test_cores_over_100_clamp_when_configured_like_upstream() -> None:
    parser = RequestParser(DeviceSpecs(), clamp_cores=True)
    d = only_device(request({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}, parser))
    assert (d.cores, d.exclusive) == (100, True)


def test_priority_and_container_env_are_kept() -> None:
    req = request(
        {},
        containers=[
            {
                "name": "main",
                "resources": {
                    "limits": {
                        "nvidia.com/gpu": 1,
                        "nvidia.com/gpumem": 100,
                        "nvidia.com/priority": 1,
                    }
                },
                "env": [
                    {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
                    {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
                ],
            }
        ],
    )
    [c] = req.containers
    assert (c.disable_isolation, c.core_policy, c.devices[0].priority) == (True, "force", 1)


def test_init_containers_come_first_and_requests_fill_in_for_limits() -> None:
    req = request(
        {},
        init=[{"name": "setup", "resources": {"requests": {"nvidia.com/gpu": 1}}}],
        containers=[
            {"name": "main"},
            {
                "name": "side",
                "resources": {"requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10}},
            },
        ],
    )
    assert [(c.name, c.init, len(c.devices)) for c in req.containers] == [
        ("setup", True, 1),
        ("main", False, 0),
        ("side", False, 1),
    ]


ANNOTATIONS: list[tuple[dict[str, str], dict[str, Any]]] = [
    ({"nvidia.com/use-gputype": "A100, V100"}, {"use_types": ("a100", "v100")}),
    # NVML's spelling with spaces and HAMi's with dashes mean the same type
    ({"nvidia.com/use-gputype": "Tesla V100-PCIE-32GB"}, {"use_types": ("tesla-v100-pcie-32gb",)}),
    (
        {"nvidia.com/nouse-gputype": "NVIDIA-GeForce-RTX-4090"},
        {"nouse_types": ("nvidia-geforce-rtx-4090",)},
    ),
    ({"nvidia.com/use-gpuuuid": "GPU-a,GPU-b"}, {"use_uuids": ("GPU-a", "GPU-b")}),
    ({"nvidia.com/nouse-gpuuuid": "GPU-a"}, {"nouse_uuids": ("GPU-a",)}),
    ({"volcano.sh/vgpu-use-gpuuuid": "GPU-c"}, {"use_uuids": ("GPU-c",)}),
    ({"volcano.sh/vgpu-nouse-gpuuuid": "GPU-d"}, {"nouse_uuids": ("GPU-d",)}),
    ({"volcano.sh/gpu-index": "0,2"}, {"device_indexes": (0, 2)}),
    ({"nvidia.com/vgpu-mode": "mig"}, {"mode": "mig"}),
    ({"volcano.sh/vgpu-mode": "mps"}, {"mode": "mps"}),
    ({"hami.io/node-scheduler-policy": "spread"}, {"node_policy": "spread"}),
    ({"hami.io/gpu-scheduler-policy": "binpack"}, {"device_policy": "binpack"}),
    ({"hami.io/gpu-scheduler-policy": "numa"}, {"numa_bind": True}),
    ({"hami.io/gpu-scheduler-policy": "topology-aware"}, {"topology": True, "numa_bind": False}),
    (
        {"hami.io/gpu-scheduler-policy": "binpack,topology-aware"},
        {"device_policy": "binpack", "topology": True},
    ),
    ({"hami.io/gpu-scheduler-policy": "spread"}, {"topology": False}),
    ({}, {"topology": None}),
    ({"nvidia.com/numa-bind": "true"}, {"numa_bind": True}),
    ({"volcano.sh/vgpu-podgroup-policy": "spread"}, {"group_spread": True}),
    ({"huawei.com/vnpu-mode": "hami-core"}, {"vnpu_hami_core": True}),
]


@pytest.mark.parametrize(("annotations", "expected"), ANNOTATIONS)
def test_every_annotation_becomes_a_constraint(
    annotations: dict[str, str], expected: dict[str, Any]
) -> None:
    req = request({"nvidia.com/gpu": 1}, annotations=annotations)
    for key, value in expected.items():
        assert getattr(req.constraints, key) == value


BAD: list[tuple[dict[str, Any], dict[str, Any], list[str]]] = [
    ({"nvidia.com/gpumem": -1}, {}, ["nvidia.com/gpumem (container main)", "negative"]),
    ({"nvidia.com/gpumem": "1.5"}, {}, ["nvidia.com/gpumem", "whole number"]),
    ({"nvidia.com/gpumem": "lots"}, {}, ["nvidia.com/gpumem", "whole number"]),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 101}, {}, ["gpucores", "exceeds 100"]),
    (
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 120},
        {},
        ["gpumem-percentage", "exceeds 100"],
    ),
    (
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10, "nvidia.com/gpumem-percentage": 10},
        {},
        ["both set"],
    ),
    ({"nvidia.com/gpu": 0, "nvidia.com/gpumem": 10}, {}, ["at least 1 device"]),
    ({"nvidia.com/gpu": 1, "volcano.sh/vgpu-number": 1}, {}, ["keep one"]),
    ({"volcano.sh/gpu-number": 1, "volcano.sh/vgpu-memory": 10}, {}, ["cannot be combined"]),
    (
        {"huawei.com/Ascend910B3": 2, "huawei.com/Ascend910B3-memory": 1000},
        {},
        ["multi-card Ascend request must use whole cards"],
    ),
    (
        {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 70000},
        {},
        ["larger than an Ascend910B3"],
    ),
    (
        {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-core": 20},
        {},
        ["huawei.com/vnpu-mode: hami-core"],
    ),
    ({"huawei.com/Ascend910B3-memory": 1000}, {}, ["needs huawei.com/Ascend910B3"]),
    ({"huawei.com/npu-core": 3}, {}, ["match no vNPU template"]),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"nvidia.com/vgpu-mode": "time-slicing"}},
        ["nvidia.com/vgpu-mode", "hami-core, mig or mps"],
    ),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"hami.io/node-scheduler-policy": "random"}},
        ["hami.io/node-scheduler-policy"],
    ),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"volcano.sh/gpu-index": "first"}},
        ["volcano.sh/gpu-index"],
    ),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"nvidia.com/numa-bind": "yes"}},
        ["nvidia.com/numa-bind"],
    ),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"hami.io/gpu-scheduler-policy": "binpack,spread"}},
        ["hami.io/gpu-scheduler-policy", "'spread' is not valid", "one of binpack, spread"],
    ),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"hami.io/gpu-scheduler-policy": "topology"}},
        ["hami.io/gpu-scheduler-policy", "topology-aware"],
    ),
    ({"huawei.com/npu-core": 1}, {"labels": {"vnpu-level": "medium"}}, ["vnpu-level"]),
    ({"huawei.com/npu-core": 1}, {"labels": {"vnpu-dvpp": "maybe"}}, ["vnpu-dvpp"]),
    # What upstream silently reads as something else is refused, saying why:
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 0}, {}, ["gpumem", "asks for no memory"]),
    (
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0},
        {},
        ["gpumem-percentage", "the whole card"],
    ),
    ({"nvidia.com/gpu": 1, "nvidia.com/priority": 7}, {}, ["priority", "0 (high) or 1 (low)"]),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"nvidia.com/use-gputype": ","}},
        ["nvidia.com/use-gputype", "names no device"],
    ),
    (
        {"nvidia.com/gpu": 1},
        {"annotations": {"nvidia.com/nouse-gpuuuid": ",,,"}},
        ["nvidia.com/nouse-gpuuuid", "names no device"],
    ),
]


@pytest.mark.parametrize(("limits", "kw", "fragments"), BAD)
def test_bad_input_names_the_field_and_the_fix(
    limits: dict[str, Any], kw: dict[str, Any], fragments: list[str]
) -> None:
    text = " | ".join(errors(limits, **kw))
    for fragment in fragments:
        assert fragment in text


def test_every_error_is_reported_not_only_the_first() -> None:
    found = errors(
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": -1, "amd.com/gpu": 1, "amd.com/gpucores": 500},
        annotations={"nvidia.com/vgpu-mode": "x"},
    )
    assert len(found) == 3


def test_a_pod_without_device_resources_asks_nothing() -> None:
    req = request({"cpu": "2", "memory": "1Gi"})
    assert not req.wants_devices
    assert not PARSER.wants_devices(pod_json({"cpu": "2"}))
    assert PARSER.wants_devices(pod_json({"volcano.sh/vgpu-memory": 1}))


def test_request_error_is_a_value() -> None:
    e = RequestError(field="f", message="m")
    assert e == RequestError(field="f", message="m")
