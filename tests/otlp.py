"""A real OTLP/gRPC trace receiver for tests: what a collector's ``otlp`` receiver is to
the services, on a free loopback port, keeping every span it is sent.

It serves opentelemetry-proto's ``TraceService`` over plaintext gRPC, so a process
pointed at :attr:`OtlpReceiver.endpoint` (``OTEL_EXPORTER_OTLP_ENDPOINT``, or
``telemetry.otlpEndpoint``) exports to it exactly as it would to a collector, through
the same exporter, wire format and channel. Spans are flattened into
:class:`ReceivedSpan` (ids as hex, the resource's attributes beside each span's), and
the gRPC metadata of every call is kept, so headers can be checked as well.

It is grpcio's threaded server, not ``grpc.aio``'s: an aio server runs each call as a
task of the test's event loop, which the suite's ``no_leaked_tasks`` fixture
(tests/conftest.py) rightly reports while exporters keep calling; threads leave the
test's loop alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.helpers import eventually


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver got it."""

    service: str
    """The ``service.name`` resource attribute of the process that sent it."""
    name: str
    trace_id: str
    """32 hex digits, as in a W3C ``traceparent``."""
    span_id: str
    parent_id: str
    """Empty for a root span."""
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    kvs: list[KeyValue] = list(pairs)
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class OtlpReceiver(pb_grpc.TraceServiceServicer):
    """The receiver: :meth:`start`, point exporters at :attr:`endpoint`, read
    :attr:`spans` (or wait with :meth:`wait_for`), :meth:`stop`."""

    host: str = "127.0.0.1"
    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    """The gRPC metadata of each Export call (``OTEL_EXPORTER_OTLP_HEADERS`` lands here)."""
    _server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``: the scheme says plaintext, as the spec reads it."""
        return f"http://{self.host}:{self.port}"

    def Export(  # noqa: N802 (the generated servicer's name)
        self, request: pb.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> pb.ExportTraceServiceResponse:
        """Called on the server's threads; ``list.append`` needs no lock."""
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            resource=resource,
                        )
                    )
        return pb.ExportTraceServiceResponse()

    def start(self) -> None:
        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp"))
        pb_grpc.add_TraceServiceServicer_to_server(self, server)
        self.port = server.add_insecure_port(f"{self.host}:{self.port}")
        server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            stopped = self._server.stop(grace=0)
            await asyncio.to_thread(stopped.wait, 10)
            self._server = None

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(
        self,
        probe: Callable[[list[ReceivedSpan]], Any],
        *,
        timeout_s: float = 30.0,
        what: str = "spans",
    ) -> Any:
        """``probe(spans)`` once it answers something truthy; fails at the deadline."""

        async def check() -> Any:
            return probe(list(self.spans))

        return await eventually(check, timeout_s=timeout_s, interval_s=0.2, what=what)


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """A started receiver on a free loopback port, stopped on exit."""
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        await receiver.stop()
