"""Hypothesis strategies for the fuzz tests: random and hostile external input.

Two tiers for each kind of input:

- *API-shaped*: what the API server, the kubelet or a careful operator can hand over
  (every field has the type the schema gives it) but with odd values: empty strings,
  huge numbers, unknown operators, random text in every annotation the parser reads.
- *hostile*: an API-shaped value with random parts replaced by junk of any type (a list
  where a mapping is expected, None, floats, nested junk), or junk outright.

Inputs that trigger a bug already found are left out (see :data:`EXCLUDED`, empty
while no bug is open); tests/unit/test_fuzz.py checks every such bug in a test of its
own, marked ``xfail(strict=True)`` until it is fixed, then kept as a regression test
once the input is generated again.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import strategies as st

from shared.core import annotations as ann
from shared.core import request as rq
from shared.core.request import RequestParser
from shared.core.spec import DeviceSpecs

EXCLUDED: dict[str, str] = {}
"""What the fuzz tests leave out, and why: inputs the strategies never generate or the
tests pass over, and properties the tests do not assert, each for a bug found and
still open, with an xfail test of its own in tests/unit/test_fuzz.py. Empty: every bug
found so far is fixed, and its inputs are generated (the regression tests at the end
of tests/unit/test_fuzz.py name them)."""

PARSER = RequestParser(DeviceSpecs())
DEVICE_NAMES = sorted(PARSER.table.by_name)
"""Every resource name the default config gives a device role."""

# --- scalars and junk ------------------------------------------------------------------

HOSTILE_STRINGS = [
    "",
    " ",
    "\x00",
    "\n",
    "\t1",
    "null",
    "None",
    "true",
    "0",
    "-0",
    "+1",
    "-1",
    "1e3",
    "1E3",
    "1e-3",
    "0.5Gi",
    "1Ki",
    "1ki",
    "abc",
    ",",
    ",,0,,",
    "0,1",
    "0x10",
    "1_000",
    "\u0661\u0662",  # Arabic-Indic digits: re's \d and int() take them
    "NaN",
    "inf",
    "Infinity",
    "9" * 30,
    "-" + "9" * 30,
    "\u202e",
    "é",
    "\ufeff1",
    "a" * 300,
    '{"a": 1}',
    "[1, 2]",
    "\u00b2",  # a digit to str.isdigit(), not to int() or float()
    "1" * 4301,  # more digits than int() reads
    "0" * 4400 + "1",
    "1e3000000",
    "1e-3000000",
]
"""Strings that often break parsers: empty, blank, signs, exponents, Unicode
digits, long runs, JSON inside a string."""

SAFE_CHARS = st.characters(blacklist_categories=("Cs",))
"""Any character but surrogates (no API string holds one); ``No`` digits such as ``²``
included, which str.isdigit() accepts and int() and float() refuse."""

text = st.one_of(st.text(SAFE_CHARS, max_size=16), st.sampled_from(HOSTILE_STRINGS))
"""A short string, often one of :data:`HOSTILE_STRINGS`."""

ascii_text = st.text(st.characters(max_codepoint=127), max_size=40)

any_floats = st.floats()
"""Floats, NaN and infinities included."""

big_ints = st.one_of(
    st.integers(-3, 300),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**4299]),
)
"""Integers in and far out of int64, up to the 4300 digits a JSON decoder gives (msgspec
refuses more; YAML files may hold more: :func:`yaml_texts`)."""

scalars = st.one_of(st.none(), st.booleans(), big_ints, any_floats, text)

junk = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)
"""Any JSON-like value: scalars of every type, lists and mappings of them."""

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        text,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=10,
)
"""Values that encode to standard JSON (no NaN)."""

# --- mutation --------------------------------------------------------------------------

JsonPath = tuple[Hashable, ...]


def _paths(value: Any, prefix: JsonPath = ()) -> list[JsonPath]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


def _get(value: Any, path: JsonPath) -> Any:
    for step in path:
        value = value[step]
    return value


def _retyped(value: Any) -> Any:
    """The same content in the wrong container: a mapping as a list, a list as a
    mapping, a scalar as a one-item list, a number as a string."""
    if isinstance(value, dict):
        return list(value.items()) if value else ["key"]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return [value]


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any], max_edits: int = 4) -> Any:
    """A value of ``base`` with 1 to ``max_edits`` random parts replaced by junk, set to
    None, retyped (a list where a mapping was), or removed."""
    value = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, max_edits))):
        path = draw(st.sampled_from(_paths(value)))
        edit = draw(st.sampled_from(["junk", "none", "retype", "remove"]))
        old = _get(value, path)
        if edit == "junk":
            new = draw(junk)
        elif edit == "none":
            new = None
        elif edit == "retype":
            new = _retyped(old)
        else:
            new = _REMOVE
        if not path:
            value = None if new is _REMOVE else new
            continue
        parent = _get(value, path[:-1])
        if new is _REMOVE:
            del parent[path[-1]]
        else:
            parent[path[-1]] = new
    return value


_REMOVE = object()


def maybe_mutated(base: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``base`` as is, or :func:`mutated`."""
    return st.one_of(base, mutated(base))


def rarely(
    strategy: st.SearchStrategy[Any], otherwise: st.SearchStrategy[Any], one_in: int = 32
) -> st.SearchStrategy[Any]:
    """``strategy`` one time in ``one_in``, else ``otherwise`` (a config has dozens of
    numbers: each must be rarely wrong for some configs to be valid)."""
    return st.integers(1, one_in).flatmap(lambda n: strategy if n == 1 else otherwise)


# --- quantities ------------------------------------------------------------------------

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


@st.composite
def quantity_strings(draw: st.DrawFn, signed: bool = True) -> str:
    """Strings in (or near) the Kubernetes quantity grammar: a sign, digits with an
    optional fraction, then a suffix or a decimal exponent, sometimes padded."""
    sign = draw(st.sampled_from(["", "+", "-"])) if signed else ""
    whole = str(draw(st.integers(0, 10**18)))
    number = draw(
        st.sampled_from([whole, f"{whole}.", f"{whole}.{draw(st.integers(0, 999))}", ".5"])
    )
    tail = draw(
        st.one_of(
            st.sampled_from(SUFFIXES),
            st.integers(-40, 40).map(lambda e: f"e{e}"),
            st.integers(0, 40).map(lambda e: f"E+{e}"),
            st.sampled_from(["e64", "e-64", "e65", "e-65", "e3000000", "e-3000000"]),
        )
    )
    pad = draw(st.sampled_from(["", " ", "\n"]))
    return f"{sign}{number}{tail}{pad}"


_odd_canonical = st.one_of(
    st.builds(lambda n, s: f"{n}{s}", st.integers(0, 10**6), st.sampled_from(SUFFIXES)),
    st.sampled_from(["500m", "1.5", "0.5", "1k", "20k", "1Gi", "100E", "1e3", "9" * 30]),
)
canonical_quantities = rarely(
    _odd_canonical,
    st.one_of(
        st.integers(0, 4).map(str),
        st.integers(0, 100).map(str),
        st.integers(1000, 81920).map(str),
        st.integers(0, 8),
    ),
    one_in=12,
)
"""Non-negative quantities as the API server stores them (strings; integers as older
clients and tests/unit/corekit.py write them): mostly device counts, percentages and
MiB, sometimes any suffix or size."""

hostile_quantities = st.one_of(
    canonical_quantities,
    quantity_strings(),
    st.sampled_from(HOSTILE_STRINGS),
    big_ints,
    any_floats,
    st.none(),
    st.booleans(),
    junk,
)
"""Anything a resource map may hold: quantities of every spelling, odd strings, huge
and negative numbers, floats, None, nested junk."""

# --- pods ------------------------------------------------------------------------------

names = st.text("abcxyz-0189.", min_size=1, max_size=10)
label_keys = st.one_of(
    names,
    st.sampled_from(["kubernetes.io/hostname", "topology.kubernetes.io/zone", "gpu"]),
    text,
)
labels = st.dictionaries(label_keys, st.one_of(names, text), max_size=4)

_ANNOTATION_VALUES: dict[str, list[str]] = {
    rq.USE_GPUTYPE: ["A100", "Tesla V100-PCIE-32GB,T4", ",", " , "],
    rq.NOUSE_GPUTYPE: ["T4", ""],
    rq.USE_UUID[0]: ["GPU-1,GPU-2", ""],
    rq.USE_UUID[1]: ["GPU-1"],
    rq.NOUSE_UUID[0]: ["GPU-3"],
    rq.NOUSE_UUID[1]: [","],
    rq.GPU_INDEX: ["0", "0,1", "1,x", "-1", "\u0661", "\u00b2", "1" * 4301],
    rq.VGPU_MODE[0]: ["hami-core", "mig", "mps", "vnpu", "MIG"],
    rq.VGPU_MODE[1]: ["mig", "hami-core"],
    rq.NODE_POLICY: ["binpack", "spread", "fgd", "Binpack"],
    rq.GPU_POLICY: ["binpack", "spread", "fgd", "numa", "topology-aware"],
    rq.NUMA_BIND: ["true", "false", "TRUE", "yes"],
    rq.PODGROUP_POLICY: ["spread", "binpack", "", "pack"],
    rq.VNPU_MODE: ["hami-core", "vnpu"],
    rq.GROUP_NAME: ["job-a", ""],
    rq.TASK_SPEC: ["worker", ""],
    rq.VNPU_LEVEL: ["low", "high", "mid"],
    rq.VNPU_DVPP: ["yes", "no", "null", "maybe"],
    ann.GRANT: ["[]", "{}", "null", '[{"container": "c"}]'],
    ann.SIGNATURE: ["v1:", "v1:AAAA"],
    ann.NODE: ["node-1"],
    "hami.io/vgpu-node": ["node-1"],
    "hami.io/vgpu-devices-allocated": ["GPU-1,NVIDIA,1000,10:;"],
    "volcano.sh/vgpu-ids-new": ["GPU-1,NVIDIA,1000,10:;"],
}
ANNOTATION_KEYS = sorted(_ANNOTATION_VALUES)
"""Every annotation key shared/core/request.py and shared/core/annotations.py read."""


@st.composite
def pod_annotations(draw: st.DrawFn) -> dict[str, str]:
    """Annotations on the keys the parser reads, with valid, odd or random values."""
    keys = draw(st.lists(st.sampled_from(ANNOTATION_KEYS), max_size=4, unique=True))
    out = {k: draw(rarely(text, st.sampled_from(_ANNOTATION_VALUES[k]), 4)) for k in keys}
    out.update(draw(st.dictionaries(text, text, max_size=2)))
    return out


def _vendor_groups() -> list[list[str]]:
    groups: dict[tuple[str, str], list[str]] = {}
    for name, res in PARSER.table.by_name.items():
        chip = res.chip.chip_name if res.chip else ""
        groups.setdefault((res.vendor, chip), []).append(name)
    return sorted(sorted(g) for g in groups.values())


VENDOR_GROUPS = _vendor_groups()
OTHER_RESOURCES = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "pods",
    "hugepages-2Mi",
    "example.com/foo",
    "attachable-volumes-csi",
    "nvidia.com/gpu-typo",
]
"""Resource names no device role has: node fit counts them (shared/core/hosts.py)."""
RESOURCE_NAMES = [*DEVICE_NAMES, *OTHER_RESOURCES]


_BY_ROLE: dict[rq.Role, st.SearchStrategy[int]] = {
    rq.Role.COUNT: st.integers(0, 4),
    rq.Role.WHOLE: st.integers(0, 4),
    rq.Role.NPU_COUNT: st.integers(0, 4),
    rq.Role.MEMORY: st.integers(0, 81920),
    rq.Role.SHARE_MEMORY: st.integers(0, 81920),
    rq.Role.NPU_MEMORY: st.integers(0, 70000),
    rq.Role.MEMORY_PERCENT: st.integers(0, 100),
    rq.Role.CORES: st.integers(0, 100),
    rq.Role.NPU_CORES: st.integers(0, 100),
    rq.Role.PRIORITY: st.integers(0, 1),
    rq.Role.NPU_MINDCLUSTER: st.sampled_from([0, 1, 2, 3, 4, 8, 16]),
}
"""Values that suit each device role: requests a placement could grant."""


def _role_groups() -> list[dict[rq.Role, list[str]]]:
    groups: dict[tuple[str, str], dict[rq.Role, list[str]]] = {}
    for name, res in sorted(PARSER.table.by_name.items()):
        chip = res.chip.chip_name if res.chip and res.role != rq.Role.NPU_MINDCLUSTER else ""
        groups.setdefault((res.vendor, chip), {}).setdefault(res.role, []).append(name)
    return [groups[k] for k in sorted(groups)]


ROLE_GROUPS = _role_groups()
"""Per vendor (and Ascend chip): its resource names by role."""
_COUNTS = (rq.Role.COUNT, rq.Role.NPU_COUNT, rq.Role.WHOLE, rq.Role.SHARE_MEMORY)
_SLICES = (rq.Role.MEMORY, rq.Role.MEMORY_PERCENT, rq.Role.CORES, rq.Role.PRIORITY)


@st.composite
def device_requests(draw: st.DrawFn) -> dict[str, Any]:
    """One vendor's request as a user would write it: one count-like name (a count,
    Volcano's whole count or share memory, MindCluster's cores), maybe memory, a
    percentage, cores or a priority, one name each, with values that suit them."""
    roles = draw(st.sampled_from(ROLE_GROUPS))
    counts = [r for r in (*_COUNTS, rq.Role.NPU_MINDCLUSTER) if r in roles]
    chosen = [draw(st.sampled_from(counts))] if counts else []
    if chosen and chosen[0] in (rq.Role.COUNT, rq.Role.NPU_COUNT):
        slices = [r for r in (*_SLICES, rq.Role.NPU_MEMORY) if r in roles]
        chosen += draw(st.lists(st.sampled_from(slices), max_size=2, unique=True)) if slices else []
    out: dict[str, Any] = {}
    for role in chosen:
        value = draw(_BY_ROLE[role].filter(lambda v: v > 0) if role in _COUNTS else _BY_ROLE[role])
        out[draw(st.sampled_from(roles[role]))] = draw(st.sampled_from([str(value), value]))
    return out


@st.composite
def resource_maps(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> dict[str, Any]:
    """A resource map: a request as a user would write it (:func:`device_requests`) or
    names of one vendor with any of ``values``; cpu, memory and other names mixed in."""
    if draw(st.booleans()):
        out = draw(device_requests())
    else:
        group = draw(st.sampled_from(VENDOR_GROUPS))
        keys = draw(st.lists(st.sampled_from(group), max_size=4, unique=True))
        out = {k: draw(values) for k in keys}
    for key in draw(st.lists(st.sampled_from(OTHER_RESOURCES), max_size=2, unique=True)):
        out.setdefault(key, draw(values))
    return out


_env = st.fixed_dictionaries(
    {"name": st.sampled_from([rq.ENV_CORE_POLICY, rq.ENV_DISABLE_CONTROL, "PATH"])},
    optional={"value": st.one_of(st.sampled_from(["true", "TRUE", "force", ""]), text)},
)
_ports = st.fixed_dictionaries(
    {"containerPort": st.integers(1, 65535)},
    optional={
        "hostPort": st.integers(0, 65535),
        "protocol": st.sampled_from(["TCP", "UDP", "SCTP"]),
        "hostIP": st.sampled_from(["", "0.0.0.0", "10.0.0.1", "::"]),
    },
)


def containers(values: st.SearchStrategy[Any], init: bool = False) -> st.SearchStrategy[Any]:
    """One container with requests and limits drawn from ``values``."""
    optional: dict[str, st.SearchStrategy[Any]] = {
        "resources": st.fixed_dictionaries(
            {}, optional={"limits": resource_maps(values), "requests": resource_maps(values)}
        ),
        "env": st.lists(_env, max_size=3),
        "ports": st.lists(_ports, max_size=2),
    }
    if init:  # restartPolicy Always: a sidecar
        optional["restartPolicy"] = st.sampled_from(["Always", "OnFailure", "Never"])
    return st.fixed_dictionaries({"name": st.one_of(names, text)}, optional=optional)


@st.composite
def repeated(draw: st.DrawFn, element: st.SearchStrategy[Any], min_size: int, max_size: int) -> Any:
    """A list of ``min_size`` to ``max_size`` items, cycling through up to four drawn
    ones (copied): long lists at the cost of short ones. Half are of at most four items."""
    distinct = draw(st.lists(element, min_size=max(min_size, 1), max_size=4))
    size = draw(st.one_of(st.integers(min_size, 4), st.integers(min_size, max_size)))
    return [copy.deepcopy(distinct[i % len(distinct)]) for i in range(size)]


gt_values = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.from_regex(r"[+-]?[0-9]{1,40}", fullmatch=True),
    st.sampled_from(["1" * 4301, "-" + "9" * 4400, "0" * 4400 + "1", "-" + "0" * 30]),
    text,
)
"""Values of node selector requirements: integers in and out of int64 (for ``Gt`` and
``Lt``), of more digits than int() reads, and random text."""

_operators = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "in", ""])
_node_requirement = st.fixed_dictionaries(
    {"key": label_keys, "operator": _operators},
    optional={"values": st.lists(gt_values, max_size=3)},
)
_field_requirement = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["metadata.name", "metadata.namespace", "spec.nodeName"]),
        "operator": _operators,
    },
    optional={"values": st.lists(names, max_size=2)},
)
_node_term = st.fixed_dictionaries(
    {},
    optional={
        "matchExpressions": st.lists(_node_requirement, max_size=3),
        "matchFields": st.lists(_field_requirement, max_size=2),
    },
)
_label_selector = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": labels,
        "matchExpressions": st.lists(
            st.fixed_dictionaries(
                {"key": label_keys, "operator": _operators},
                optional={"values": st.lists(names, max_size=2)},
            ),
            max_size=2,
        ),
    },
)
_affinity_term = st.fixed_dictionaries(
    {"topologyKey": label_keys},
    optional={
        "labelSelector": _label_selector,
        "namespaces": st.lists(names, max_size=2),
        "namespaceSelector": _label_selector,
        "matchLabelKeys": st.lists(label_keys, max_size=2),
        "mismatchLabelKeys": st.lists(label_keys, max_size=2),
    },
)
_pod_affinity = st.fixed_dictionaries(
    {},
    optional={
        "requiredDuringSchedulingIgnoredDuringExecution": st.lists(_affinity_term, max_size=2),
        "preferredDuringSchedulingIgnoredDuringExecution": st.lists(
            st.fixed_dictionaries(
                {"weight": st.integers(0, 100), "podAffinityTerm": _affinity_term}
            ),
            max_size=2,
        ),
    },
)
_affinity = st.fixed_dictionaries(
    {},
    optional={
        "nodeAffinity": st.fixed_dictionaries(
            {},
            optional={
                "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries(
                    {"nodeSelectorTerms": st.lists(_node_term, max_size=3)}
                ),
                "preferredDuringSchedulingIgnoredDuringExecution": st.lists(
                    st.fixed_dictionaries(
                        {"weight": st.integers(0, 100), "preference": _node_term}
                    ),
                    max_size=2,
                ),
            },
        ),
        "podAffinity": _pod_affinity,
        "podAntiAffinity": _pod_affinity,
    },
)
_toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": label_keys,
        "operator": st.sampled_from(["Equal", "Exists", "Lt", ""]),
        "value": text,
        "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute", ""]),
        "tolerationSeconds": st.integers(0, 3600),
    },
)
_spread = st.fixed_dictionaries(
    {"maxSkew": st.integers(1, 5), "topologyKey": label_keys},
    optional={
        "whenUnsatisfiable": st.sampled_from(["DoNotSchedule", "ScheduleAnyway"]),
        "labelSelector": _label_selector,
        "minDomains": st.integers(1, 5),
        "nodeAffinityPolicy": st.sampled_from(["Honor", "Ignore"]),
        "nodeTaintsPolicy": st.sampled_from(["Honor", "Ignore"]),
        "matchLabelKeys": st.lists(label_keys, max_size=2),
    },
)


def _pods(values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    metadata: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
        {"name": names, "uid": names},
        optional={
            "namespace": names,
            "labels": labels,
            "annotations": pod_annotations(),
            "resourceVersion": st.integers(1, 10**6).map(str),
            "creationTimestamp": st.sampled_from(["2024-01-02T03:04:05Z", ""]),
            "deletionTimestamp": st.sampled_from(["2024-01-02T03:04:05Z"]),
        },
    )
    spec = st.fixed_dictionaries(
        {"containers": repeated(containers(values), min_size=1, max_size=50)},
        optional={
            "initContainers": st.lists(containers(values, init=True), max_size=4),
            "schedulerName": st.sampled_from(["tessera", "default-scheduler", "volcano"]),
            "nodeName": names,
            "priority": st.integers(-(2**31), 2**31 - 1),
            "nodeSelector": labels,
            "affinity": _affinity,
            "tolerations": st.lists(_toleration, max_size=3),
            "topologySpreadConstraints": st.lists(_spread, max_size=2),
            "hostNetwork": st.booleans(),
            "overhead": st.dictionaries(st.sampled_from(["cpu", "memory"]), values, max_size=2),
            "resources": st.fixed_dictionaries(
                {}, optional={"limits": resource_maps(values), "requests": resource_maps(values)}
            ),
        },
    )
    status = st.fixed_dictionaries(
        {}, optional={"phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed"])}
    )
    return st.fixed_dictionaries(
        {"metadata": metadata, "spec": spec},
        optional={"status": status, "apiVersion": st.just("v1"), "kind": st.just("Pod")},
    )


api_pods = _pods(canonical_quantities)
"""Pods as the API server returns them: every field of its type, odd values."""

hostile_pods = st.one_of(_pods(hostile_quantities), mutated(_pods(hostile_quantities)), junk)
"""Pods with quantities of every spelling and type, random parts retyped or replaced by
junk, or junk outright."""

# --- nodes -----------------------------------------------------------------------------

_uuid_lists = st.lists(st.one_of(st.sampled_from(["GPU-1", " GPU-2 ", ""]), text), max_size=4)

_node_annotations = st.dictionaries(
    st.sampled_from([*ann.CORDON_ANNOTATIONS, "other"]), _uuid_lists.map(",".join), max_size=3
)
"""Node annotations: the cordon lists shared/core/annotations.py reads, odd entries."""

api_nodes = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": names}, optional={"labels": labels, "annotations": _node_annotations}
        )
    },
    optional={
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "taints": st.lists(
                    st.fixed_dictionaries(
                        {
                            "key": label_keys,
                            "effect": st.sampled_from(
                                ["NoSchedule", "PreferNoSchedule", "NoExecute"]
                            ),
                        },
                        optional={"value": text},
                    ),
                    max_size=3,
                ),
                "unschedulable": st.booleans(),
            },
        ),
        "status": st.fixed_dictionaries(
            {},
            optional={
                "allocatable": st.dictionaries(
                    st.sampled_from(RESOURCE_NAMES), canonical_quantities, max_size=5
                ),
                "capacity": st.dictionaries(
                    st.sampled_from(RESOURCE_NAMES), canonical_quantities, max_size=5
                ),
            },
        ),
    },
)

hostile_nodes = st.one_of(mutated(api_nodes), junk)

# --- grants ----------------------------------------------------------------------------


def grant_texts(valid: str) -> st.SearchStrategy[str]:
    """``tessera.io/grant`` values: ``valid`` itself, it with bytes cut or changed,
    JSON of any shape, and random text."""
    data = msgspec.json.decode(valid)
    return st.one_of(
        st.just(valid),
        mutated(st.just(data)).map(lambda v: msgspec.json.encode(v).decode()),
        json_values.map(lambda v: msgspec.json.encode(v).decode()),
        text_edits(valid),
        text,
    )


@st.composite
def text_edits(draw: st.DrawFn, base: str) -> str:
    """``base`` truncated, with a character replaced, inserted or removed."""
    out = base
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(out)))
        edit = draw(st.sampled_from(["cut", "replace", "insert", "delete"]))
        char = draw(st.one_of(st.sampled_from(list('{}[]",:0-.e\\ ')), SAFE_CHARS))
        if edit == "cut":
            out = out[:i]
        elif edit == "replace":
            out = out[:i] + char + out[i + 1 :]
        elif edit == "insert":
            out = out[:i] + char + out[i:]
        else:
            out = out[:i] + out[i + 1 :]
    return out


# --- schema-shaped values (config, inventory, events) ----------------------------------

Overrides = Mapping[str, st.SearchStrategy[Any]]


def _ints(t: msgspec.inspect.IntType, within: bool) -> st.SearchStrategy[int]:
    """Integers in the type's range, its edges often; unless ``within``, rarely just
    outside it or beyond int64."""
    lo = t.ge if t.ge is not None else t.gt + 1 if t.gt is not None else -3
    hi = t.le if t.le is not None else t.lt - 1 if t.lt is not None else lo + 1000
    inside = st.one_of(st.sampled_from([lo, lo + 1, hi]), st.integers(lo, hi))
    outside = st.sampled_from([lo - 1, hi + 1, 2**63, -(2**63) - 1])
    return inside if within else rarely(outside, inside)


def _floats(t: msgspec.inspect.FloatType, within: bool) -> st.SearchStrategy[float]:
    """Floats in the type's range, its edges often; unless ``within``, rarely just
    outside it, NaN or an infinity."""
    lo = next((b for b in (t.ge, t.gt) if b is not None), -10.0)
    hi = next((b for b in (t.le, t.lt) if b is not None), 1e6)
    edges = [v for v in (t.ge, t.le) if v is not None]
    edges += [math.nextafter(v, math.inf) for v in (t.gt,) if v is not None]
    edges += [math.nextafter(v, -math.inf) for v in (t.lt,) if v is not None]
    inside = st.one_of(
        st.floats(lo, hi, exclude_min=t.gt is not None, exclude_max=t.lt is not None),
        st.sampled_from(edges or [lo]),
    )
    outside = st.sampled_from([lo - 1e-9, hi + 1e-9, math.nan, -1e308, 1e308, math.inf, -math.inf])
    return inside if within else rarely(outside, inside)


def schema_values(
    t: Any,
    overrides: Overrides | None = None,
    strings: st.SearchStrategy[str] = text,
    *,
    within: bool = False,
) -> st.SearchStrategy[Any]:
    """Builtin values shaped like the msgspec type ``t`` (a type or its
    ``msgspec.inspect`` info): every struct field by its wire name, of its type, with
    values at and around each constraint's bounds (only within them if ``within``).
    ``overrides`` replace the strategy of the fields so named."""
    info = t if isinstance(t, msgspec.inspect.Type) else msgspec.inspect.type_info(t)
    return _schema(info, overrides or {}, strings, within)


def _schema(
    t: Any, over: Overrides, strings: st.SearchStrategy[str], within: bool
) -> st.SearchStrategy[Any]:
    i = msgspec.inspect

    def inner(x: Any) -> st.SearchStrategy[Any]:
        return _schema(x, over, strings, within)

    if isinstance(t, i.Metadata):
        return inner(t.type)
    if isinstance(t, i.StructType):
        fields = {
            f.encode_name: over[f.encode_name] if f.encode_name in over else inner(f.type)
            for f in t.fields
        }
        if t.array_like:
            return st.tuples(*fields.values()).map(list)
        required = {f.encode_name: fields[f.encode_name] for f in t.fields if f.required}
        optional = {k: v for k, v in fields.items() if k not in required}
        if t.tag_field is not None:
            required[t.tag_field] = st.just(t.tag)
        return st.fixed_dictionaries(required, optional=optional)
    if isinstance(t, i.ListType | i.VarTupleType | i.SetType | i.FrozenSetType):
        return st.lists(inner(t.item_type), max_size=3)
    if isinstance(t, i.TupleType):
        return st.tuples(*(inner(x) for x in t.item_types)).map(list)
    if isinstance(t, i.DictType):
        return st.dictionaries(inner(t.key_type), inner(t.value_type), max_size=3)
    if isinstance(t, i.UnionType):
        return st.one_of(*(inner(x) for x in t.types))
    if isinstance(t, i.LiteralType):
        return st.sampled_from(list(t.values))
    if isinstance(t, i.EnumType):
        return st.sampled_from([e.value for e in t.cls])
    if isinstance(t, i.IntType):
        return _ints(t, within)
    if isinstance(t, i.FloatType):
        return _floats(t, within)
    if isinstance(t, i.StrType):
        return strings
    if isinstance(t, i.BoolType):
        return st.booleans()
    if isinstance(t, i.NoneType):
        return st.none()
    return json_values


HOSTILE_NUMBERS = [-1, -(2**63) - 1, 2**63, 10**4299, math.inf, -math.inf, math.nan, -0.5, 1e308]
"""Numbers no count, size, duration or scaling may be."""


@st.composite
def one_number_changed(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """A value of ``base`` with one of its numbers replaced by one of
    :data:`HOSTILE_NUMBERS` (a value otherwise valid: its checks all pass but one)."""
    value = copy.deepcopy(draw(base))
    numbers = [
        p
        for p in _paths(value)
        if p and isinstance(_get(value, p), int | float) and not isinstance(_get(value, p), bool)
    ]
    if not numbers:
        return value
    path = draw(st.sampled_from(numbers))
    _get(value, path[:-1])[path[-1]] = draw(st.sampled_from(HOSTILE_NUMBERS))
    return value


# --- config ----------------------------------------------------------------------------

RESOURCE_NAME_POOL = ["nvidia.com/gpu", "nvidia.com/gpumem", "x/y", "a/b", "hygon.com/dcunum", ""]
"""Resource names config values are drawn from: few, so that two device blocks often
claim the same one (shared/config.py must refuse it)."""


def config_dicts() -> st.SearchStrategy[Any]:
    """``tessera.yaml`` contents: every section and key, values at and around their
    bounds, random parts replaced by junk; or junk outright."""
    from shared.config import ROLE_KEYS, Config

    name = rarely(st.sampled_from(RESOURCE_NAME_POOL), text)
    resource = st.one_of(name, st.lists(name, max_size=3))
    over = {key: resource for key in ROLE_KEYS}
    over["resourceName"] = name
    shaped = schema_values(Config, over)
    return st.one_of(
        shaped, mutated(shaped), junk, one_number_changed(schema_values(Config, within=True))
    )


@st.composite
def yaml_texts(draw: st.DrawFn, documents: st.SearchStrategy[Any]) -> str:
    """YAML text: a document dumped (half the time as is), or it edited character by
    character, a number in it made 4400 digits long, random text, scalars PyYAML cannot
    build, or brackets nested deep."""
    import yaml

    dumped = yaml.dump(draw(documents), Dumper=yaml.CSafeDumper, allow_unicode=draw(st.booleans()))
    long_number = re.sub(r"(?<![\w.])[0-9]+(?![\w.])", "1" * 4400, dumped, count=1)
    odd = st.one_of(
        text_edits(dumped),
        st.text(SAFE_CHARS),
        st.just(long_number),  # more digits than int() reads
        st.sampled_from(["a: 2024-13-45", "a: !!timestamp x", "a: !!int abc", "a: !!set {x}"]),
        nested_texts,
    )
    return draw(st.one_of(st.just(dumped), odd))


@st.composite
def file_bytes(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> bytes:
    """A file's bytes: one of ``texts`` in UTF-8, one time in four with bytes that are
    not UTF-8 put in."""
    data = draw(texts).encode()
    if draw(st.integers(0, 3)):
        return data
    i = draw(st.integers(0, len(data)))
    return data[:i] + draw(st.sampled_from([b"\x80", b"\xff", b"\xc3", b"\xed\xa0\x80"])) + data[i:]


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` deep, built without recursion (the value itself is what
    a recursive reader must survive)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


depths = st.one_of(st.integers(1, 1500), st.sampled_from([99, 101, 300, 600, 1000, 1500, 5000]))
"""Nesting depths, often about where a reader gives up: MAX_DEPTH of the watcher (100),
PyYAML's recursion (a few hundred), Python's (1000)."""

nested_texts = st.builds(
    lambda n, flow: flow[0] * n + flow[1] + flow[2] * n,
    depths,
    st.sampled_from([("[", "", "]"), ('{"a": ', "1", "}"), ("[{a: ", "1", "}]")]),
)
"""JSON and YAML text nested up to 5000 deep (a recursive reader fails near 1000)."""


# --- inventory files -------------------------------------------------------------------


def _bounded(value: Any) -> Any:
    """``value`` with every ``replicas`` and ``count`` above 8 but within their bounds
    made 8: a file of many nodes is valid but only takes long to expand (those above the
    bounds stay, to be refused)."""
    from services.node_agent.simulate import MAX_COUNT, MAX_REPLICAS

    if isinstance(value, dict):
        limits = {"replicas": MAX_REPLICAS, "count": MAX_COUNT}
        return {
            k: 8 if k in limits and isinstance(v, int) and 8 < v <= limits[k] else _bounded(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_bounded(v) for v in value]
    return value


def inventory_docs() -> st.SearchStrategy[Any]:
    """Inventory files (services/node_agent/simulate.py's format) as data: names with
    and without ``{i}``, with other braces, often the same in two nodes."""
    from services.node_agent.simulate import MAX_COUNT, MAX_REPLICAS, Inventory

    odd_names = ["gpu-{x}", "gpu-{", "gpu-}", "gpu-{0}", "{i}{i}", "{{i}}", "gpu-{i:03}"]
    over = {
        "replicas": st.one_of(st.integers(-1, 3), st.just(MAX_REPLICAS + 1)),
        "count": st.one_of(st.integers(-1, 4), st.just(MAX_COUNT + 1)),
        "name": st.one_of(
            st.sampled_from(["a", "gpu-{i}"]), names, text, st.sampled_from(odd_names)
        ),
    }
    shaped = schema_values(Inventory, over)
    return st.one_of(
        shaped,
        mutated(shaped),
        junk,
        one_number_changed(schema_values(Inventory, over, within=True)),
    ).map(_bounded)


# --- npu-smi ---------------------------------------------------------------------------

DATA = Path(__file__).parent / "data"
NPU_SMI = [(DATA / n).read_text() for n in ("npu-smi-910b3.txt", "npu-smi-310p.txt")]
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_CHIP_ROW = re.compile(r"^\|\s*[0-9]+(\s+[0-9]+)?\s*\|\s*[0-9A-Fa-f]{4}:")
_WORDS = st.sampled_from(
    ["NA", "lots", "-", "", "one", "0x1F", "1e9", "-5", "9" * 25, "9" * 4301, "\u00b2", "1\u00b2"]
)


@st.composite
def npu_smi_outputs(draw: st.DrawFn) -> str:
    """``npu-smi info`` output of tests/data, damaged: truncated, junk lines inserted,
    lines dropped or repeated, numbers replaced by words (often in a chip's row: its
    AICore and memory columns), characters changed."""
    lines = draw(st.sampled_from(NPU_SMI)).splitlines()
    for _ in range(draw(st.integers(1, 6))):
        edit = draw(st.sampled_from(["junk", "drop", "repeat", "word", "chip", "chars", "cut"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        chips = [n for n, line in enumerate(lines) if _CHIP_ROW.match(line)]
        if edit == "chip" and chips:
            edit, i = "word", draw(st.sampled_from(chips))
        if not lines:
            lines = [draw(st.text(SAFE_CHARS, max_size=40))]
            continue
        if edit == "junk":
            row = draw(
                st.one_of(
                    st.text(SAFE_CHARS, max_size=80),
                    st.builds(
                        lambda a, b, c: f"| {a} | {b} | {c} |",
                        st.text(SAFE_CHARS, max_size=12),
                        st.text(SAFE_CHARS, max_size=12),
                        st.text(SAFE_CHARS, max_size=30),
                    ),
                )
            )
            lines.insert(i, row.replace("\n", " ").replace("\r", " "))
        elif edit == "drop":
            del lines[i]
        elif edit == "repeat":
            lines.insert(i, lines[i])
        elif edit == "word":
            numbers = list(_NUMBER.finditer(lines[i]))
            if numbers:
                m = draw(st.sampled_from(numbers))
                line = lines[i]
                lines[i] = line[: m.start()] + draw(_WORDS) + line[m.end() :]
        elif edit == "chars":
            lines[i] = draw(text_edits(lines[i]))
        else:
            cut = "\n".join(lines)[: draw(st.integers(0, sum(len(x) + 1 for x in lines)))]
            lines = cut.splitlines()
    return "\n".join(lines)


# --- kubelet checkpoint ----------------------------------------------------------------

CHECKPOINT = {
    "Data": {
        "PodDeviceEntries": [
            {
                "PodUID": "uid-1",
                "ContainerName": "main",
                "ResourceName": "nvidia.com/gpu",
                "DeviceIDs": {"0": ["GPU-1"]},
                "AllocResp": "CgQKAkE=",
            },
            {"PodUID": "uid-2", "ContainerName": "side", "ResourceName": "nvidia.com/gpu"},
        ],
        "RegisteredDevices": {"nvidia.com/gpu": ["GPU-1", "GPU-2"]},
    },
    "Checksum": 1234567890,
}
"""A kubelet device-manager checkpoint (kubelet_internal_checkpoint) for pods uid-1 and uid-2."""

checkpoint_texts = st.one_of(
    mutated(st.just(CHECKPOINT)).map(lambda v: msgspec.json.encode(v).decode()),
    text_edits(msgspec.json.encode(CHECKPOINT).decode()),
    json_values.map(lambda v: msgspec.json.encode(v).decode()),
    st.text(SAFE_CHARS),
    nested_texts,
    nested_texts.map(lambda t: '{"Data": {"PodDeviceEntries": ' + t.replace("1", "") + "}}"),
)

# --- Volcano objects -------------------------------------------------------------------

_int32 = st.integers(-(2**31), 2**31 - 1)
_quantity_map = st.dictionaries(st.sampled_from(RESOURCE_NAMES), canonical_quantities, max_size=3)
podgroups = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": names}, optional={"namespace": names})},
    optional={
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "minMember": _int32,
                "minTaskMember": st.dictionaries(text, _int32, max_size=3),
                "queue": text,
                "priorityClassName": text,
                "minResources": _quantity_map,
            },
        )
    },
)
queues = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": names})},
    optional={
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "weight": _int32,
                "capability": _quantity_map,
                "guarantee": st.fixed_dictionaries({}, optional={"resource": _quantity_map}),
                "reclaimable": st.booleans(),
                "priority": _int32,
                "state": text,
            },
        ),
        "status": st.fixed_dictionaries({}, optional={"state": text}),
    },
)
_job_metadata = st.fixed_dictionaries({"name": names, "uid": names}, optional={"namespace": names})
shallow_jobs = st.fixed_dictionaries(
    {"metadata": _job_metadata},
    optional={"spec": st.dictionaries(text, json_values, max_size=4)},
)
"""Volcano Jobs of any spec nested a few levels (a mutation copies them recursively)."""
jobs = st.one_of(
    shallow_jobs,
    st.fixed_dictionaries(
        {
            "metadata": _job_metadata,
            "spec": depths.map(lambda n: {"tasks": nested(n)}),
        }
    ),
)
"""Volcano Jobs, some with a spec nested up to 5000 deep."""
