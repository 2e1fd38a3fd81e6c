"""OpenTelemetry and logging set-up shared by every service.

One trace per scheduling attempt: the bus injects W3C trace context into message
headers and extracts it on delivery (shared/bus.py), so the spans of watcher,
coordinator, allocator and binder join one trace. Exporting is optional: with no OTLP
endpoint configured, spans are still created and propagated but go nowhere.

Where traces go, how they are sampled and what the process is called follow the
OpenTelemetry specification's environment variables (``OTEL_EXPORTER_OTLP_*``,
``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_SDK_DISABLED``) as well as the ``telemetry`` config keys. :func:`resolve` decides
from both, without side effects, and says in one line what it decided; docs/tracing.md
is the user's page.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind

from shared.config import TelemetryConfig

TRACER_NAME = "tessera"

log = logging.getLogger(__name__)

_NO_ENDPOINT = "neither telemetry.otlpEndpoint nor OTEL_EXPORTER_OTLP_ENDPOINT is set"
"""Why nothing is exported when nothing says where to."""

_SAMPLERS: dict[str, Callable[[float], Sampler]] = {
    "always_on": lambda _: ALWAYS_ON,
    "always_off": lambda _: ALWAYS_OFF,
    "traceidratio": TraceIdRatioBased,
    "parentbased_always_on": lambda _: ParentBased(ALWAYS_ON),
    "parentbased_always_off": lambda _: ParentBased(ALWAYS_OFF),
    "parentbased_traceidratio": lambda ratio: ParentBased(TraceIdRatioBased(ratio)),
}
"""``OTEL_TRACES_SAMPLER`` values: the specification's, but ``jaeger_remote`` and
``xray`` (which need a remote service or another package)."""
_RATIO_SAMPLERS = {"traceidratio", "parentbased_traceidratio"}
"""The samplers that take ``OTEL_TRACES_SAMPLER_ARG``."""
_DEFAULT_SAMPLER = "parentbased_traceidratio"
"""With no ``OTEL_TRACES_SAMPLER``: ``telemetry.sampleRatio`` of new traces, and what the
caller decided for the rest (a span that continues a trace keeps its sampled flag)."""


@dataclass(frozen=True)
class TraceSetup:
    """What :func:`resolve` decided for one process: the exporter, sampler, resource."""

    disabled: bool
    """``OTEL_SDK_DISABLED=true``: no span is recorded, nothing is exported."""
    endpoint: str
    """OTLP gRPC endpoint as given (scheme included); empty: not exported."""
    endpoint_from: str
    """Which key or variable gave ``endpoint``."""
    insecure: bool
    """Plaintext gRPC (True) or TLS."""
    sampler: Sampler
    sampler_name: str
    """The sampler as the specification names it, with its ratio: ``traceidratio 0.1``."""
    resource: Resource
    problems: list[str] = field(default_factory=list)
    """One line per value that was ignored or replaced, naming it and what was used."""
    unexported: str = _NO_ENDPOINT
    """Why nothing is exported, when ``endpoint`` is empty."""

    @property
    def target(self) -> str:
        """``host:port`` the exporter dials (the endpoint without its scheme)."""
        return urlparse(self.endpoint).netloc if _scheme(self.endpoint) else self.endpoint

    @property
    def service_name(self) -> str:
        """The ``service.name`` resource attribute spans are recorded under."""
        return str(self.resource.attributes.get("service.name", ""))

    def summary(self, sink: str | None = None) -> str:
        """The one ``traces:`` line a service logs at start."""
        if self.disabled:
            return "traces: off (OTEL_SDK_DISABLED=true): no span is recorded or exported"
        if sink is not None:
            where = f"to {sink} (in process)"
        elif self.endpoint:
            tls = "plaintext" if self.insecure else "TLS"
            where = f"OTLP gRPC to {self.target} ({tls}, from {self.endpoint_from})"
        else:
            where = f"not exported ({self.unexported}; trace context still propagates)"
        return f"traces: {where}, sampler {self.sampler_name}, service.name {self.service_name}"


def resolve(service: str, cfg: TelemetryConfig) -> TraceSetup:
    """Decide, from ``cfg`` and the environment, where traces go, how they are sampled
    and the process's resource.

    Precedence, for each setting: a config key that is set wins over the environment,
    the environment over the built-in defaults.

    - Endpoint: ``telemetry.otlpEndpoint``, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
      else ``OTEL_EXPORTER_OTLP_ENDPOINT``; none of them: not exported.
    - Transport: as the specification says for OTLP/gRPC, the endpoint's scheme decides
      (``http://`` plaintext, ``https://`` TLS); an endpoint without one (``host:4317``)
      is plaintext when ``OTEL_EXPORTER_OTLP_TRACES_INSECURE`` (else
      ``OTEL_EXPORTER_OTLP_INSECURE``) is true, TLS otherwise.
    - Sampler: ``telemetry.sampleRatio`` below 1 (an explicit choice, with ParentBased);
      at its default 1.0 it counts as unset, and ``OTEL_TRACES_SAMPLER`` (with
      ``OTEL_TRACES_SAMPLER_ARG``) applies when set; otherwise
      ``parentbased_traceidratio`` at ``telemetry.sampleRatio``.
    - Resource: ``service.name`` = ``service``, ``service.namespace`` = ``tessera``,
      under ``OTEL_RESOURCE_ATTRIBUTES``, under ``OTEL_SERVICE_NAME``.
    - ``OTEL_SDK_DISABLED=true`` turns everything off, config included.

    A bad value never fails the service: it is replaced, and ``problems`` says how.
    Headers, certificates, timeout and compression (``OTEL_EXPORTER_OTLP_HEADERS``...)
    are read by the OTLP exporter itself.
    """
    env = os.environ
    problems: list[str] = []
    unexported = _NO_ENDPOINT
    disabled = _flag(env, "OTEL_SDK_DISABLED", problems) is True
    endpoint_from, endpoint = _first(
        {"telemetry.otlpEndpoint": cfg.otlp_endpoint},
        env,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    )
    insecure = _insecure(endpoint, env, problems)
    if _scheme(endpoint) and not urlparse(endpoint).netloc:
        unexported = f"{endpoint_from}={endpoint!r} names no host"
        endpoint, endpoint_from = "", ""
    name, ratio = _sampler_choice(cfg, env, problems)
    ours = {"service.name": service, "service.namespace": "tessera"}
    resource = Resource.create({**ours, **OTELResourceDetector().detect().attributes})
    return TraceSetup(
        disabled=disabled,
        endpoint=endpoint,
        endpoint_from=endpoint_from,
        insecure=insecure,
        sampler=_SAMPLERS[name](ratio),
        sampler_name=f"{name} {ratio:g}" if name in _RATIO_SAMPLERS else name,
        resource=resource,
        problems=problems,
        unexported=unexported,
    )


def _first(config: dict[str, str], env: Mapping[str, str], *names: str) -> tuple[str, str]:
    """The first non-empty of the config key, then the variables: (its name, its value)."""
    for key, value in config.items():
        if value.strip():
            return key, value.strip()
    for name in names:
        if env.get(name, "").strip():
            return name, env[name].strip()
    return "", ""


def _flag(env: Mapping[str, str], name: str, problems: list[str]) -> bool | None:
    """A boolean variable as the specification reads one: ``true`` (any case) is true,
    ``false`` false, unset or empty None; anything else is false, and said so."""
    value = env.get(name, "").strip()
    if not value:
        return None
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    problems.append(f"{name}={value!r} is neither true nor false; using false")
    return False


def _scheme(endpoint: str) -> str:
    """``http`` or ``https`` when the endpoint starts with one, else empty."""
    scheme, sep, _ = endpoint.partition("://")
    return scheme.lower() if sep and scheme.lower() in ("http", "https") else ""


def _insecure(endpoint: str, env: Mapping[str, str], problems: list[str]) -> bool:
    """Plaintext or TLS: the endpoint's scheme when it has one, else the flag."""
    name, raw = _first({}, env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")
    scheme = _scheme(endpoint)
    if not scheme:
        return bool(name) and _flag(env, name, problems) is True
    plaintext = scheme == "http"
    if name and raw.lower() != str(plaintext).lower():
        used = "plaintext" if plaintext else "TLS"
        problems.append(
            f"{name}={raw!r} ignored: the endpoint {endpoint} names its scheme, "
            f"which decides ({used})"
        )
    return plaintext


def _sampler_choice(
    cfg: TelemetryConfig, env: Mapping[str, str], problems: list[str]
) -> tuple[str, float]:
    """The sampler's name and ratio (the ratio matters only to the ratio samplers)."""
    fallback = f"{_DEFAULT_SAMPLER} {cfg.sample_ratio:g} (telemetry.sampleRatio)"
    name = env.get("OTEL_TRACES_SAMPLER", "").strip()
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if cfg.sample_ratio != 1.0 or not name:
        if name or arg:
            what = " and ".join(
                f"{var}={val!r}"
                for var, val in (("OTEL_TRACES_SAMPLER", name), ("OTEL_TRACES_SAMPLER_ARG", arg))
                if val
            )
            why = "telemetry.sampleRatio is set" if name else "OTEL_TRACES_SAMPLER is not set"
            problems.append(f"{what} ignored: {why}; using {fallback}")
        return _DEFAULT_SAMPLER, cfg.sample_ratio
    if name.lower() not in _SAMPLERS:
        problems.append(
            f"OTEL_TRACES_SAMPLER={name!r} is not one of {', '.join(_SAMPLERS)}; using {fallback}"
        )
        return _DEFAULT_SAMPLER, cfg.sample_ratio
    name = name.lower()
    if name not in _RATIO_SAMPLERS or not arg:  # the specification: no argument is 1.0
        return name, 1.0
    try:
        ratio = float(arg)
    except ValueError:
        ratio = math.nan
    if not 0.0 <= ratio <= 1.0:  # NaN fails too
        problems.append(
            f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a number from 0 to 1; using {name} 1"
        )
        return name, 1.0
    return name, ratio


_tracer: trace.Tracer | None = None


def tracer() -> trace.Tracer:
    """The tracer every service uses; a no-op until :func:`setup_tracing` runs.

    Kept once made: ``trace.get_tracer`` builds a new tracer (and compares scopes) per
    call, 8 % of the allocator's CPU per event. One made before the provider is set is
    OpenTelemetry's proxy, which follows the provider once there is one."""
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer(TRACER_NAME)
    return _tracer


def recording() -> bool:
    """Do spans go anywhere (an exporter or a test's processor is attached)?"""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return False
    sampler = provider.sampler
    return sampler.exporting if isinstance(sampler, WhenExported) else True


@contextlib.contextmanager
def span(
    name: str,
    *,
    context: otel_context.Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, str] | None = None,
) -> Iterator[trace.Span]:
    """A span of the current trace (or of ``context``'s) while spans are recorded.
    Otherwise none is made, not even a non-recording one (ids, a context switch: most
    of what tracing still cost per event): ``context``, the trace an event arrived in,
    just becomes the current one, so what is published meanwhile carries it on (a
    service that exports continues the trace of one that does not; a trace starts at
    the first service that exports)."""
    if recording():
        with tracer().start_as_current_span(
            name, context=context, kind=kind, attributes=attributes
        ) as made:
            yield made
        return
    token = otel_context.attach(context) if context is not None else None
    try:
        yield trace.INVALID_SPAN
    finally:
        if token is not None:
            otel_context.detach(token)


class WhenExported(Sampler):
    """``inner``'s decisions once spans go somewhere; until then none is recorded.

    A recorded span costs about four times a non-recording one (attributes, events, the
    processors' calls), and a service makes several per pod; with no exporter they were
    made for nothing. Tessera's own spans go through :func:`span`, which then makes
    none at all; this covers any other (a library's)."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner
        self.exporting = False

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        """``inner``'s decision while spans are exported; none is recorded before."""
        chosen = self.inner if self.exporting else ALWAYS_OFF
        return chosen.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        """The inner sampler's description (OpenTelemetry's ``Sampler`` interface)."""
        return self.inner.get_description()


def setup_tracing(
    service: str,
    cfg: TelemetryConfig,
    *,
    processor: SpanProcessor | None = None,
) -> TracerProvider:
    """Install the process's tracer provider (once) and attach an exporter.

    What goes where is :func:`resolve`'s decision (config keys, then the ``OTEL_*``
    environment, then defaults); the first call logs it in one ``traces:`` line, and
    each value it had to replace in one warning. ``processor`` lets tests attach an
    in-memory exporter instead of the OTLP one. Calling it again adds the processor to
    the provider already installed (OpenTelemetry allows one per process).
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        if processor is not None:
            current.add_span_processor(processor)
            if isinstance(current.sampler, WhenExported):
                current.sampler.exporting = True
        return current
    setup = resolve(service, cfg)
    for problem in setup.problems:
        log.warning("traces: %s", problem)
    sampler = WhenExported(setup.sampler)
    provider = TracerProvider(resource=setup.resource, sampler=sampler)
    trace.set_tracer_provider(provider)
    sink = None
    if setup.disabled:
        pass  # the SDK's provider reads OTEL_SDK_DISABLED too, and hands out no-op tracers
    elif processor is not None:
        provider.add_span_processor(processor)
        sampler.exporting = True
        sink = type(processor).__name__
    elif setup.endpoint:
        try:
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(setup)))
            sampler.exporting = True
        except Exception as exc:  # a bad OTEL_EXPORTER_OTLP_TIMEOUT, say: run, unexported
            why = f"the OTLP exporter for {setup.target} could not be made: {exc}"
            setup = replace(setup, endpoint="", unexported=why)
    failed = not (setup.disabled or sink or setup.endpoint) and setup.unexported != _NO_ENDPOINT
    log.log(logging.WARNING if failed else logging.INFO, "%s", setup.summary(sink))
    return provider


def _otlp_exporter(setup: TraceSetup) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=setup.endpoint, insecure=setup.insecure)


def setup_logging(service: str, level: str = "INFO") -> None:
    """One line per record, service name first, to stderr (kubectl logs reads it)."""
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
        force=True,
    )
