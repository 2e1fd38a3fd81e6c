"""Tracing set-up: the ``OTEL_*`` environment and the ``telemetry`` keys, their
precedence, bad values (replaced and said, never fatal), the one ``traces:`` line, and a
real export through the OTLP gRPC exporter to tests/otlp.py's receiver."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from shared.config import TelemetryConfig
from shared.telemetry import resolve
from tests.otlp import otlp_receiver

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No ``OTEL_*`` variable of the machine running the tests leaks in."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_export_nothing_and_sample_every_new_trace() -> None:
    setup = resolve("binder", TelemetryConfig())
    assert (setup.disabled, setup.endpoint, setup.problems) == (False, "", [])
    assert setup.sampler_name == "parentbased_traceidratio 1"
    assert setup.resource.attributes["service.name"] == "binder"
    assert setup.resource.attributes["service.namespace"] == "tessera"
    assert setup.summary() == (
        "traces: not exported (neither telemetry.otlpEndpoint nor OTEL_EXPORTER_OTLP_ENDPOINT "
        "is set; trace context still propagates), sampler parentbased_traceidratio 1, "
        "service.name binder"
    )


@pytest.mark.parametrize(
    ("sampler", "arg", "name", "description"),
    [
        ("always_on", "", "always_on", "AlwaysOnSampler"),
        ("always_off", "", "always_off", "AlwaysOffSampler"),
        ("traceidratio", "0.25", "traceidratio 0.25", "TraceIdRatioBased{0.25}"),
        ("traceidratio", "", "traceidratio 1", "TraceIdRatioBased{1.0}"),  # no arg: 1.0
        ("parentbased_always_on", "", "parentbased_always_on", "ParentBased{root:AlwaysOn"),
        ("parentbased_always_off", "", "parentbased_always_off", "ParentBased{root:AlwaysOff"),
        (
            "parentbased_traceidratio",
            "0.1",
            "parentbased_traceidratio 0.1",
            "ParentBased{root:TraceIdRatioBased{0.1}",
        ),
        ("ParentBased_Always_On", "", "parentbased_always_on", "ParentBased{root:AlwaysOn"),
        ("always_on", "0.5", "always_on", "AlwaysOnSampler"),  # its arg is not read
    ],
)
def test_each_sampler_of_the_specification(
    clean_env: pytest.MonkeyPatch, sampler: str, arg: str, name: str, description: str
) -> None:
    clean_env.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg:
        clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    setup = resolve("watcher", TelemetryConfig())
    assert setup.sampler_name == name
    assert setup.sampler.get_description().startswith(description)
    assert setup.problems == []


def test_an_explicit_sample_ratio_wins_over_the_environment(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("OTEL_TRACES_SAMPLER", "always_off")
    setup = resolve("watcher", TelemetryConfig(sample_ratio=0.1))
    assert setup.sampler_name == "parentbased_traceidratio 0.1"
    assert setup.problems == [
        "OTEL_TRACES_SAMPLER='always_off' ignored: telemetry.sampleRatio is set; "
        "using parentbased_traceidratio 0.1 (telemetry.sampleRatio)"
    ]


def test_a_sampler_arg_without_a_sampler_is_said_to_be_ignored(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    setup = resolve("watcher", TelemetryConfig())
    assert setup.sampler_name == "parentbased_traceidratio 1"
    assert setup.problems == [
        "OTEL_TRACES_SAMPLER_ARG='0.5' ignored: OTEL_TRACES_SAMPLER is not set; "
        "using parentbased_traceidratio 1 (telemetry.sampleRatio)"
    ]


def test_an_unknown_sampler_falls_back_to_the_config(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("OTEL_TRACES_SAMPLER", "jaeger_remote")
    setup = resolve("watcher", TelemetryConfig())
    assert setup.sampler_name == "parentbased_traceidratio 1"
    [problem] = setup.problems
    assert problem.startswith("OTEL_TRACES_SAMPLER='jaeger_remote' is not one of always_on,")
    assert problem.endswith("; using parentbased_traceidratio 1 (telemetry.sampleRatio)")


@pytest.mark.parametrize("arg", ["abc", "1.5", "-0.1", "nan", "inf"])
def test_a_bad_ratio_is_replaced_by_one(clean_env: pytest.MonkeyPatch, arg: str) -> None:
    clean_env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    setup = resolve("watcher", TelemetryConfig())
    assert setup.sampler_name == "parentbased_traceidratio 1"
    assert setup.problems == [
        f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a number from 0 to 1; "
        "using parentbased_traceidratio 1"
    ]


@pytest.mark.parametrize(
    ("config", "env", "endpoint", "source"),
    [
        (
            "",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
            "http://c:4317",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            "",
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4317",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
            },
            "http://traces:4317",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        (
            "http://config:4317",
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317"},
            "http://config:4317",
            "telemetry.otlpEndpoint",
        ),
        (  # blank counts as unset
            "",
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": " ", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:1"},
            "c:1",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
    ],
)
def test_endpoint_precedence(
    clean_env: pytest.MonkeyPatch, config: str, env: dict[str, str], endpoint: str, source: str
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    setup = resolve("binder", TelemetryConfig(otlp_endpoint=config))
    assert setup.endpoint == endpoint
    assert setup.endpoint_from == source


@pytest.mark.parametrize(
    ("endpoint", "env", "insecure", "problem"),
    [
        ("http://c:4317", {}, True, ""),
        ("https://c:4317", {}, False, ""),
        ("HTTP://c:4317", {}, True, ""),
        ("c:4317", {}, False, ""),  # no scheme, no flag: TLS
        ("c:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, True, ""),
        ("c:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "TRUE"}, True, ""),
        ("c:4317", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}, True, ""),
        (
            "c:4317",
            {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
            False,
            "",
        ),
        ("http://c:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, True, ""),
        (
            "https://c:4317",
            {"OTEL_EXPORTER_OTLP_INSECURE": "true"},
            False,
            "OTEL_EXPORTER_OTLP_INSECURE='true' ignored: the endpoint https://c:4317 names its "
            "scheme, which decides (TLS)",
        ),
        (
            "http://c:4317",
            {"OTEL_EXPORTER_OTLP_INSECURE": "false"},
            True,
            "OTEL_EXPORTER_OTLP_INSECURE='false' ignored: the endpoint http://c:4317 names its "
            "scheme, which decides (plaintext)",
        ),
        (
            "http://c:4317",
            {"OTEL_EXPORTER_OTLP_INSECURE": "maybe"},
            True,
            "OTEL_EXPORTER_OTLP_INSECURE='maybe' ignored: the endpoint http://c:4317 names its "
            "scheme, which decides (plaintext)",
        ),
        (
            "c:4317",
            {"OTEL_EXPORTER_OTLP_INSECURE": "yes"},
            False,
            "OTEL_EXPORTER_OTLP_INSECURE='yes' is neither true nor false; using false",
        ),
    ],
)
def test_transport_security(
    clean_env: pytest.MonkeyPatch, endpoint: str, env: dict[str, str], insecure: bool, problem: str
) -> None:
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    for name, value in env.items():
        clean_env.setenv(name, value)
    setup = resolve("binder", TelemetryConfig())
    assert setup.insecure is insecure
    assert setup.problems == ([problem] if problem else [])


def test_an_endpoint_without_a_host_is_not_exported(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://")
    setup = resolve("binder", TelemetryConfig())
    assert (setup.endpoint, setup.problems) == ("", [])
    assert setup.summary().startswith(
        "traces: not exported (OTEL_EXPORTER_OTLP_ENDPOINT='http://' names no host; "
    )


def test_the_summary_names_target_transport_sampler_and_service(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.observability:4317/")
    clean_env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
    assert resolve("binder", TelemetryConfig()).summary() == (
        "traces: OTLP gRPC to collector.observability:4317 (TLS, from "
        "OTEL_EXPORTER_OTLP_ENDPOINT), sampler parentbased_traceidratio 0.1, service.name binder"
    )


def test_service_name_and_resource_attributes(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "deployment.environment=prod,service.namespace=gpu,service.name=from-attributes",
    )
    attributes = resolve("binder", TelemetryConfig()).resource.attributes
    assert attributes["deployment.environment"] == "prod"
    assert attributes["service.namespace"] == "gpu"
    assert attributes["service.name"] == "from-attributes"
    clean_env.setenv("OTEL_SERVICE_NAME", "tessera-binder")  # wins over the attributes
    setup = resolve("binder", TelemetryConfig())
    assert setup.service_name == "tessera-binder"
    assert setup.resource.attributes["deployment.environment"] == "prod"


@pytest.mark.parametrize(
    ("value", "disabled", "problems"),
    [
        ("true", True, []),
        ("TRUE", True, []),
        ("false", False, []),
        ("1", False, ["OTEL_SDK_DISABLED='1' is neither true nor false; using false"]),
    ],
)
def test_sdk_disabled(
    clean_env: pytest.MonkeyPatch, value: str, disabled: bool, problems: list[str]
) -> None:
    clean_env.setenv("OTEL_SDK_DISABLED", value)
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")
    setup = resolve("binder", TelemetryConfig(otlp_endpoint="http://config:4317"))
    assert setup.disabled is disabled
    assert setup.problems == problems
    if disabled:
        assert setup.summary().startswith("traces: off (OTEL_SDK_DISABLED=true)")


# setup_tracing installs the process's one tracer provider: each case runs in a process
# of its own, as a service does, and exports for real to the receiver.
PROBE = """
from opentelemetry import trace
from shared.config import TelemetryConfig
from shared.telemetry import setup_logging, setup_tracing, tracer
setup_logging("probe")
setup_tracing("probe", TelemetryConfig())
with tracer().start_as_current_span("probe span"):
    pass
trace.get_tracer_provider().shutdown()  # flushes the batch
"""


async def _probe(env: dict[str, str]) -> str:
    """Run PROBE with ``env`` over the (OTEL_*-free) environment; its log."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PROBE,
        cwd=REPO,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    text = out.decode()
    assert proc.returncode == 0, text
    return text


async def test_spans_reach_an_otlp_receiver_named_by_the_environment() -> None:
    async with otlp_receiver() as receiver:
        text = await _probe(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_EXPORTER_OTLP_INSECURE": "true",
                "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc",
                "OTEL_SERVICE_NAME": "tessera-probe",
                "OTEL_TRACES_SAMPLER": "always_on",
            }
        )
        [span] = await receiver.wait_for(lambda spans: spans, what="the probe's span")
    assert (span.name, span.service, span.parent_id) == ("probe span", "tessera-probe", "")
    assert span.resource["service.namespace"] == "tessera"
    assert any(m.get("authorization") == "Bearer abc" for m in receiver.metadata)
    lines = [line for line in text.splitlines() if " traces: " in line]
    assert len(lines) == 1, text
    assert lines[0].endswith(
        f"traces: OTLP gRPC to 127.0.0.1:{receiver.port} (plaintext, from "
        "OTEL_EXPORTER_OTLP_ENDPOINT), sampler always_on, service.name tessera-probe"
    )


async def test_bad_values_are_said_once_and_never_stop_the_service() -> None:
    async with otlp_receiver() as receiver:
        text = await _probe(
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
                "OTEL_TRACES_SAMPLER": "sometimes",
                "OTEL_TRACES_SAMPLER_ARG": "often",
            }
        )
        await receiver.wait_for(lambda spans: spans, what="the probe's span")
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, text
    assert "OTEL_TRACES_SAMPLER='sometimes' is not one of" in warnings[0]
    assert "sampler parentbased_traceidratio 1, service.name probe" in text


async def test_an_exporter_that_cannot_be_made_leaves_the_service_running() -> None:
    text = await _probe(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}
    )
    [line] = [line for line in text.splitlines() if " traces: " in line]
    assert " WARNING " in line
    assert "traces: not exported (the OTLP exporter for c:4317 could not be made: " in line


async def test_sdk_disabled_records_and_exports_nothing() -> None:
    async with otlp_receiver() as receiver:
        text = await _probe(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SDK_DISABLED": "true"}
        )
        await asyncio.sleep(0.5)
    assert receiver.spans == []
    assert "traces: off (OTEL_SDK_DISABLED=true)" in text
