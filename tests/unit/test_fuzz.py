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
- nodes: shared/core/hosts.py ``node_spec`` and the cordon annotations; the watcher's
  ``on_node`` catches nothing.
- grants: shared/core/annotations.py ``read_grants`` (None when unreadable) and
  ``signed`` (a bool).
- bus events: shared/events.py ``decode``; shared/bus.py ``Bus._deliver`` drops what
  raises its ``except`` types.
- config: shared/config.py ``parse`` and ``load``; shared/runtime.py ``main_entry``
  turns its ``except`` types into a one-line exit.
- node agent files: services/node_agent/simulate.py ``load_inventory`` and
  services/node_agent/inventory.py ``FileSource`` (SystemExit with the reason), npu-smi
  output (``parse_npu_smi``, called with no ``except`` around it) and the kubelet
  checkpoint (services/node_agent/admission.py ``admitted_in_checkpoint``: None when
  unreadable).
- Volcano objects: the watcher's ``podgroup_event``, ``queue_event`` and ``job_event``,
  called by ``Mirror.on_event`` with no ``except`` around them.

Inputs that trigger a bug already found are kept out of the strategies
(tests/strategies.py, ``EXCLUDED``) and checked by the ``xfail(strict=True)`` tests at the
end of this file, one per bug.
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
import tempfile
import textwrap
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.node_agent.admission import admitted_in_checkpoint
from services.node_agent.inventory import AscendSource, FileSource, parse_npu_smi
from services.node_agent.simulate import expand, load_inventory
from services.watcher.service import (
    Watcher,
    _timestamp,
    job_event,
    podgroup_event,
    queue_event,
)
from shared import config, kube, runtime
from shared import events as ev
from shared.bus import Bus
from shared.core import annotations as ann
from shared.core.hosts import go_int64, node_spec, pod_spec
from shared.core.model import ContainerGrant, DeviceGrant, DeviceUUID, NodeName, PodRequest
from shared.core.quantity import parse_nano, parse_quantity, parse_whole
from shared.core.request import GROUP_NAME, TASK_SPEC, RequestParser
from shared.core.spec import DeviceSpecs
from tests import strategies as s
from tests.samples import sample_events

FUZZ = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
"""No deadline (a slow CI machine must not fail a test) and no size or speed health
checks (pods of fifty containers are meant to be large); max_examples is the profile's
(tests/conftest.py)."""


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
BUS_DROPS = caught_around(Bus._deliver, "events.decode(")
"""What the bus catches around decoding a message (it drops the message)."""
CONFIG_REJECTS = caught_around(runtime.main_entry, "config_module.load(")
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
    """Every device request the parser accepts is usable: at least one device, memory
    and cores never negative, percentages 1 to 100, cores at most 100 percent of a device."""
    for container in request.containers:
        for d in container.devices:
            assert d.count >= 1, d
            assert d.memory_mib is None or d.memory_mib >= 0, d
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
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    phase = (obj.get("status") or {}).get("phase", "Pending")
    annotations = meta.get("annotations") or {}
    grants = ann.read_grants(annotations) or ()
    host = pod_spec(obj, MANAGED)
    made: list[ev.Event] = [
        ev.PodDeleted(pod=ref, node=None, grants=grants, phase=phase),
        ev.PodUpdated(
            pod=ref,
            node=NodeName("node-1"),
            phase=phase,
            grants=grants,
            resource_version=meta.get("resourceVersion", ""),
            spec=host,
            scheduler_name=spec.get("schedulerName", ""),
            signature=annotations.get(ann.SIGNATURE, ""),
        ),
    ]
    parsed = parser.parse(obj)
    if isinstance(parsed, PodRequest):
        made.append(
            ev.PodPending(
                pod=ref,
                request=parsed,
                scheduler_name=spec.get("schedulerName", ""),
                group=annotations.get(GROUP_NAME) or None,
                task=annotations.get(TASK_SPEC) or None,
                priority=int(spec.get("priority") or 0),
                created_at=_timestamp(meta.get("creationTimestamp")),
                resource_version=meta.get("resourceVersion", ""),
                spec=host,
            )
        )
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
    for caught in (WATCHER_SKIPS, BUS_DROPS, CONFIG_REJECTS):
        assert caught
        assert not {BaseException, Exception} & set(caught)
    assert issubclass(msgspec.ValidationError, msgspec.DecodeError)
    assert issubclass(msgspec.ValidationError, BUS_DROPS)
    assert set(CONFIG_REJECTS) == {config.ConfigError}


# --- quantities ------------------------------------------------------------------------


@FUZZ
@given(st.one_of(s.hostile_quantities, s.quantity_strings(), st.text()))
def test_a_quantity_is_a_number_or_a_value_error(value: Any) -> None:
    """parse_quantity, parse_whole and parse_nano (shared/core/quantity.py) agree on
    what is a quantity, raise ValueError with a message on anything else, and give the
    same number: parse_nano is the exact value in billionths, rounded up."""
    try:
        exact = parse_quantity(value)
    except ValueError as exc:
        rejected(exc, (ValueError,))
        for other in (parse_whole, parse_nano):
            with pytest.raises(ValueError, match=r"\S"):
                other(value)
        return
    assert isinstance(exact, Fraction)
    if exact.denominator == 1:
        assert parse_whole(value) == exact
    else:
        with pytest.raises(ValueError, match=r"\S"):
            parse_whole(value)
    if exact >= 0:  # negative ones round the other way for strings (see the xfail below)
        assert parse_nano(value) == math.ceil(exact * 10**9)
    else:
        assert abs(parse_nano(value) - exact * 10**9) < 1


# --- pods ------------------------------------------------------------------------------


@FUZZ
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


@FUZZ
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
@given(st.one_of(st.text(), s.text, s._gt_values, st.from_regex(r"\s?[+-]{0,2}[0-9_]{0,25}\s?")))
def test_go_int64_is_strconv_parse_int(text: str) -> None:
    """shared/core/hosts.py go_int64: base-10 digits with one optional sign, in int64,
    else None; never an exception."""
    import re

    value = go_int64(text)
    if re.fullmatch(r"[+-]?[0-9]+", text) and -(2**63) <= int(text) < 2**63:
        assert value == int(text)
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
def test_a_hostile_node_raises_only_what_the_watcher_skips_for_pods(node: Any) -> None:
    """Any node-like value: read, or one of the exception types a pod may raise, with a
    message (``on_node`` catches nothing; the same types keep it able to)."""
    try:
        spec = node_spec(node)
        ann.cordoned_devices(node["metadata"].get("annotations") or {})
    except Exception as exc:
        rejected(exc, WATCHER_SKIPS)
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
    s.ascii_text,
)
def test_a_grant_annotation_is_read_or_none(others: dict[str, str], grant: str, given: str) -> None:
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
    assert ann.signed(KEY, "uid", "node-1", grants, given) is (given == good)
    assert ann.signed(None, "uid", "node-1", grants, given) is True


# --- bus events ------------------------------------------------------------------------


def _builtins(event: ev.Event) -> Any:
    return msgspec.json.decode(ev.encode(event))


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
)
"""Random bytes, JSON of any shape, events of every type with values at and beyond
their bounds, the sample events with parts replaced, retyped, cut or changed."""


@FUZZ
@given(event_payloads)
def test_a_bus_message_is_an_event_or_dropped(data: bytes) -> None:
    """shared/events.py decode: an event, or an exception the bus drops (with a message);
    a decoded event encodes and decodes to itself."""
    try:
        event = ev.decode(data)
    except Exception as exc:
        rejected(exc, BUS_DROPS)
        return
    assert isinstance(event, ev.EVENT_TYPES)
    survives_the_bus(event)


# --- config ----------------------------------------------------------------------------


@FUZZ
@given(s.config_dicts())
def test_a_config_is_parsed_or_refused_with_a_message(data: Any) -> None:
    """shared/config.py parse: a Config, or ConfigError with a message. A Config builds
    the request parser (every service does at start), hashes, and parses again from its
    own builtins (what ``tessera config`` dumps) to itself."""
    try:
        cfg = config.parse(data)
    except Exception as exc:
        rejected(exc, CONFIG_REJECTS)
        return
    RequestParser(cfg.devices, clamp_cores=cfg.scheduler.cores_above_100 == "clamp")
    assert config.config_hash(cfg)
    assert config.parse(msgspec.to_builtins(cfg)) == cfg


@FUZZ
@given(s.yaml_texts(s.config_dicts()))
def test_a_config_file_is_loaded_or_refused_with_a_message(text: str) -> None:
    """shared/config.py load on a file of any (UTF-8) text: a Config or ConfigError."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tessera.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            config.load(path)
        except Exception as exc:
            rejected(exc, CONFIG_REJECTS)


# --- node agent: inventory files, npu-smi, kubelet checkpoint --------------------------


@FUZZ
@given(s.yaml_texts(s.inventory_docs()), s.names)
def test_an_inventory_file_is_read_or_stops_the_agent_with_the_reason(text: str, node: str) -> None:
    """load_inventory and FileSource.read: the devices, or SystemExit with the reason.
    Every device is usable and its report survives the bus."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "inventory.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            nodes = expand(load_inventory(path))
        except yaml.YAMLError:
            return  # EXCLUDED: test_an_inventory_file_that_is_not_yaml_stops_with_the_reason
        except BaseException as exc:
            rejected(exc, (SystemExit,))
            return
        for name, (_, devices) in nodes.items():
            for d in devices:
                assert d.memory_mib >= 1, d
                assert d.cores >= 1, d
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
    stop): chips with non-negative numbers, whose devices survive the bus."""
    for chip in parse_npu_smi(text):
        assert min(chip.npu, chip.chip, chip.logic_id, chip.memory_mib) >= 0, chip
        assert chip.memory_used_mib >= 0, chip
        assert all((chip.name, chip.health, chip.bus_id)), chip
    devices = AscendSource(CONFIG, run=lambda: text).read()
    survives_the_bus(ev.NodeInventory(node=NodeName("n"), devices=devices, config_hash="h"))


def test_the_sample_checkpoint_names_its_pods() -> None:
    text = msgspec.json.encode(s.CHECKPOINT).decode()
    assert admitted_in_checkpoint(text) == {"uid-1", "uid-2"}


@FUZZ
@given(s.checkpoint_texts)
def test_a_kubelet_checkpoint_is_read_or_none(text: str) -> None:
    """admitted_in_checkpoint: a set of pod UIDs, or None; never an exception (the
    agent's recovery calls it with no ``except`` around)."""
    found = admitted_in_checkpoint(text)
    assert found is None or all(isinstance(uid, str) for uid in found)


# --- Volcano objects -------------------------------------------------------------------


@FUZZ
@given(s.podgroups, s.queues, s.jobs)
def test_volcano_objects_become_events(
    podgroup: dict[str, Any], queue: dict[str, Any], job: dict[str, Any]
) -> None:
    """PodGroups, Queues and Jobs as the API server returns them: events with usable
    values (``Mirror.on_event`` catches nothing) that survive the bus."""
    group = podgroup_event(podgroup)
    assert group.min_member >= 1
    assert queue_event(queue).weight >= 0
    for event in (group, queue_event(queue), job_event(job)):
        survives_the_bus(event)


# --- bugs found: one test each, xfail until fixed --------------------------------------


def bug(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=reason)


@bug("parse_quantity(float('inf')) raises OverflowError, not ValueError as documented")
def test_an_infinite_float_is_not_a_quantity() -> None:
    with pytest.raises(ValueError, match=r"\S"):
        parse_quantity(float("inf"))


@bug("parse_nano('-1.5n') is -2 but parse_nano(-1.5e-9) is -1: strings round down")
def test_parse_nano_rounds_negative_strings_up_as_it_does_floats() -> None:
    assert parse_nano("-1.5n") == math.ceil(Fraction(-3, 2)) == parse_nano(-1.5e-9)


@bug("a cores value of 1e5000 makes RequestParser.parse raise ValueError (int to str)")
def test_a_huge_core_request_is_an_error_not_an_exception() -> None:
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpucores": "1e5000"}}}
            ]
        },
    }
    parsed = PARSER.parse(pod)
    assert not isinstance(parsed, PodRequest)


@bug("go_int64 of more than 4300 digits raises ValueError instead of returning None")
def test_go_int64_of_a_very_long_number_is_none() -> None:
    assert go_int64("1" * 4301) is None


@bug("pod_spec raises ValueError on a preferred node affinity Gt value of 4301 digits")
def test_a_pod_with_a_very_long_gt_value_is_read() -> None:
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
    pod_spec(pod, MANAGED)


@bug("annotations.signed raises TypeError for a non-ASCII grant signature")
def test_a_non_ascii_signature_is_not_tesseras() -> None:
    assert ann.signed(KEY, "uid", "node-1", GRANTS, "v1:é") is False


@bug("events.decode raises RecursionError on a JobUpdated spec nested 1000 deep")
def test_a_deeply_nested_event_is_dropped() -> None:
    data = (
        b'{"type":"job.updated","namespace":"a","name":"b","uid":"c","spec":{"x":'
        + b"[" * 1000
        + b"]" * 1000
        + b"}}"
    )
    with pytest.raises(BUS_DROPS):
        ev.decode(data)


@bug("events.decode accepts a NodeInventory device with memory_mib=-1 and index=-1")
def test_an_event_with_negative_memory_is_dropped() -> None:
    data = (
        b'{"type":"node.inventory","node":"n","config_hash":"h","devices":[{"uuid":"GPU-1",'
        b'"index":-1,"vendor":"nvidia","model":"m","memory_mib":-1}]}'
    )
    with pytest.raises(BUS_DROPS):
        ev.decode(data)


@bug("config.load raises UnicodeDecodeError, not ConfigError, on a file that is not UTF-8")
def test_a_config_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tessera.yaml"
    path.write_bytes(b"scheduler: {names: [\xff]}\n")
    with pytest.raises(config.ConfigError, match=r"\S"):
        config.load(path)


@bug("config.load raises RecursionError, not ConfigError, on YAML nested 600 deep")
def test_a_deeply_nested_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tessera.yaml"
    path.write_text("[" * 600 + "]" * 600)
    with pytest.raises(config.ConfigError, match=r"\S"):
        config.load(path)


@bug("config.parse accepts .inf for durations and scaling (resyncS, ackWaitS, ...)")
@pytest.mark.parametrize(
    "data",
    [
        {"scheduler": {"resyncS": math.inf}},
        {"scheduler": {"heartbeatS": math.inf}},
        {"nats": {"ackWaitS": math.inf}},
        {"devices": {"nvidia": {"deviceMemoryScaling": math.inf}}},
    ],
)
def test_an_infinite_duration_or_scaling_is_refused(data: dict[str, Any]) -> None:
    with pytest.raises(config.ConfigError, match=r"\S"):
        config.parse(data)


@bug("config.parse accepts one resource name as two roles of one device block")
def test_one_resource_name_with_two_roles_is_refused() -> None:
    data = {"devices": {"nvidia": {"resourceCountName": "x/y", "resourceMemoryName": "x/y"}}}
    with pytest.raises(config.ConfigError, match=r"\S"):
        config.parse(data)


@bug("load_inventory raises yaml.YAMLError (or UnicodeDecodeError), not SystemExit")
@pytest.mark.parametrize("content", [b"nodes: [", b"nodes: [{name: \xff}]"])
def test_an_inventory_file_that_is_not_yaml_stops_with_the_reason(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_bytes(content)
    with pytest.raises(SystemExit, match=r"\S"):
        load_inventory(path)


@bug("simulate.expand raises KeyError/ValueError/IndexError on a node name with braces")
@pytest.mark.parametrize("name", ["gpu-{x}", "gpu-{", "gpu-{0}"])
def test_an_inventory_node_name_with_braces_stops_with_the_reason(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": name}]}))
    with pytest.raises(SystemExit, match=r"\S"):
        expand(load_inventory(path))


@bug("parse_npu_smi raises ValueError on a '²' AICore column or a 4301-digit number")
@pytest.mark.parametrize("usage", ["\u00b2           0    / 0", "0           0    / " + "9" * 4301])
def test_npu_smi_output_with_odd_digits_is_read(usage: str) -> None:
    text = (
        "| 0     910B3               | OK            | 97.8        37                0    / 0 |\n"
        f"| 0                         | 0000:C1:00.0  | {usage} |\n"
    )
    parse_npu_smi(text)


@bug("admitted_in_checkpoint raises RecursionError on JSON nested 1000 deep")
def test_a_deeply_nested_checkpoint_is_none() -> None:
    assert admitted_in_checkpoint("[" * 1000 + "]" * 1000) is None
