"""Fuzzing: every decoder of external input, fed random and hostile input.

Each decoder has a contract, read where it is called: the exception types its caller
handles (taken from the caller's own ``except`` clause where there is one), and what it
returns otherwise. A test fails when any other exception escapes, when a rejection
carries no message, or when a value is accepted that its consumer cannot use (an
event that does not survive the bus, a negative count, cores above 100 percent).

- pods: shared/core/request.py, shared/core/hosts.py and shared/core/quantity.py, as
  the watcher reads them (services/watcher/service.py, ``Watcher.on_pod``); it skips a
  pod whose reading raises one of the types of ``Watcher.on_pod_event``'s ``except``.
  A pod as the API server returns it must be read without any exception: the device
  allocator's rebuild (services/device_allocator/reservations.py) catches nothing.
- nodes: shared/core/hosts.py ``node_spec`` and the cordon annotations, as the
  watcher's ``on_node`` reads them; it skips a Node whose reading raises one of the
  types of its ``except``.
- grants: shared/core/annotations.py ``read_grants`` (None when unreadable) and
  ``signed`` (a bool).
- bus events: shared/events.py ``decode``; shared/bus.py ``Bus._deliver`` drops what
  raises its ``except`` types.
- config: shared/config.py ``parse`` and ``load``; shared/runtime.py ``load_or_exit``
  turns its ``except`` types into a one-line exit.
- node agent files: services/node_agent/simulate.py ``load_inventory`` and
  services/node_agent/inventory.py ``FileSource`` (SystemExit with the reason), npu-smi
  output (``parse_npu_smi``, called with no ``except`` around it) and the kubelet
  checkpoint (services/node_agent/admission.py ``admitted_in_checkpoint``: None when
  unreadable).
- Volcano objects: the watcher's ``podgroup_event``, ``queue_event`` and ``job_event``,
  called by ``Mirror.on_event``, which skips an object whose reading raises one of the
  types of its ``except``.

Inputs that trigger a bug found and still open are kept out of the strategies, or
passed over where a test meets them (tests/strategies.py, ``EXCLUDED``), and an
``xfail(strict=True)`` test checks the bug on its own; once fixed, the inputs are
generated again and the test, kept at the end of this file, checks the fix.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.node_agent.admission import admitted_in_checkpoint
from services.node_agent.ascend import HEALTHY_NPU, UNREADABLE, AscendSource, parse_npu_smi
from services.node_agent.inventory import FileSource
from services.node_agent.simulate import expand, load_inventory
from services.watcher.mirrors import Mirror
from services.watcher.service import Watcher
from services.watcher.translate import (
    MAX_DEPTH,
    job_event,
    pending_event,
    podgroup_event,
    queue_event,
    updated_event,
)
from shared import config, kube, runtime
from shared import events as ev
from shared.bus import Bus
from shared.core import annotations as ann
from shared.core.hosts import go_int64, node_spec, pod_spec
from shared.core.model import ContainerGrant, DeviceGrant, DeviceUUID, NodeName, PodRequest
from shared.core.quantity import LIMIT, parse_nano, parse_quantity, parse_whole
from shared.core.request import (
    GPU_INDEX,
    MAX_AMOUNT,
    MAX_DEVICES,
    RequestParser,
)
from shared.core.spec import GENERIC_VENDORS, DeviceSpecs, names
from tests import strategies as s
from tests.samples import sample_events

FUZZ = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
"""No deadline (a slow CI machine must not fail a test) and no size or speed health
checks (pods of fifty containers are meant to be large); max_examples is the profile's
(tests/conftest.py)."""
EXPENSIVE = settings(FUZZ, max_examples=max(100, settings().max_examples * 2 // 3))
"""For the slowest tests (YAML files, whole configs, pods of many containers): two
thirds of the profile's examples, at least 100 (the default profile: 100)."""


def caught_around(function: Callable[..., Any], call: str) -> tuple[type[BaseException], ...]:
    """The exception types of the ``except`` clauses of the ``try`` in ``function``
    whose body contains ``call``: what the caller handles, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    namespace = dict(vars(sys.modules[function.__module__]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(call in ast.unparse(b) for b in node.body):
            found: list[type[BaseException]] = []
            for handler in node.handlers:
                if handler.type is None:
                    found.append(BaseException)
                    continue
                value = eval(ast.unparse(handler.type), namespace)
                found.extend(value if isinstance(value, tuple) else (value,))
            return tuple(found)
    raise AssertionError(f"no try around {call} in {function.__qualname__}")


WATCHER_SKIPS = caught_around(Watcher.on_pod_event, "self.on_pod(")
"""What the watcher catches around reading a pod (it skips the pod and tells why)."""
NODE_SKIPS = caught_around(Watcher.on_node, "node_spec(")
"""What the watcher catches around reading a Node (it skips the Node and logs why)."""
MIRROR_SKIPS = caught_around(Mirror.on_event, "self.update(")
"""What the watcher catches around reading a PodGroup, Queue, Job or Namespace."""
BUS_DROPS = caught_around(Bus._deliver, "events.decode(")
"""What the bus catches around decoding a message (it drops the message)."""
CONFIG_REJECTS = caught_around(runtime.load_or_exit, "config_module.load(")
"""What a service's entry point catches around loading its config (a one-line exit)."""

PARSER = s.PARSER
CLAMPING = RequestParser(DeviceSpecs(), clamp_cores=True)
MANAGED = frozenset(PARSER.table.by_name)
CONFIG = config.Config()
KEY = b"k" * 32
EVENTS = sample_events()


def rejected(exc: BaseException, allowed: tuple[type[BaseException], ...]) -> None:
    """``exc`` is one of the ``allowed`` types and says why; else it is raised again,
    so the test fails with its own traceback."""
    if not isinstance(exc, allowed):
        raise exc
    assert str(exc).strip(), f"{type(exc).__name__} raised without a message"


def survives_the_bus(event: ev.Event) -> None:
    """The event encodes, and decodes to itself (shared/bus.py publishes and delivers it)."""
    assert ev.decode(ev.encode(event)) == event


def check_request(request: PodRequest, parser: RequestParser) -> None:
    """Every device request the parser accepts is usable: one to MAX_DEVICES devices,
    memory and cores never negative nor above MAX_AMOUNT, percentages 1 to 100, cores at
    most 100 percent of a device."""
    for container in request.containers:
        for d in container.devices:
            assert 1 <= d.count <= MAX_DEVICES, d
            assert d.memory_mib is None or 0 <= d.memory_mib <= MAX_AMOUNT, d
            assert d.cores <= MAX_AMOUNT, d
            assert d.memory_percent is None or 1 <= d.memory_percent <= 100, d
            assert d.cores >= 0, d
            vendor = parser.table.vendors.get(d.vendor)
            if vendor is None or vendor.core_unit == "percent":
                assert d.cores <= 100, d
            assert d.priority in (None, 0, 1), d
            assert d.npu_cores in (None, 1, 2, 4, 8), d


def watcher_reads(obj: Any, parser: RequestParser, *, decode: bool) -> PodRequest | tuple[Any, ...]:
    """What ``Watcher.on_pod`` (services/watcher/service.py) reads of a pod and the events
    it makes of them (deleted, on a node, pending or rejected), each encoded as the bus
    does, and decoded back when ``decode``. Returns the parser's answer."""
    ref = kube.pod_ref(obj)
    phase = (obj.get("status") or {}).get("phase", "Pending")
    grants = ann.read_grants(obj["metadata"].get("annotations") or {}) or ()
    host = pod_spec(obj, MANAGED)
    made: list[ev.Event] = [
        ev.PodDeleted(pod=ref, node=None, grants=grants, phase=phase),
        updated_event(obj, ref, NodeName("node-1"), phase, host),
    ]
    parsed = parser.parse(obj)
    if isinstance(parsed, PodRequest):
        made.append(pending_event(obj, ref, parsed, host))
    else:
        made.append(ev.PodRejected(pod=ref, errors=parsed))
    for event in made:
        data = ev.encode(event)
        if decode:
            assert ev.decode(data) == event
    return parsed


# --- the contracts ---------------------------------------------------------------------


def test_the_contracts_are_read_from_the_callers() -> None:
    """Each caller catches named types (a bare ``except Exception`` would make every
    fuzz test below vacuous), and the bus's covers msgspec's validation errors."""
    for caught in (WATCHER_SKIPS, NODE_SKIPS, MIRROR_SKIPS, BUS_DROPS, CONFIG_REJECTS):
        assert caught
        assert not {BaseException, Exception} & set(caught)
    assert issubclass(msgspec.ValidationError, msgspec.DecodeError)
    assert issubclass(msgspec.ValidationError, BUS_DROPS)
    assert set(CONFIG_REJECTS) == {config.ConfigError}


# --- quantities ------------------------------------------------------------------------


@FUZZ
@given(
    st.one_of(
        s.hostile_quantities, s.quantity_strings(), st.text(), st.sampled_from(s.HOSTILE_STRINGS)
    )
)
def test_a_quantity_is_a_number_or_a_value_error(value: Any) -> None:
    """parse_quantity, parse_whole and parse_nano (shared/core/quantity.py) agree on
    what is a quantity, raise ValueError with a message on anything else, and give the
    same number: parse_nano is the exact value in billionths, rounded away from zero
    (as Kubernetes rounds to nine decimals)."""
    try:
        exact = parse_quantity(value)
    except ValueError as exc:
        rejected(exc, (ValueError,))
        for other in (parse_whole, parse_nano):
            with pytest.raises(ValueError, match=r"\S"):
                other(value)
        return
    assert isinstance(exact, Fraction)
    assert not isinstance(value, str) or value.strip().isascii(), value  # Kubernetes' digits
    assert abs(exact) < LIMIT
    if exact.denominator == 1:
        assert parse_whole(value) == exact
    else:
        with pytest.raises(ValueError, match=r"\S"):
            parse_whole(value)
    nano = math.ceil(abs(exact) * 10**9)
    assert parse_nano(value) == (nano if exact >= 0 else -nano)


# --- pods ------------------------------------------------------------------------------


@EXPENSIVE
@given(s.api_pods, st.booleans())
def test_the_watcher_reads_any_pod_the_api_server_can_hold(
    pod: dict[str, Any], clamp: bool
) -> None:
    """A pod as the API server returns it, whatever its values: no exception; a valid
    request with usable values or every error with a field and a message; every event
    made of it survives the bus."""
    parser = CLAMPING if clamp else PARSER
    parsed = watcher_reads(pod, parser, decode=True)
    if isinstance(parsed, PodRequest):
        check_request(parsed, parser)
        if parsed.wants_devices:
            assert parser.wants_devices(pod)
    else:
        assert parsed
        for error in parsed:
            assert error.field.strip()
            assert error.message.strip()
    host = pod_spec(pod, MANAGED)
    assert not set(host.requests) & MANAGED
    assert all(v >= 0 for v in host.requests.values())
    assert host.nonzero_cpu >= 0
    assert host.nonzero_memory >= 0
    assert all(1 <= p.port <= 65535 for p in host.ports)


@EXPENSIVE
@given(s.hostile_pods, st.booleans())
def test_a_hostile_pod_is_read_or_skipped_by_the_watcher(pod: Any, clamp: bool) -> None:
    """Any pod-like value: read, or skipped with one of the exception types the watcher
    catches, with a message. What it accepts is still usable."""
    parser = CLAMPING if clamp else PARSER
    try:
        parsed = watcher_reads(pod, parser, decode=False)
    except Exception as exc:
        rejected(exc, WATCHER_SKIPS)
        return
    if isinstance(parsed, PodRequest):
        check_request(parsed, parser)
    else:
        assert all(e.field.strip() and e.message.strip() for e in parsed)


@FUZZ
@given(st.one_of(st.text(), s.text, s.gt_values, st.from_regex(r"\s?[+-]{0,2}[0-9_]{0,25}\s?")))
def test_go_int64_is_strconv_parse_int(text: str) -> None:
    """shared/core/hosts.py go_int64: base-10 digits with one optional sign, in int64,
    else None; never an exception."""
    value = go_int64(text)
    digits = text.lstrip("+-").lstrip("0") or "0"
    if re.fullmatch(r"[+-]?[0-9]+", text) and len(digits) <= 20:  # int() reads 4300
        number = -int(digits) if text.startswith("-") else int(digits)
        assert value == (number if -(2**63) <= number < 2**63 else None)
    else:
        assert value is None


# --- nodes -----------------------------------------------------------------------------


@FUZZ
@given(s.api_nodes)
def test_the_watcher_reads_any_node_the_api_server_can_hold(node: dict[str, Any]) -> None:
    """A Node as the API server returns it: no exception (``Watcher.on_node`` catches
    none), allocatable never negative, cordoned devices sorted, stripped and once, and
    the event survives the bus."""
    spec = node_spec(node)
    cordoned = ann.cordoned_devices(node["metadata"].get("annotations") or {})
    assert all(v >= 0 for v in spec.allocatable.values())
    assert list(cordoned) == sorted(set(cordoned))
    assert all(u and u == u.strip() for u in cordoned)
    survives_the_bus(
        ev.NodeUpdated(
            node=NodeName(spec.name),
            cordoned_devices=cordoned,
            unschedulable=spec.unschedulable,
            spec=spec,
        )
    )


@FUZZ
@given(s.hostile_nodes)
def test_a_hostile_node_is_read_or_skipped_by_the_watcher(node: Any) -> None:
    """Any node-like value: read, or skipped with one of the exception types
    ``Watcher.on_node`` catches, with a message."""
    try:
        spec = node_spec(node)
        ann.cordoned_devices(node["metadata"].get("annotations") or {})
    except Exception as exc:
        rejected(exc, NODE_SKIPS)
        return
    ev.encode(ev.NodeUpdated(node=NodeName("n"), spec=spec))


# --- grant annotations -----------------------------------------------------------------

GRANTS = (
    ContainerGrant(
        container="main",
        devices=(
            DeviceGrant(uuid=DeviceUUID("GPU-1"), memory_mib=1000, cores=30),
            DeviceGrant(uuid=DeviceUUID("GPU-2"), index=1, exclusive=True),
        ),
        priority=1,
    ),
    ContainerGrant(container="init", init=True),
)
VALID_GRANT = ann.encode_grants(GRANTS)


@FUZZ
@given(
    st.dictionaries(st.sampled_from([ann.GRANT, ann.SIGNATURE, "other"]), s.text, max_size=2),
    s.grant_texts(VALID_GRANT),
    st.one_of(s.ascii_text, s.text, st.just("v1:\u00e9")),
)
def test_a_grant_annotation_is_read_or_none(
    others: dict[str, str], grant: str, written: str
) -> None:
    """read_grants: the grants, or None when the annotation is missing or damaged, never
    an exception; what it reads encodes back to a value it reads the same. signed: a
    bool, True only for the grant's own signature."""
    annotations = {**others, ann.GRANT: grant}
    grants = ann.read_grants(annotations)
    if grants is None:
        return
    assert all(isinstance(g, ContainerGrant) for g in grants)
    assert ann.read_grants({ann.GRANT: ann.encode_grants(grants)}) == grants
    good = ann.signature(KEY, "uid", "node-1", grants)
    assert ann.signed(KEY, "uid", "node-1", grants, good) is True
    assert ann.signed(KEY, "uid", "node-1", grants, written) is (written == good)
    assert ann.signed(None, "uid", "node-1", grants, written) is True


# --- bus events ------------------------------------------------------------------------


def _builtins(event: ev.Event) -> Any:
    return msgspec.json.decode(ev.encode(event))


def not_utf8(data: bytes, i: int, bad: bytes) -> bytes:
    """``data`` with ``bad`` put at the start of one of its string values (the ``i``-th,
    counting round): a string that is not UTF-8 in an otherwise valid event."""
    starts = [m.end() for m in re.finditer(rb':"', data)]
    at = starts[i % len(starts)]
    return data[:at] + bad + data[at:]


event_payloads = st.one_of(
    st.binary(max_size=200),
    s.json_values.map(msgspec.json.encode),
    s.maybe_mutated(s.schema_values(ev.AnyEvent)).map(msgspec.json.encode),
    s.mutated(st.sampled_from([_builtins(e) for e in EVENTS])).map(msgspec.json.encode),
    st.sampled_from([ev.encode(e).decode() for e in EVENTS]).flatmap(s.text_edits).map(str.encode),
    st.builds(
        lambda data, i, j, junk: data[:i] + junk + data[j:],
        st.sampled_from([ev.encode(e) for e in EVENTS]),
        st.integers(0, 400),
        st.integers(0, 400),
        st.binary(max_size=8),
    ),
    s.nested_texts.map(str.encode),
    s.one_number_changed(st.sampled_from([_builtins(e) for e in EVENTS])).map(msgspec.json.encode),
    s.one_number_changed(s.schema_values(ev.AnyEvent, within=True)).map(msgspec.json.encode),
    st.builds(
        lambda data, i, bad: not_utf8(data, i, bad),
        st.sampled_from([ev.encode(e) for e in EVENTS]),
        st.integers(0, 100),
        st.sampled_from([b"\x80", b"\xff", b"\xc3", b"\xed\xa0\x80"]),
    ),
    st.integers(1, 1500).map(
        lambda n: (
            b'{"type":"job.updated","namespace":"a","name":"b","uid":"c","spec":{"x":'
            + b"[" * n
            + b"]" * n
            + b"}}"
        )
    ),
)
"""Random bytes, JSON of any shape or nested up to 5000 deep, events of every type with
values at and beyond their bounds (or one number wrong), the sample events with parts
replaced, retyped, cut or changed, or a string that is not UTF-8."""

COUNTED = frozenset(
    {"memory_mib", "memory_percent", "cores", "count", "index", "sm_count", "numa"}
    | {"ai_cores", "ai_cpus", "placement", "mig_placement", "npu_cores", "seq", "nodes"}
)
"""Fields of the wire types that count or index something: never negative."""


def counts(value: Any) -> list[tuple[str, Any]]:
    """Every ``(field, value)`` of :data:`COUNTED` in a value's builtins."""
    found = []
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            found += [(k, v) for k, v in item.items() if k in COUNTED and isinstance(v, int)]
            todo += item.values()
        elif isinstance(item, list):
            todo += item
    return found


@FUZZ
@given(event_payloads)
def test_a_bus_message_is_an_event_or_dropped(data: bytes) -> None:
    """shared/events.py decode: an event, or an exception the bus drops (with a message);
    a decoded event counts nothing negative, and encodes and decodes to itself."""
    try:
        event = ev.decode(data)
    except Exception as exc:
        rejected(exc, BUS_DROPS)
        return
    assert isinstance(event, ev.EVENT_TYPES)
    assert all(v >= 0 for _, v in counts(msgspec.to_builtins(event))), event
    survives_the_bus(event)


# --- config ----------------------------------------------------------------------------


@EXPENSIVE
@given(s.config_dicts())
def test_a_config_is_parsed_or_refused_with_a_message(data: Any) -> None:
    """shared/config.py parse: a Config, or ConfigError with a message. A Config gives
    each resource name one role, builds the request parser (every service does at
    start), hashes, and parses again from its own builtins (what ``tessera config``
    dumps) to itself."""
    try:
        cfg = config.parse(data)
    except Exception as exc:
        rejected(exc, CONFIG_REJECTS)
        return
    roles = resource_roles(cfg)
    assert len({name for _, name in roles}) == len(roles), roles
    for number in numbers(msgspec.to_builtins(cfg)):
        assert math.isfinite(number), number
        assert -(2**63) <= number < 2**63, number
    config.request_parser(cfg)
    assert config.config_hash(cfg)
    assert config.parse(msgspec.to_builtins(cfg)) == cfg


def numbers(value: Any) -> list[float]:
    """Every number in a value's builtins."""
    found: list[float] = []
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo += item.values()
        elif isinstance(item, list):
            todo += item
        elif isinstance(item, int | float) and not isinstance(item, bool):
            found.append(item)
    return found


def resource_roles(cfg: config.Config) -> list[tuple[str, str]]:
    """``(key, name)`` for every resource name a config gives a role: the ``resource*``
    keys of every enabled device block (a name listed twice under one key once)."""
    blocks: list[tuple[str, Any]] = [
        (f"devices.{v}", getattr(cfg.devices, v))
        for v in GENERIC_VENDORS
        if getattr(cfg.devices, v).enabled
    ]
    blocks += [(f"devices.vnpus[{i}]", chip) for i, chip in enumerate(cfg.devices.vnpus)]
    if cfg.devices.mindcluster.enabled:
        blocks.append(("devices.mindcluster", cfg.devices.mindcluster))
    found = []
    for where, block in blocks:
        for key, value in msgspec.to_builtins(block).items():
            if key.startswith("resource") or key == "gpuShareMemoryName":
                found += [(f"{where}.{key}", name) for name in dict.fromkeys(names(value))]
    return found


@EXPENSIVE
@given(s.file_bytes(s.yaml_texts(s.config_dicts())))
def test_a_config_file_is_loaded_or_refused_with_a_message(data: bytes) -> None:
    """shared/config.py load on a file of any bytes: a Config or ConfigError."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tessera.yaml"
        path.write_bytes(data)
        try:
            config.load(path)
        except Exception as exc:
            rejected(exc, CONFIG_REJECTS)


# --- node agent: inventory files, npu-smi, kubelet checkpoint --------------------------


@EXPENSIVE
@given(s.file_bytes(s.yaml_texts(s.inventory_docs())), s.names)
def test_an_inventory_file_is_read_or_stops_the_agent_with_the_reason(
    data: bytes, node: str
) -> None:
    """load_inventory and FileSource.read on a file of any bytes: the devices, or
    SystemExit with the reason. Every node has a name of its own (none overwrites
    another), every device is usable and its report survives the bus."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "inventory.yaml"
        path.write_bytes(data)
        try:
            inventory = load_inventory(path)
        except BaseException as exc:
            rejected(exc, (SystemExit,))
            return
        nodes = expand(inventory)
        assert len(nodes) == sum(n.replicas for n in inventory.nodes)
        for name, (_, devices) in nodes.items():
            assert not set(name) & set("{}"), name
            for d in devices:
                assert d.memory_mib >= 1, d
                assert d.cores >= 1, d
                assert d.sm_count >= 0, d
            survives_the_bus(ev.NodeInventory(node=name, devices=devices, config_hash="h"))
        try:
            devices = FileSource(path, node).read()
        except BaseException as exc:
            rejected(exc, (SystemExit,))
            assert node not in nodes
        else:
            assert devices == nodes[NodeName(node)][1]


@FUZZ
@given(s.npu_smi_outputs())
def test_damaged_npu_smi_output_is_read_without_an_exception(text: str) -> None:
    """parse_npu_smi (nothing catches around it: the node agent's health loop would
    stop): chips with non-negative numbers, whose devices survive the bus; a chip whose
    memory cannot be read is not healthy."""
    for chip in parse_npu_smi(text):
        assert min(chip.npu, chip.chip, chip.logic_id, chip.memory_mib) >= 0, chip
        assert chip.memory_used_mib >= 0, chip
        assert 0 <= chip.aicore_percent <= 100, chip
        assert all((chip.name, chip.health, chip.bus_id)), chip
    devices = AscendSource(CONFIG, run=lambda: text).read()
    for device, chip in zip(devices, parse_npu_smi(text), strict=True):
        assert device.healthy == (chip.health in HEALTHY_NPU), (device, chip)
    survives_the_bus(ev.NodeInventory(node=NodeName("n"), devices=devices, config_hash="h"))


def test_the_sample_checkpoint_names_its_pods() -> None:
    text = msgspec.json.encode(s.CHECKPOINT).decode()
    assert admitted_in_checkpoint(text) == {"uid-1", "uid-2"}


@FUZZ
@given(s.checkpoint_texts)
def test_a_kubelet_checkpoint_is_read_or_none(text: str) -> None:
    """admitted_in_checkpoint: a set of pod UIDs, or None; never an exception (the
    agent's recovery calls it with no ``except`` around), JSON nested deeper than the
    decoder goes included."""
    found = admitted_in_checkpoint(text)
    assert found is None or all(isinstance(uid, str) for uid in found)


# --- Volcano objects -------------------------------------------------------------------


@FUZZ
@given(s.podgroups, s.queues, s.jobs)
def test_volcano_objects_become_events(
    podgroup: dict[str, Any], queue: dict[str, Any], job: dict[str, Any]
) -> None:
    """PodGroups, Queues and Jobs as the API server returns them: events with usable
    values that survive the bus; a Job whose spec nests too deep for the bus is skipped
    with one of the types ``Mirror.on_event`` catches."""
    group = podgroup_event(podgroup)
    assert group.min_member >= 1
    assert all(n >= 0 for n in group.min_task_member.values())
    assert queue_event(queue).weight >= 0
    for event in (group, queue_event(queue)):
        survives_the_bus(event)
    try:
        survives_the_bus(job_event(job))
    except Exception as exc:
        rejected(exc, MIRROR_SKIPS)
        message = str(exc)
        assert "nests more than" in message


@FUZZ
@given(
    st.one_of(s.mutated(s.podgroups), s.mutated(s.queues), s.mutated(s.shallow_jobs), s.junk),
    st.sampled_from([podgroup_event, queue_event, job_event]),
)
def test_a_hostile_volcano_object_is_read_or_skipped_by_the_watcher(
    obj: Any, read: Callable[[Any], ev.Event]
) -> None:
    """Any PodGroup-, Queue- or Job-like value: an event that encodes, or skipped with
    one of the exception types ``Mirror.on_event`` catches, with a message."""
    try:
        event = read(obj)
    except Exception as exc:
        rejected(exc, MIRROR_SKIPS)
        return
    ev.encode(event)


# --- bugs found and fixed: one test each ----------------------------------------------
# Each was an xfail(strict=True) test until its fix; its inputs are generated above again.


def test_an_infinite_float_is_not_a_quantity() -> None:
    for parse in (parse_quantity, parse_whole, parse_nano):
        with pytest.raises(ValueError, match="not a finite number"):
            parse(float("inf"))


def test_an_absurd_quantity_is_refused_at_once() -> None:
    """A huge exponent, digit run or magnitude is a ValueError in well under a second
    (``1e3000000`` took 1.6 s of arithmetic)."""
    started = time.perf_counter()
    for value, reason in [
        ("1e3000000", "out of range"),
        ("1e-3000000", "out of range"),
        ("1" * 5000, "more digits"),
        ("1e30", "out of range"),
        (10**4299, "out of range"),
        (1e300, "out of range"),
    ]:
        for parse in (parse_quantity, parse_whole, parse_nano):
            with pytest.raises(ValueError, match=reason):
                parse(value)
    assert time.perf_counter() - started < 0.5


def test_a_quantity_has_ascii_digits_only() -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_whole("\u0661\u0662")  # Arabic-Indic 12: Kubernetes refuses it


def test_parse_nano_rounds_negative_values_away_from_zero_as_kubernetes() -> None:
    """Kubernetes reads ``-1.5n`` (and the JSON number ``-1.5e-9``) as ``-2n``: it
    rounds a quantity's magnitude up to nine decimals, then puts the sign back."""
    assert parse_nano("-1.5n") == -2 == parse_nano(-1.5e-9)
    assert parse_nano("1.5n") == 2 == parse_nano(1.5e-9)


def pod_with_limits(limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"nvidia.com/gpucores": "1e5000"}, "'1e5000' is out of range"),
        ({"nvidia.com/gpu": "1e20"}, "at most 1024 devices per container"),
        ({"nvidia.com/gpu": "1025"}, "at most 1024 devices per container"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1e12"}, "at most 16777216 per device"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 10**29}, "at most 16777216 per device"),
    ],
)
def test_a_huge_device_request_is_an_error_not_an_exception(
    limits: dict[str, Any], message: str
) -> None:
    for parser in (PARSER, CLAMPING):
        parsed = parser.parse(pod_with_limits(limits))
        assert not isinstance(parsed, PodRequest)
        assert any(message in e.message for e in parsed), parsed


def test_an_odd_device_index_is_an_error_not_an_exception() -> None:
    for index in ("\u00b2", "1" * 4301, "\u0661"):
        pod = pod_with_limits({"nvidia.com/gpu": 1})
        pod["metadata"]["annotations"] = {GPU_INDEX: index}
        parsed = PARSER.parse(pod)
        assert not isinstance(parsed, PodRequest)
        assert parsed[0].field == GPU_INDEX


def test_go_int64_of_a_very_long_number_is_none() -> None:
    assert go_int64("1" * 4301) is None
    assert go_int64("-" + "9" * 4400) is None
    assert go_int64("0" * 4400 + "1") == 1  # strconv.ParseInt takes leading zeros


def test_a_pod_with_a_very_long_gt_value_is_read() -> None:
    """A Gt value out of int64 makes its term unparseable, as any other bad Gt value
    (kube-scheduler: the term matches no node)."""
    term = {"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1" * 4301]}]}
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "containers": [{"name": "c"}],
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": term}
                    ]
                }
            },
        },
    }
    spec = pod_spec(pod, MANAGED)
    assert spec.preferred_nodes[0].term.invalid


def test_a_non_ascii_signature_is_not_tesseras() -> None:
    assert ann.signed(KEY, "uid", "node-1", GRANTS, "v1:\u00e9") is False
    assert ann.signed(KEY, "uid", "node-1", GRANTS, "\ud800") is False


def test_a_deeply_nested_event_is_dropped() -> None:
    data = (
        b'{"type":"job.updated","namespace":"a","name":"b","uid":"c","spec":{"x":'
        + b"[" * 1000
        + b"]" * 1000
        + b"}}"
    )
    with pytest.raises(BUS_DROPS, match="nested too deep"):
        ev.decode(data)


def test_an_event_too_deep_to_encode_is_an_encode_error() -> None:
    event = ev.JobUpdated(namespace="a", name="b", uid="c", spec={"tasks": s.nested(5000)})
    with pytest.raises(msgspec.EncodeError, match="JobUpdated cannot be encoded"):
        ev.encode(event)


def test_a_bus_message_with_a_string_that_is_not_utf8_is_dropped() -> None:
    data = b'{"type":"pod.deleted","phase":"\x80","pod":{"namespace":"a","name":"b","uid":"c"}}'
    with pytest.raises(BUS_DROPS, match="not UTF-8"):
        ev.decode(data)


def test_an_event_with_negative_memory_is_dropped() -> None:
    data = (
        b'{"type":"node.inventory","node":"n","config_hash":"h","devices":[{"uuid":"GPU-1",'
        b'"index":-1,"vendor":"nvidia","model":"m","memory_mib":-1}]}'
    )
    with pytest.raises(BUS_DROPS, match=">= 0"):
        ev.decode(data)


def test_a_config_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tessera.yaml"
    path.write_bytes(b"scheduler: {names: [\xff]}\n")
    with pytest.raises(config.ConfigError, match=r"tessera.yaml is not UTF-8 text: byte 20"):
        config.load(path)


def test_a_deeply_nested_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tessera.yaml"
    path.write_text("[" * 600 + "]" * 600)
    with pytest.raises(config.ConfigError, match="nests lists or mappings too deep"):
        config.load(path)


@pytest.mark.parametrize(
    "text", ["a: 2024-13-45", "a: !!timestamp x", "a: !!int abc", "a: " + "1" * 4400]
)
def test_a_config_file_with_an_unreadable_scalar_is_refused(tmp_path: Path, text: str) -> None:
    """PyYAML's safe loader raises ValueError or AttributeError on these, not YAMLError."""
    path = tmp_path / "tessera.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match="is not valid YAML"):
        config.load(path)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"scheduler": {"resyncS": math.inf}}, "scheduler.resyncS"),
        ({"scheduler": {"heartbeatS": math.inf}}, "scheduler.heartbeatS"),
        ({"scheduler": {"starvationGuardS": math.inf}}, "scheduler.starvationGuardS"),
        ({"nats": {"ackWaitS": math.inf}}, "nats.ackWaitS"),
        ({"kubernetes": {"qps": math.inf}}, "kubernetes.qps"),
        ({"devices": {"nvidia": {"deviceMemoryScaling": math.inf}}}, "nvidia.deviceMemoryScaling"),
        (
            {"nodeConfigs": [{"name": "n", "deviceCoreScaling": math.inf}]},
            "nodeConfigs[0].deviceCoreScaling",
        ),
    ],
)
def test_an_infinite_duration_or_scaling_is_refused(data: dict[str, Any], where: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(where) + "` is infinite"):
        config.parse(data)


def test_an_integer_beyond_int64_in_the_config_is_refused() -> None:
    with pytest.raises(config.ConfigError, match="fgdCandidates` is out of range"):
        config.parse({"scheduler": {"fgdCandidates": 10**4400}})


@pytest.mark.parametrize(
    ("devices", "first", "second"),
    [
        (
            {"nvidia": {"resourceCountName": "x/y", "resourceMemoryName": "x/y"}},
            "devices.nvidia.resourceCountName",
            "devices.nvidia.resourceMemoryName",
        ),
        (
            {"nvidia": {"resourceCoreName": ["a/b", "x/y"]}, "hygon": {"resourceCountName": "x/y"}},
            "devices.nvidia.resourceCoreName",
            "devices.hygon.resourceCountName",
        ),
    ],
)
def test_one_resource_name_with_two_roles_is_refused(
    devices: dict[str, Any], first: str, second: str
) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.parse({"devices": devices})
    assert f"`$.{first}`" in str(info.value)
    assert f"`$.{second}`" in str(info.value)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"nodes: [", "is not valid YAML"),
        (b"nodes: [{name: \xff}]", "is not UTF-8 text"),
        (b"[" * 1000 + b"]" * 1000, "too deep"),
        (b"nodes: [{name: a, devices: [{model: m, memory: " + b"1" * 4400 + b"}]}]", "YAML"),
    ],
)
def test_an_inventory_file_that_is_not_yaml_stops_with_the_reason(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_bytes(content)
    with pytest.raises(SystemExit, match=reason):
        load_inventory(path)


@pytest.mark.parametrize("name", ["gpu-{x}", "gpu-{", "gpu-{0}", "gpu-}", "{i:03}"])
def test_an_inventory_node_name_with_braces_stops_with_the_reason(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": name}]}))
    with pytest.raises(SystemExit, match=re.escape("the only placeholder is {i}")):
        load_inventory(path)


@pytest.mark.parametrize(
    ("nodes", "reason"),
    [
        ([{"name": "a"}, {"name": "a"}], "node 'a' is named twice"),
        ([{"name": "a", "replicas": 2}], "node 'a' is named twice"),
        ([{"name": "a{i}", "replicas": 2}, {"name": "a1"}], "node 'a1' is named twice"),
        ([{"name": "a", "replicas": 100_001}], "<= 100000"),
        ([{"name": "a", "devices": [{"model": "m", "memory": 1, "count": 65}]}], "<= 64"),
        ([{"name": "a", "devices": [{"model": "m", "memory": 1, "smCount": -1}]}], ">= 0"),
    ],
)
def test_an_inventory_with_clashing_names_or_absurd_numbers_stops_with_the_reason(
    tmp_path: Path, nodes: list[dict[str, Any]], reason: str
) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    with pytest.raises(SystemExit, match=re.escape(reason)):
        load_inventory(path)


@pytest.mark.parametrize(
    ("usage", "health"),
    [
        ("\u00b2           0    / 0", "OK"),
        ("0           0    / " + "9" * 4301, UNREADABLE),
        ("0           NA", UNREADABLE),
    ],
)
def test_npu_smi_output_with_odd_digits_is_read(usage: str, health: str) -> None:
    text = (
        "| 0     910B3               | OK            | 97.8        37                0    / 0 |\n"
        f"| 0                         | 0000:C1:00.0  | {usage} |\n"
    )
    (chip,) = parse_npu_smi(text)
    assert chip.health == health
    assert chip.aicore_percent == 0.0


def test_a_deeply_nested_checkpoint_is_none() -> None:
    assert admitted_in_checkpoint("[" * 1000 + "]" * 1000) is None


# --- the watcher skips an object it cannot read, never stops ---------------------------


class Published(list[ev.Event]):
    async def __call__(self, event: ev.Event) -> None:
        self.append(event)


async def test_the_watcher_skips_a_job_too_deep_for_the_bus(
    caplog: pytest.LogCaptureFixture,
) -> None:
    published = Published()
    jobs = Mirror(published, lambda o: o["metadata"]["name"], job_event, lambda k, _: k, what="Job")
    deep = {"metadata": {"name": "j", "namespace": "n"}, "spec": {"tasks": s.nested(5000)}}
    await jobs.on_event("ADDED", deep)
    await jobs.on_relist([deep, {"metadata": {}}])
    assert not published
    assert (
        f"Job n/j cannot be read (ValueError('its spec nests more than {MAX_DEPTH}" in caplog.text
    )
    await jobs.on_event("ADDED", {"metadata": {"name": "j", "namespace": "n"}, "spec": {}})
    assert [type(e) for e in published] == [ev.JobUpdated]


async def test_the_watcher_skips_a_node_it_cannot_read(caplog: pytest.LogCaptureFixture) -> None:
    published = Published()
    watcher = Watcher.__new__(Watcher)  # on_node needs no API server or config
    watcher.nodes = {}
    watcher.out = SimpleNamespace(put=published)  # type: ignore[assignment]
    await watcher.on_node("ADDED", {"metadata": {"name": "n1"}, "spec": {"taints": "x"}})
    await watcher.on_node_relist([{"metadata": {"labels": []}}, {"metadata": {"name": "n2"}}])
    assert "node n1 cannot be read (AttributeError(" in caplog.text
    assert [e.node for e in published if isinstance(e, ev.NodeUpdated)] == ["n2"]
