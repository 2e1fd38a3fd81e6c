"""Typed events over NATS JetStream: publish, consume with explicit ack, inventory KV.

One stream holds every subject under ``tessera.v1.>``. Each service reads through its
own durable pull consumer and acks a message only after its handler returned, so a
service that dies mid-handler gets the message again (after ``ack_wait``); handlers are
therefore idempotent (keyed by pod UID + attempt). A handler that raises is nak'ed with
a growing delay. Publishes carry ``Nats-Msg-Id`` (the event's dedup id), so a publish
retried after a lost ack is stored once.

W3C trace context rides in the message headers: ``publish`` starts a PRODUCER span and
injects it; delivery extracts it and runs the handler inside a CONSUMER span that is its
child, so one trace spans every hop.

Node inventory also lives in a KV bucket keyed by node, so a restarted allocator reads
every node at once instead of waiting for the next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, cast
from urllib.parse import ParseResult, urlsplit

import msgspec
import nats
import nats.aio.client
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    Header,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from shared import busauth, events, views
from shared.aio import Acting, GroupCommit, raise_if_cancelling
from shared.config import NatsConfig
from shared.core.model import NodeName
from shared.telemetry import recording, span

log = logging.getLogger(__name__)

MSG_ID_HEADER = "Nats-Msg-Id"
BATCH_HEADER = "Tessera-Batch"
"""On a message that carries several events (a JSON array of them): how many."""
BATCH_MAX = 256
"""The most events one message carries."""
BATCH_BYTES = 512 * 1024
"""The most bytes of events one message carries: half of NATS's default ``max_payload``
(a pod event is 0.5-5 KB; one larger than this goes alone)."""
NO_RESPONDERS = "503"
"""The status of a request no one answered (no stream holds the subject, yet)."""
PULL_EXPIRES_S = 1.0
"""How long one pull request waits on the server for its messages (see ``_Pull``)."""
PULL_GRACE_S = 0.5
"""How long past a pull request's expiry a consumer waits for the server's answer before
asking again (the request was lost with a server, or in a reconnect)."""
ACK_DELAY_S = 0.05
"""How long a consumer gathers the acks of handled messages before sending them in one
write (see ``_Pull``)."""
PUBLISH_ACK_S = 5.0
"""How long a pipelined publish waits for JetStream's ack (nats-py's own default for one)."""
PUBLISH_WINDOW = 4096
"""The most publishes awaiting JetStream's answers at once (nats-py's own limit)."""
RETRY_WAIT_S = 0.25
"""How long a consumer waits after the bus failed a fetch (a server lost, reconnecting)."""


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """Where a delivered event came from; ``attempt`` counts redeliveries from 1."""

    subject: str
    attempt: int
    stream_seq: int


Handler = Callable[[events.AnyEvent, Delivery], Awaitable[None]]


T = TypeVar("T")


def _connected(part: T | None) -> T:
    if part is None:
        raise RuntimeError("Bus is not connected: use `async with Bus(...)`")
    return part


def user_of(cfg: NatsConfig, service: str) -> str:
    """The NATS user ``service`` connects as: ``nats.user``, else the service's name."""
    return cfg.user or service


def credentials(cfg: NatsConfig, service: str) -> dict[str, str]:
    """``user`` and ``password`` for ``service`` from ``nats.passwordFile`` (none unset)."""
    if not cfg.password_file:
        return {}
    user = user_of(cfg, service)
    path = Path(cfg.password_file.replace("{user}", user))
    try:
        return {"user": user, "password": path.read_text().strip()}
    except OSError as exc:
        raise RuntimeError(f"nats.passwordFile: cannot read {path}: {exc}") from None


class _OneWriteTransport(TcpTransport):
    """nats-py's TCP transport, with a flush written as ONE buffer, and a TLS upgrade
    whose stream knows it is over TLS.

    nats-py queues each command as separate small byte strings and flushes the whole
    list with ``writelines``. On a TLS connection each of them then becomes a TLS record
    of its own: encrypted, framed and handed to the socket one by one. Under load a flush
    holds hundreds of them, and this was a tenth of every service's CPU in a cProfile
    of bench/e2e.py. One joined buffer is encrypted into full-size records instead; a
    bare TLS stream measured 59 us of CPU for 60 writes of 80 bytes against 6 us joined
    (bench/RESULTS.md). Installed for every connection this process opens
    (``nats.aio.client`` makes its transports by this name)."""

    def writelines(self, payload: list[bytes]) -> None:
        self.write(b"".join(payload))  # type: ignore[no-untyped-call]

    async def connect_tls(
        self,
        uri: str | ParseResult,
        ssl_context: ssl.SSLContext,
        buffer_size: int,
        connect_timeout: int,
    ) -> None:
        """nats-py's upgrade to TLS, then the ``connection_made`` that ``loop.start_tls``
        leaves out (it never calls it on the protocol it is given).

        nats-py upgrades with a fresh ``StreamReaderProtocol``. Told of no transport, that
        protocol believes it is not over TLS, so its ``eof_received`` asks to keep the
        connection half open, which TLS cannot do: each connection then closed made
        asyncio (and uvloop) log "returning true from eof_received() has no effect when
        using ssl" as a WARNING, dozens of times in a healthy run. Told of its transport,
        as ``asyncio.open_connection(ssl=...)`` tells it (the way shared/http1.py opens
        its connections), it answers as TLS wants, and its reader can pause the
        transport when it is behind, as on a plain connection. Checked by
        tests/service/test_bus.py."""
        await super().connect_tls(uri, ssl_context, buffer_size, connect_timeout)
        if self._io_writer is not None:
            transport = self._io_writer.transport
            transport.get_protocol().connection_made(transport)


setattr(nats.aio.client, "TcpTransport", _OneWriteTransport)  # noqa: B010 (not exported)


async def connect(cfg: NatsConfig, service: str, *, patient: bool = True) -> NatsClient:
    """A NATS connection as ``service``'s user (shared/busauth.py), with its password and
    TLS as configured; it retries while the server starts and reconnects for ever. Not
    ``patient`` (a command someone waits for): a server that does not answer within
    about 3 s fails the call."""
    options: dict[str, Any] = dict(credentials(cfg, service))
    urls = [url.strip() for url in cfg.url.split(",") if url.strip()]
    if cfg.ca_file:
        options["tls"] = ssl.create_default_context(cafile=cfg.ca_file)
        # Servers of a cluster gossip their IP addresses; a client that fails over to
        # one still checks the certificate against the name it was given.
        options["tls_hostname"] = urlsplit(urls[0]).hostname
    user = user_of(cfg, service)
    if user == busauth.READER:  # the only reply subjects it may read (shared/busauth.py)
        options["inbox_prefix"] = busauth.READER_INBOX

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            log.error(
                "the bus refused user %r: %s (what each user may do: shared/busauth.py)",
                user,
                exc,
            )
        elif patient:  # otherwise the caller says it, once
            log.warning("nats: %r", exc)

    return await nats.connect(
        urls,
        name=f"tessera-{service}",
        error_cb=on_error,
        connect_timeout=5 if patient else 2,
        max_reconnect_attempts=-1 if patient else 1,
        reconnect_time_wait=0.5,
        allow_reconnect=patient,
        **options,
    )


VIEW_ERROR_HEADER = "Tessera-Error"
"""Set on a view's answer when the service could not make it (its value says why)."""


class ViewUnavailable(Exception):  # noqa: N818 (what a tool tells its user)
    """A view could not be had: nothing answers it, no answer in time, or the service
    could not make it. ``str()`` is one line for people."""


async def ask(
    nc: NatsClient,
    subject: str,
    query: msgspec.Struct | None,
    answer: type[T],
    *,
    service: str,
    timeout_s: float = 5.0,
) -> T:
    """Ask ``service`` for a view (shared/views.py) and decode its answer. An answer that
    names shards (allocator shards, docs/sharding.md) is one of several: every shard's
    is awaited and they are merged into one."""
    payload = b"" if query is None else msgspec.json.encode(query)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    deadline = time.monotonic() + timeout_s
    try:
        await nc.publish(subject, payload, reply=inbox)
        first = _view(
            await _next(sub, deadline, service, subject, timeout_s), answer, service, subject
        )
        shards = getattr(first, "shards", ())
        if not shards:
            return first
        parts = {getattr(first, "shard", ""): first}
        while missing := [s for s in shards if s not in parts]:
            msg = await _next(
                sub, deadline, service, subject, timeout_s, f" (shards {', '.join(missing)})"
            )
            part = _view(msg, answer, service, subject)
            parts[getattr(part, "shard", "")] = part
        return cast(T, views.merged([cast(views.Sharded, parts[s]) for s in shards]))
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def _next(
    sub: Subscription,
    deadline: float,
    service: str,
    subject: str,
    timeout_s: float,
    which: str = "",
) -> Msg:
    """The next answer to a view's request, or why there is none."""
    try:
        msg = await sub.next_msg(timeout=max(deadline - time.monotonic(), 0.001))
    except nats.errors.TimeoutError:
        raise ViewUnavailable(
            f"{service}{which} did not answer {subject} in {timeout_s:.0f}s"
        ) from None
    if not msg.data and _no_responders(msg):
        raise ViewUnavailable(f"no {service} answers {subject}: is it running (and active)?")
    return msg


def _no_responders(msg: Msg) -> bool:
    """The server's answer to a request no one took (no view server, no stream)."""
    return (msg.headers or {}).get(Header.STATUS) == NO_RESPONDERS


def _view(msg: Msg, answer: type[T], service: str, subject: str) -> T:
    why = (msg.headers or {}).get(VIEW_ERROR_HEADER)
    if why:
        raise ViewUnavailable(f"{service} could not answer {subject}: {why}")
    try:
        return msgspec.json.decode(msg.data, type=answer)
    except msgspec.DecodeError as exc:
        raise ViewUnavailable(
            f"{service} answered {subject} with what this tool cannot read: {exc}"
        ) from None


class Bus:
    """A connection to NATS with the Tessera stream and inventory bucket ensured.

    Use as ``async with Bus(cfg, name="binder") as bus:``; leaving the block stops the
    consumers, drains the connection (pending publishes and acks are flushed) and closes.
    """

    def __init__(self, cfg: NatsConfig, *, name: str) -> None:
        self.cfg = cfg
        self.name = name
        self.user = user_of(cfg, name)
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._acks: _Acks | None = None
        self._consumers: list[asyncio.Task[None]] = []
        self._attributes = {"tessera.service": name}
        self.published: Callable[[events.Event], None] = lambda _event: None
        """Called for each event stored (the runtime counts them)."""
        self.fence: Acting | None = None
        """A leader's :attr:`Lease.acting`: its publishes and the delivery of its events
        wait while it is down (the lease went unrenewed: :class:`Lease`)."""
        self._commit = GroupCommit(self._store, f"{name}:publish")
        """Every publish goes through it: one pipelined write per turn of the loop."""

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def js(self) -> JetStreamContext:
        """The JetStream context; raises ``RuntimeError`` before :meth:`connect`."""
        return _connected(self._js)

    @property
    def nc(self) -> NatsClient:
        """The NATS connection; raises ``RuntimeError`` before :meth:`connect`."""
        return _connected(self._nc)

    async def connect(self) -> None:
        """Connect (retrying while the server starts) and ensure stream and bucket exist."""
        self._nc = await connect(self.cfg, self.name)
        self._js = self._nc.jetstream()
        self._acks = await _Acks.start(self._nc)
        await through_failover("stream", self._ensure_stream)
        self._kv = await through_failover("bucket", self._ensure_bucket)

    async def close(self) -> None:
        """Stop the consumers (each task cancelled and awaited), drain the connection, and forget
        it: a later use raises until :meth:`connect` again."""
        for task in self._consumers:
            task.cancel()
        for task in self._consumers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._consumers.clear()
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await self._nc.drain()
        self._nc = self._js = None
        self._kv = self._acks = None

    async def _ensure_stream(self) -> None:
        """Create the stream if missing; bring its settings up to the config only as a
        user that may (shared/busauth.py: the allocator, admin, or no authorization)."""
        config = StreamConfig(
            name=self.cfg.stream,
            subjects=[events.STREAM_SUBJECTS],
            storage=StorageType.FILE,
            max_age=self.cfg.max_age_s,
            duplicate_window=self.cfg.duplicate_window_s,
            num_replicas=self.cfg.replicas,
        )
        try:
            info = await self.js.stream_info(self.cfg.stream)
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):
                await self.js.add_stream(config)
                return
            info = await self.js.stream_info(self.cfg.stream)  # another one created it
        have = info.config
        if (
            have.subjects == config.subjects
            and have.max_age == config.max_age
            and have.duplicate_window == config.duplicate_window
            and (have.num_replicas or 1) == config.num_replicas
        ):
            return
        if busauth.manages_streams(self.user):
            await self.js.update_stream(config)
        else:
            log.warning(
                "stream %s differs from the config; the device-allocator updates it",
                self.cfg.stream,
            )

    async def _ensure_bucket(self) -> KeyValue:
        return await self.bucket(self.cfg.inventory_bucket)

    async def bucket(self, name: str, *, ttl_s: float | None = None) -> KeyValue:
        """A KV bucket, created on first use (``ttl_s``: entries expire unless rewritten;
        0: never). An existing bucket whose entries expire after another time than
        ``ttl_s`` (the config changed, or a release changed its default) is brought to it
        by a user that manages streams (the allocator; shared/busauth.py), else left as
        it is."""
        try:
            kv = await self.js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):
                return await self.js.create_key_value(
                    KeyValueConfig(bucket=name, history=1, ttl=ttl_s, replicas=self.cfg.replicas)
                )
            return await self.js.key_value(name)  # another process created it meanwhile
        if ttl_s is not None and busauth.manages_streams(self.user):
            info = await self.js.stream_info(f"KV_{name}")
            if (info.config.max_age or 0.0) != ttl_s:
                log.info(
                    "bucket %s: entries expire after %ss, not %ss: updated",
                    name,
                    info.config.max_age,
                    ttl_s,
                )
                # no window for duplicates longer than the entries live (the server
                # refuses it), up to the 2 minutes a new bucket gets
                window = min(ttl_s or KV_DUPLICATE_WINDOW_S, KV_DUPLICATE_WINDOW_S)
                await self.js.update_stream(
                    replace(info.config, max_age=ttl_s, duplicate_window=window)
                )
        return kv

    # --- publishing ------------------------------------------------------------------

    async def publish(self, event: events.Event) -> None:
        """Publish one event and wait until JetStream has stored it."""
        await self._commit([(event, _trace())])

    async def publish_many(
        self,
        batch: Iterable[events.Event],
        contexts: Sequence[otel_context.Context | None] | None = None,
    ) -> None:
        """Publish many events pipelined (acks awaited together): the hot-path form.
        ``contexts``, one per event, puts each in its own trace (None: the current one).
        A batch the bus could not store while failing over is sent again whole (each
        event's message id makes what was stored a dropped duplicate)."""
        events_ = list(batch)
        if not events_:
            return
        current = _trace()
        given = contexts if contexts is not None else [None] * len(events_)
        await self._commit(
            [(e, c if c is not None else current) for e, c in zip(events_, given, strict=True)]
        )

    async def _store(self, items: list[tuple[events.Event, otel_context.Context | None]]) -> None:
        """One group-committed write (``_commit``, shared/aio.py): what callers publish
        while a write is on its way goes out together as the next one, in the order
        asked (handlers running at once, a binder's 64 binds: one pipelined write, not a
        round trip each)."""
        batch = [event for event, _ in items]
        contexts = [context for _, context in items]
        if self.fence is not None:
            await self.fence.wait()
        await through_failover(
            f"publish {len(batch)} events", lambda: self._publish_many(batch, contexts)
        )
        for event in batch:
            self.published(event)

    async def _publish_many(
        self,
        batch: Sequence[events.Event],
        contexts: Sequence[otel_context.Context | None],
    ) -> None:
        acks = _connected(self._acks)
        traced = recording()
        for start in range(0, len(batch), PUBLISH_WINDOW):
            waiting: list[tuple[str, asyncio.Future[None]]] = []
            try:
                for run, encoded, given in _messages(
                    batch[start : start + PUBLISH_WINDOW],
                    contexts[start : start + PUBLISH_WINDOW],
                    traced,
                ):
                    reply, answer = acks.expect()
                    waiting.append((reply, answer))
                    event = run[0]
                    if len(run) > 1:
                        payload = b"[" + b",".join(encoded) + b"]"
                        # A resend of the same run is stored once, as a single event is.
                        dedup = f"batch:{event.dedup_id()}:{run[-1].dedup_id()}:{len(run)}"
                        headers = {MSG_ID_HEADER: dedup, BATCH_HEADER: str(len(run))}
                        await self.nc.publish(event.subject(), payload, reply, headers)
                        continue
                    payload = encoded[0]
                    headers = {MSG_ID_HEADER: event.dedup_id()}
                    if not traced:  # no span; the trace it came in, if any, carried on
                        if given is not None:
                            propagate.inject(headers, context=given)
                        await self.nc.publish(event.subject(), payload, reply, headers)
                        continue
                    token = otel_context.attach(given) if given is not None else None
                    try:
                        with span(
                            f"send {event.SUBJECT}",
                            kind=SpanKind.PRODUCER,
                            attributes=self._attributes,
                        ):
                            propagate.inject(headers)
                            await self.nc.publish(event.subject(), payload, reply, headers)
                    finally:
                        if token is not None:
                            otel_context.detach(token)
            except BaseException:
                acks.forget(waiting)  # sent, but nobody will wait for their answers
                raise
            await acks.wait(waiting)

    # --- consuming -------------------------------------------------------------------

    def consume(
        self,
        durable: str,
        subjects: Sequence[str],
        handler: Handler,
        *,
        deliver: Literal["all", "new"] = "all",
        batch: int = 64,
        ack_wait_s: float | None = None,
        concurrency: int = 1,
    ) -> asyncio.Task[None]:
        """Start a named task that feeds ``handler`` every event on ``subjects``.

        The durable consumer remembers its position across restarts. With
        ``concurrency=1`` events are handled one at a time in stream order; above it, up
        to that many handlers run at once (order is not kept). A message is acked after
        its handler returns (with the others handled within ``ACK_DELAY_S``: see
        ``_Pull``) and nak'ed (redelivered later) when it raises. Undecodable messages
        are terminated with a log line: no retry can fix them. ``batch``: the messages
        one pull request asks for.
        """
        task = asyncio.create_task(
            self._consume(
                durable, list(subjects), handler, deliver, batch, ack_wait_s, concurrency
            ),
            name=f"{self.name}:consume:{durable}",
        )
        self._consumers.append(task)
        return task

    async def ensure_consumer(
        self,
        durable: str,
        subjects: Sequence[str],
        *,
        deliver: Literal["all", "new"] = "all",
        ack_wait_s: float | None = None,
    ) -> None:
        """Create the durable consumer now if it does not exist.

        Call it before reading the state a consumer will keep up to date (a KV bucket,
        the API server): every event from this moment on is then kept for the consumer,
        none falls between the read and the first fetch.
        """
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s or self.cfg.ack_wait_s,
            max_deliver=self.cfg.max_deliver,
            max_ack_pending=10_000,
            deliver_policy=DeliverPolicy.ALL if deliver == "all" else DeliverPolicy.NEW,
        )
        if len(subjects) == 1:
            config.filter_subject = subjects[0]
        else:
            config.filter_subjects = list(subjects)
        try:
            info = await self.js.consumer_info(self.cfg.stream, durable)
        except nats.js.errors.NotFoundError:
            await self.js.add_consumer(self.cfg.stream, config)
            return
        known = info.config
        have = set(
            known.filter_subjects or ([known.filter_subject] if known.filter_subject else [])
        )
        if have != set(subjects):  # a newer release reads more (or fewer) subjects
            log.info("consumer %s: subjects %s -> %s", durable, sorted(have), sorted(subjects))
            await self.js.add_consumer(
                self.cfg.stream,
                known.evolve(
                    filter_subject=config.filter_subject, filter_subjects=config.filter_subjects
                ),
            )

    def connected(self) -> str | None:
        """None while connected to a server, else why not (a readiness check)."""
        if self._nc is None or self._nc.is_closed:
            return "not connected to NATS"
        if not self._nc.is_connected:
            return "reconnecting to NATS"
        return None

    async def last_seq(self) -> int:
        """The stream's last sequence number now."""
        return int((await self.js.stream_info(self.cfg.stream)).state.last_seq)

    async def behind(self, durable: str, seq: int) -> str | None:
        """None once ``durable`` has been handed every event of the stream up to ``seq``
        (or has none left), else how far behind it is."""
        info = await self.js.consumer_info(self.cfg.stream, durable)
        delivered = info.delivered.stream_seq if info.delivered else 0
        if not info.num_pending or (delivered or 0) >= seq:
            return None
        return f"{info.num_pending} events not yet taken (catching up to stream seq {seq})"

    async def reset_consumer(self, durable: str) -> None:
        """Deliver again, at once, every message of ``durable`` taken but not acked (by a
        process that died holding them): delivery resumes above the ack floor."""
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.reset_consumer(self.cfg.stream, durable)

    async def _consume(
        self,
        durable: str,
        subjects: list[str],
        handler: Handler,
        deliver: str,
        batch: int,
        ack_wait_s: float | None,
        concurrency: int,
    ) -> None:
        while True:
            try:
                await self.ensure_consumer(
                    durable,
                    subjects,
                    deliver="all" if deliver == "all" else "new",
                    ack_wait_s=ack_wait_s,
                )
                break
            except nats.errors.ConnectionClosedError:
                return
            except (TimeoutError, nats.errors.Error) as exc:
                # A cluster still electing its leaders, or a server lost meanwhile.
                raise_if_cancelling()
                log.warning("consumer %s not ready (%r); retrying", durable, exc)
                await asyncio.sleep(RETRY_WAIT_S)
        await _Pull(self, durable, handler, batch, concurrency).run()

    async def _deliver(self, msg: Msg, handler: Handler, concurrency: int = 1) -> bool:
        """Decode ``msg`` and run ``handler`` on it (on each of its events, for a batch:
        in order, or up to ``concurrency`` at once, the consumer's own): True when it is
        to be acked (the caller acks), False when it was nak'ed (a handler failed:
        delivered again later, the whole batch, whose other events were still handled:
        handlers are idempotent) or terminated (undecodable)."""
        delivery = delivery_of(msg)
        headers = msg.headers or {}
        if self.fence is not None:
            await self.fence.wait()
        try:
            if BATCH_HEADER in headers:
                decoded = _decode_batch(msg, delivery)
            else:
                decoded = [events.decode(msg.data)]
        except msgspec.DecodeError as exc:
            log.error(
                "dropping undecodable message on %s (seq %d): %s",
                msg.subject,
                delivery.stream_seq,
                exc,
            )
            await _settle(msg.term())
            return False
        log.debug("got %s (seq %d, attempt %d)", msg.subject, delivery.stream_seq, delivery.attempt)
        # Only a message that carries a trace has one to continue (most carry none while
        # nothing exports: extracting an empty one cost more than the rest of a delivery).
        context = propagate.extract(headers) if not _trace_fields().isdisjoint(headers) else None

        async def one(event: events.AnyEvent) -> bool:
            with span(
                f"process {type(event).SUBJECT}", context=context, kind=SpanKind.CONSUMER
            ) as current:
                current.set_attribute("messaging.destination", msg.subject)
                current.set_attribute("tessera.service", self.name)
                current.set_attribute("messaging.delivery_attempt", delivery.attempt)
                try:
                    await handler(event, delivery)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    current.record_exception(exc)
                    current.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                    log.exception(
                        "handler failed on %s (attempt %d)", msg.subject, delivery.attempt
                    )
                    return False
            return True

        if concurrency > 1 and len(decoded) > 1:
            # A batch of a consumer whose handlers overlap their I/O (the allocator's
            # publishes group-commit): one after the other, each would wait its own.
            gate = asyncio.Semaphore(concurrency)

            async def gated(event: events.AnyEvent) -> bool:
                async with gate:
                    return await one(event)

            handled = all(await asyncio.gather(*map(gated, decoded)))
        else:
            handled = True
            for event in decoded:
                handled = await one(event) and handled
        if not handled:
            delay = min(0.2 * 2 ** (delivery.attempt - 1), 30.0)
            log.warning("redelivering %s in %.1fs", msg.subject, delay)
            await _settle(msg.nak(delay=delay))
            return False
        return True

    # --- inventory KV ----------------------------------------------------------------

    @property
    def kv(self) -> KeyValue:
        """The inventory KV bucket (``nats.inventoryBucket``); raises ``RuntimeError`` before
        :meth:`connect`."""
        return _connected(self._kv)

    async def put_inventory(self, inventory: events.NodeInventory) -> None:
        """Store a node's latest inventory (the event is published separately)."""
        # Node names are DNS subdomains: every character is valid in a KV key.
        data = events.encode(inventory)
        await through_failover("inventory", lambda: self.kv.put(inventory.node, data))

    async def delete_inventory(self, node: NodeName) -> None:
        """Remove a node's inventory from the KV; a node not there is no error."""
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.kv.delete(node)

    async def inventory_heartbeats(
        self, every_s: float
    ) -> AsyncIterator[dict[NodeName, events.NodeInventory]]:
        """Every node's inventory, once per ``every_s``: what reconcile loops compare with
        what they have. A read the bus is too busy for is skipped, not fatal."""
        while True:
            await asyncio.sleep(every_s)
            try:
                yield await self.inventories()
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning("inventory read skipped (the bus is slow): %r", exc)

    async def inventories(self, timeout_s: float = 10.0) -> dict[NodeName, events.NodeInventory]:
        """Every node's latest inventory, read in one pass: a watcher delivers each key's
        last value, then a marker. (A get per key took 1,000 requests at 1,000 nodes, and
        one timing out under load took the whole reader down.) A pass that found nothing
        in a bucket that holds values is read again: nats-py's watcher may give its
        marker first when its consumer has not yet counted what is pending (seen right
        after a failover: an allocator started with no devices for 10 s, bench/chaos.py)."""
        for _ in range(INVENTORY_READS - 1):
            found = await self._inventories(timeout_s)
            if found or not (await self.kv.status()).values:
                return found
            log.info("the inventory bucket holds values, a read found none: read again")
        return await self._inventories(timeout_s)

    async def _inventories(self, timeout_s: float) -> dict[NodeName, events.NodeInventory]:
        watcher = await self.kv.watchall(ignore_deletes=True)
        found: dict[NodeName, events.NodeInventory] = {}
        try:
            while True:
                entry = await watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
                if entry is None:  # every current value was delivered
                    return found
                if entry.value:
                    event = events.decode(entry.value)
                    if isinstance(event, events.NodeInventory):
                        found[event.node] = event
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]


INVENTORY_READS = 3
"""How many times ``Bus.inventories`` reads a bucket that holds values and seems empty."""

_DELIVERED_AT = {9: 4, 11: 6, 12: 6}
"""Where the delivery count sits in an ack subject of so many tokens (see ``delivery_of``;
the stream sequence follows it)."""


class _Pull:
    """One durable consumer's loop: a pull request for ``batch`` messages at a time,
    waiting up to ``PULL_EXPIRES_S`` on the server, answered on one inbox whose callback
    hands each message to the handler as it arrives.

    nats-py's ``fetch`` costs about twice as much CPU per message (a task and a timer
    for each, to wait on its queue with a timeout) and, asked for several, waits for all
    of them or its timeout; here the server sends each message the moment it is stored,
    and a request is renewed when its last message arrives, when the server says it
    ended (408: expired; after any other status, a pause) or, if the answer was lost, after
    ``PULL_GRACE_S`` more. Each request has its own reply subject under the inbox, where
    the server says it ended: the end of an earlier request, read late (a handler
    busy past its expiry, when the current one was made meanwhile), is ignored, so it
    never renews a second request beside the current one.

    With ``concurrency`` 1 the callback runs the handler itself, one message at a time
    in stream order; above it, up to that many handlers run at once and the callback
    waits for a free one (unread messages wait in the inbox, at most about a request's
    worth).

    A handled message's ack waits up to ``ACK_DELAY_S`` for others, and they go out in
    one write (every ack was a socket write of its own, a tenth of a service's CPU). A
    process that dies meanwhile gets those messages again after ``ack_wait``: handlers
    are idempotent, as for any delivery the bus repeats. The acks waiting when the
    consumer stops are sent before it lets go."""

    def __init__(
        self, bus: Bus, durable: str, handler: Handler, batch: int, concurrency: int
    ) -> None:
        self.bus = bus
        self.durable = durable
        self.handler = handler
        self.batch = batch
        self.concurrency = concurrency
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{bus.cfg.stream}.{durable}"
        self.request = msgspec.json.encode(
            {"batch": batch, "expires": int(PULL_EXPIRES_S * 1_000_000_000)}
        )
        self.inbox = bus.nc.new_inbox()
        self.asked = 0
        """Requests made: the current one is answered on ``inbox.<asked>``."""
        self.reply = ""
        self.left = 0
        """Messages the last request may still bring."""
        self.renew_at = 0.0
        """When to ask again if the server has not answered (monotonic seconds)."""
        self.slots = asyncio.Semaphore(concurrency)
        self.running: set[asyncio.Task[None]] = set()
        self.acks: list[str] = []
        """Reply subjects of handled messages whose ack is not sent yet."""
        self.troubled = False
        """The server answered a request with an error since the last message."""
        self.ack_due = asyncio.Event()

    async def run(self) -> None:
        nc = self.bus.nc
        sub = await nc.subscribe(
            f"{self.inbox}.*", cb=self.on_message, pending_msgs_limit=max(1024, 16 * self.batch)
        )
        acker = asyncio.create_task(self.acker(), name=f"{self.bus.name}:{self.durable}:acks")
        try:
            while True:
                if time.monotonic() >= self.renew_at:
                    try:
                        await self.ask()
                    except nats.errors.ConnectionClosedError:
                        return
                    except nats.errors.Error as exc:
                        log.warning("pull on %s failed (%r); retrying", self.durable, exc)
                        self.renew_at = time.monotonic() + RETRY_WAIT_S
                await asyncio.sleep(max(0.05, self.renew_at - time.monotonic()))
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            stopping = [*self.running, acker]
            for task in stopping:
                task.cancel()
            for task in stopping:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.send_acks()

    async def acker(self) -> None:
        """Send the acks gathered, ``ACK_DELAY_S`` after the first of them."""
        while True:
            await self.ack_due.wait()
            await asyncio.sleep(ACK_DELAY_S)
            self.ack_due.clear()
            await self.send_acks()

    async def send_acks(self) -> None:
        """Every ack gathered, in one burst: nats-py writes what is queued in the same
        turn of the loop as one write."""
        replies, self.acks = self.acks, []
        try:
            for reply in replies:
                await self.bus.nc.publish(reply, Msg.Ack.Ack)
        except nats.errors.Error as exc:
            log.warning(
                "could not ack %d messages on %s (%r); they will be delivered again",
                len(replies),
                self.durable,
                exc,
            )

    async def handled(self, msg: Msg) -> None:
        """Deliver ``msg``; ack it with the next burst if the handler took it."""
        if await self.bus._deliver(msg, self.handler, self.concurrency) and msg.reply:
            self.acks.append(msg.reply)
            self.ack_due.set()

    async def ask(self) -> None:
        """A new pull request (the last one is spent, ended or lost)."""
        self.asked += 1
        self.reply = f"{self.inbox}.{self.asked}"
        self.left = self.batch
        self.renew_at = time.monotonic() + PULL_EXPIRES_S + PULL_GRACE_S
        await self.bus.nc.publish(self.subject, self.request, reply=self.reply)

    async def renew(self) -> None:
        """``ask`` from the callback: a failure is left to ``run``'s deadline."""
        try:
            await self.ask()
        except nats.errors.Error as exc:
            log.debug("pull on %s not renewed (%r)", self.durable, exc)

    async def on_message(self, msg: Msg) -> None:
        status = msg.headers.get(Header.STATUS) if msg.headers else None
        if status is not None:
            # A status comes on the request's own reply subject (a message, on its
            # stream subject: any message counts against the current request).
            if status == "100" or msg.subject != self.reply:  # a heartbeat, an old end
                return
            if status != "408":  # 408: the request expired, the usual end while idle
                # 409 (a leader moved, the consumer deleted), 503 (no JetStream answering
                # yet), or anything else: the request is gone; ask again after a pause,
                # saying so once until a message comes again.
                if not self.troubled:
                    self.troubled = True
                    log.warning(
                        "pull on %s answered %s %s; asking again every %.2f s",
                        self.durable,
                        status,
                        msg.headers.get(Header.DESCRIPTION, "") if msg.headers else "",
                        RETRY_WAIT_S,
                    )
                await asyncio.sleep(RETRY_WAIT_S)
            await self.renew()
            return
        self.troubled = False
        self.left -= 1
        if self.left <= 0:
            await self.renew()
        if self.concurrency == 1:
            await self.handled(msg)
            return
        await self.slots.acquire()
        task = asyncio.create_task(self.one(msg), name=f"{self.bus.name}:{self.durable}:handler")
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def one(self, msg: Msg) -> None:
        try:
            await self.handled(msg)
        finally:
            self.slots.release()


class _PubAck(msgspec.Struct):
    """JetStream's answer to a publish: where it stored it, or why not."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


_read_pub_ack = msgspec.json.Decoder(_PubAck).decode


class _Acks:
    """JetStream's answers to this connection's publishes, on one inbox of its own
    (``<inbox>.<n>``, one ``n`` per publish).

    nats-py's ``publish_async`` does the same at about twice the cost per message: a
    semaphore wait, a random token from the OS and a callback per publish, and each
    answer read with ``json`` into a dataclass built field by field
    (``python bench/bus.py``, the pipelined rows)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.sent = 0
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.sub: Subscription | None = None

    @classmethod
    async def start(cls, nc: NatsClient) -> _Acks:
        acks = cls(nc.new_inbox())
        acks.sub = await nc.subscribe(f"{acks.prefix}.*", cb=acks.on_answer)
        return acks

    def expect(self) -> tuple[str, asyncio.Future[None]]:
        """The reply subject of a new publish, and the future its answer settles."""
        self.sent += 1
        token = str(self.sent)
        answer = asyncio.get_running_loop().create_future()
        self.waiting[token] = answer
        return f"{self.prefix}.{token}", answer

    def forget(self, waiting: Iterable[tuple[str, asyncio.Future[None]]]) -> None:
        """Give up on these answers (an answer that comes later is dropped)."""
        skip = len(self.prefix) + 1
        for reply, answer in waiting:
            self.waiting.pop(reply[skip:], None)
            answer.cancel()

    async def wait(self, waiting: list[tuple[str, asyncio.Future[None]]]) -> None:
        """Every answer, for up to ``PUBLISH_ACK_S``; then the first failure is raised,
        and answers still missing are a ``TimeoutError`` (``through_failover`` sends the
        batch again; message ids make what was stored a dropped duplicate). Every
        exception is read, none is left "never retrieved"."""
        if not waiting:
            return
        futures = [answer for _, answer in waiting]
        try:
            _, late = await asyncio.wait(futures, timeout=PUBLISH_ACK_S)
        except BaseException:  # cancelled (a writer stopped): nobody waits any more
            self.forget(waiting)
            raise
        self.forget([(r, a) for r, a in waiting if a in late])
        errors = [a.exception() for a in futures if a not in late]
        for exc in errors:
            if exc is not None:
                raise exc
        if late:
            raise nats.errors.TimeoutError

    async def on_answer(self, msg: Msg) -> None:
        answer = self.waiting.pop(msg.subject[len(self.prefix) + 1 :], None)
        if answer is None or answer.done():
            return
        if _no_responders(msg):
            answer.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            ack = _read_pub_ack(msg.data)
        except msgspec.DecodeError as exc:
            log.debug("unreadable answer to a publish (%s): taken as lost", exc)
            return
        error = ack.error
        if error is None:
            answer.set_result(None)
            return
        code, err_code = error.get("code"), error.get("err_code")
        if err_code in BUSY_ERR_CODES or (isinstance(code, int) and (code == 429 or code >= 500)):
            log.debug("JetStream busy (%s): the publish is taken as lost", error)
            return
        try:
            nats.js.errors.APIError.from_error(error)  # raises the error's own class
        except nats.js.errors.APIError as exc:
            answer.set_exception(exc)
        except (TypeError, KeyError):  # an error nats-py cannot build
            answer.set_exception(nats.js.errors.APIError(description=str(error)))


BUSY_ERR_CODES = frozenset({10158, 10167})
"""JetStream errors that pass: "duplicate message id is in process" (a resend while the
first copy is still being stored, as in a leader's failover) and "too many requests"
(the stream's pending limit in a burst). These, 429, every 5xx and an unreadable answer
are taken as a lost answer: the publish times out after ``PUBLISH_ACK_S`` and
``through_failover`` sends it again, as it did under nats-py's ``publish_async``. Sent
again at once instead, every service's retries kept a recovering cluster from renewing
the services' leases in two chaos runs (``bench/chaos.py``)."""


_BATCH = msgspec.json.Decoder(list[msgspec.Raw])


def _decode_batch(msg: Msg, delivery: Delivery) -> list[events.AnyEvent]:
    """The events of a batch message, in order; one that cannot be decoded is logged and
    left out (raises only when the message is not a list at all)."""
    decoded = []
    for i, raw in enumerate(_BATCH.decode(msg.data)):
        try:
            decoded.append(events.decode(raw))
        except msgspec.DecodeError as exc:
            log.error(
                "dropping undecodable event %d of the batch on %s (seq %d): %s",
                i,
                msg.subject,
                delivery.stream_seq,
                exc,
            )
    return decoded


def _messages(
    batch: Sequence[events.Event],
    contexts: Sequence[otel_context.Context | None],
    traced: bool,
) -> Iterator[tuple[list[events.Event], list[bytes], otel_context.Context | None]]:
    """The messages that carry ``batch``, in order, each as its events, their encodings
    and its trace: a run of consecutive ``BATCHED`` events on one subject (up to
    ``BATCH_MAX`` of them and ``BATCH_BYTES``) as one message, while no span is recorded
    and none of them came in a trace (each would lose its own); every other event alone,
    with its trace. Under a burst each message costs the same on the bus (a publish, an
    ack, a stored record, a delivery and an ack per consumer) whatever it carries: the
    watcher's pod events and the coordinator's gangs, one message each, were most of
    what the NATS server did per pod (bench/RESULTS.md)."""
    run: list[events.Event] = []
    encoded: list[bytes] = []
    subject = ""
    size = 0
    for event, given in zip(batch, contexts, strict=True):
        payload = events.encode(event)
        if type(event).BATCHED and not traced and not _carries_trace(given):
            here = event.subject()
            if (
                run
                and here == subject
                and len(run) < BATCH_MAX
                and size + len(payload) <= BATCH_BYTES
            ):
                run.append(event)
                encoded.append(payload)
                size += len(payload) + 1
                continue
            if run:
                yield run, encoded, None
            run, encoded, subject, size = [event], [payload], here, len(payload) + 2
            continue
        if run:
            yield run, encoded, None
            run, encoded = [], []
        yield [event], [payload], given
    if run:
        yield run, encoded, None


def _carries_trace(context: otel_context.Context | None) -> bool:
    """Does ``context`` hold a span (a trace to carry on)?"""
    if not context:
        return False
    return trace.get_current_span(context).get_span_context().is_valid


def delivery_of(msg: Msg) -> Delivery:
    """Where a JetStream message came from, read from its ack subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``,
    or with a domain and an account hash before the stream and a token after): nats-py's
    ``Msg.metadata`` builds a dataclass of every field, a fifth of a delivery's cost."""
    tokens = (msg.reply or "").split(".")
    at = _DELIVERED_AT.get(len(tokens))
    if tokens[:2] != ["$JS", "ACK"] or at is None:
        meta = msg.metadata  # any other form: nats-py knows it
        return Delivery(
            subject=msg.subject, attempt=meta.num_delivered, stream_seq=meta.sequence.stream
        )
    return Delivery(subject=msg.subject, attempt=int(tokens[at]), stream_seq=int(tokens[at + 1]))


_fields: tuple[object, frozenset[str]] = (None, frozenset())


def _trace_fields() -> frozenset[str]:
    """The headers the propagators read (a trace's), kept while the propagators are the
    same: the composite propagator builds the set anew on every call."""
    global _fields
    textmap = propagate.get_global_textmap()
    if _fields[0] is not textmap:
        _fields = (textmap, frozenset(textmap.fields))
    return _fields[1]


def _trace() -> otel_context.Context | None:
    """The caller's trace, for an event published on its behalf by the group commit's
    task (None outside any trace: nothing to carry on, and nothing to attach per event)."""
    current = otel_context.get_current()
    return current if trace.get_current_span(current).get_span_context().is_valid else None


async def _settle(reply: Awaitable[None]) -> None:
    """Ack, nak or term a message; if the bus fails it (a server lost mid-reply), the
    message comes again after ``ack_wait`` and the idempotent handler sees it twice."""
    try:
        await reply
    except nats.errors.ConnectionClosedError:
        raise
    except nats.errors.Error as exc:
        log.warning("could not settle a message (%r); it will be delivered again", exc)


FAILOVER_S = 30.0
"""How long a write waits out the bus's own failover (a server lost or restarted: its
streams and buckets elect new leaders in seconds) before the error is the caller's."""
TRANSIENT = (
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.NoRespondersError,
    nats.errors.TimeoutError,
    nats.errors.ConnectionReconnectingError,
)
"""What a JetStream request answers while a server is lost and its leaders move."""

R = TypeVar("R")


async def through_failover(what: str, call: Callable[[], Awaitable[R]]) -> R:
    """``call()``, tried again while the bus fails over (:data:`TRANSIENT`, for up to
    :data:`FAILOVER_S`): a service rides out a lost NATS server instead of restarting.
    Only for calls that may be repeated: publishes (the message id makes a repeat a
    duplicate JetStream drops), puts of a whole value, creates."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FAILOVER_S
    pause = 0.1
    warned = False
    while True:
        try:
            return await call()
        except TRANSIENT as exc:
            raise_if_cancelling()
            if loop.time() + pause > deadline:
                raise
            if not warned:
                log.warning("%s: the bus is failing over (%r); retrying", what, exc)
                warned = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)


KV_DUPLICATE_WINDOW_S = 120.0
"""The window for duplicates of a KV bucket whose entries live longer (as nats-py
makes a bucket)."""
STANDBY_POLL_S = 0.25
"""How often a standby tries to take a lease."""
RENEW_RETRY_S = 0.5
"""How soon a holder tries again after a renewal failed."""
RELEASE_WAIT_S = 1.0
"""How long a stopping holder tries to give its lease back."""


class LeaseLostError(RuntimeError):
    """Another holder has the lease (ours expired): stop acting as the leader now."""


class Outbox:
    """Events published in order without waiting for each one's ack: ``put`` returns
    once the event is queued (it waits only while ``limit`` are), and :meth:`run` sends
    what has queued meanwhile in pipelined batches (``Bus.publish_many``), one batch
    after the other, so JetStream stores them in the order they were put.

    For a service that publishes as it reads (the watcher): awaiting each publish's ack
    made it one round trip per event, so under a burst it fell behind the API server.
    A batch that cannot be stored even through a failover raises in :meth:`run`, which
    takes the service down; what was queued comes back from its relist."""

    BATCH = 512

    def __init__(self, bus: Bus, limit: int = 4096) -> None:
        self.bus = bus
        self.limit = limit
        self._queue: list[tuple[events.Event, otel_context.Context | None]] = []
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._sending = 0

    def __len__(self) -> int:
        return len(self._queue) + self._sending

    async def put(self, event: events.Event) -> None:
        """Queue ``event`` (in the current trace) for publishing."""
        while len(self._queue) >= self.limit:
            self._room.clear()
            await self._room.wait()
        self._queue.append((event, _trace()))
        self._wake.set()

    async def flush(self) -> None:
        """Send what is still queued (at shutdown, once :meth:`run` has stopped)."""
        while self._queue:
            batch = self._queue[: self.BATCH]
            del self._queue[: self.BATCH]
            await self.bus.publish_many([e for e, _ in batch], [c for _, c in batch])

    async def run(self) -> None:
        """Send what is queued, batch after batch, for ever."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._queue[: self.BATCH]
                del self._queue[: self.BATCH]
                self._room.set()
                self._sending = len(batch)
                try:
                    await self.bus.publish_many([e for e, _ in batch], [c for _, c in batch])
                finally:
                    self._sending = 0


class Lease:
    """Leader election on a KV key, fenced by its revision.

    The holder renews the key every third of the lease with a compare-and-set on the
    revision it last wrote. A standby takes the key only with a compare-and-set on a
    revision it has seen unchanged for a whole lease of prompt answers: counted from
    the first answer that showed it, and again from any answer that came late or after
    a failed read. A clean stop deletes the key, which a standby then creates. The key
    never expires by time: so while JetStream elects a new leader for the bucket (4 to
    9 s after losing a server), nobody can take the key, and the holder renews it as
    soon as the bus answers again.

    A holder that has not renewed for a whole lease (counted from when it sent its last
    successful renewal, so before any standby can have started counting) *pauses*:
    :attr:`acting` lapses, and the bus and API writes of its process wait on it
    (``Bus.fence``, ``kube.Client.fence``), as does the delivery of its events. It goes
    on trying: a renewal that succeeds proves that nobody took the key meanwhile, so its
    state is still right and it resumes where it stopped; a renewal refused (another
    identity wrote the key, or it was deleted) raises :class:`LeaseLostError`. Two
    holders never act at once, and a bus failover costs no restart and no state rebuild
    (docs/architecture.md, "Two of each").

    A bucket made by an older release expires its keys after its ``max_age``: until the
    allocator brings it to no expiry (``Bus.bucket``), a holder renews within it.

    ``identity`` must differ between replicas (the runtime's ``host-pid``: pods' host
    names are unique): a key holding this identity is taken as this process's own (a
    create or renewal stored whose answer was lost in a failover).
    """

    def __init__(self, bus: Bus, name: str, identity: str, lease_s: float) -> None:
        self.bus = bus
        self.name = name
        self.identity = identity
        self.lease_s = lease_s
        self.acting = Acting()
        """While this identity holds the lease and renewed it within the lease."""
        self._revision = 0
        self._bucket: KeyValue | None = None
        self._held = False

    async def _kv(self) -> KeyValue:
        if self._bucket is not None:
            return self._bucket
        kv = await through_failover(
            "lease bucket", lambda: self.bus.bucket(busauth.LEASE_BUCKET, ttl_s=0.0)
        )
        expiry = (await through_failover("lease bucket", kv.status)).ttl
        if expiry and expiry < self.lease_s:
            log.warning(
                "the %s bucket expires leases after %ss: %s renews within that, not %ss",
                busauth.LEASE_BUCKET,
                expiry,
                self.name,
                self.lease_s,
            )
            self.lease_s = expiry
        self._bucket = kv
        return kv

    def _hold_from(self, revision: int, sent: float) -> None:
        self._revision, self._held = revision, True
        self.acting.renew(sent + self.lease_s)

    async def acquire(self, standby: Callable[[], None] | None = None) -> None:
        """Wait until this identity holds the lease; ``standby`` is called once when
        another holds it."""
        kv = await self._kv()
        seen: tuple[int, float] | None = None  # a revision, and since when it is unchanged
        announced = False
        poll = min(STANDBY_POLL_S, self.lease_s / 3)
        while True:
            sent = time.monotonic()
            try:
                entry: Any = None
                with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                    entry = await kv.get(self.name)
                answered = time.monotonic()
                if entry is None:  # nobody holds it (never taken, or given back)
                    self._hold_from(await kv.create(self.name, self.identity.encode()), sent)
                    log.info("%s is the active %s", self.identity, self.name)
                    return
                if entry.value == self.identity.encode():
                    # ours: a create whose answer was lost (only this identity writes it)
                    self._hold_from(
                        await kv.update(self.name, entry.value, last=entry.revision), sent
                    )
                    log.info("%s is the active %s", self.identity, self.name)
                    return
                if seen is None or seen[0] != entry.revision or answered - sent > poll:
                    # Counted from now: a new renewal, or a late answer (the bus stalled:
                    # the holder may have had none either, and renews once it does).
                    seen = (entry.revision, answered)
                elif answered - seen[1] >= self.lease_s:
                    self._hold_from(
                        await kv.update(self.name, self.identity.encode(), last=entry.revision),
                        sent,
                    )
                    log.info(
                        "%s is the active %s: %s left it unrenewed for %.1fs",
                        self.identity,
                        self.name,
                        (entry.value or b"").decode(errors="replace"),
                        answered - seen[1],
                    )
                    return
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
                seen = None  # another got there first: watch the key again
            except (*TRANSIENT, TimeoutError) as exc:
                raise_if_cancelling()
                log.debug("lease %s: %r", self.name, exc)
                seen = None
            if not announced:
                log.info("%s waits as standby %s", self.identity, self.name)
                announced = True
                if standby is not None:
                    standby()
            # Polled often: a read is one small request, and the lease of a replica
            # that died is taken within this of a whole lease.
            await asyncio.sleep(poll)

    async def hold(self) -> None:
        """Renew the lease until it is lost (raises :class:`LeaseLostError`); pause and
        resume as the class says."""
        kv = await self._kv()
        pause = self.lease_s / 3
        paused = False
        while True:
            await asyncio.sleep(pause)
            sent = time.monotonic()
            if not paused and sent >= self.acting.until:
                paused = self._pause("its loop ran late")
            # While acting, bounded by the lease's end: the pause begins there, not when
            # a renewal still waiting for its answer times out.
            limit = (sent + self.lease_s if paused else self.acting.until) - sent
            revision: int | None = None
            try:
                async with asyncio.timeout(max(limit, 0.05)):
                    try:
                        revision = await kv.update(
                            self.name, self.identity.encode(), last=self._revision
                        )
                    except nats.js.errors.KeyWrongLastSequenceError:
                        revision = await self._ours(kv)
            except nats.js.errors.KeyNotFoundError:
                pass
            except (*TRANSIENT, TimeoutError) as exc:
                # A slow, reconnecting or failing-over server: try again, more often.
                raise_if_cancelling()
                if not paused and time.monotonic() >= self.acting.until:
                    paused = self._pause(repr(exc))
                elif not paused:
                    log.warning("renewing the %s lease failed (%r); retrying", self.name, exc)
                pause = min(STANDBY_POLL_S if paused else RENEW_RETRY_S, self.lease_s / 3)
                continue
            if revision is None:
                self._held = False
                self.acting.clear()
                raise LeaseLostError(f"{self.identity} lost the {self.name} lease")
            if paused:
                log.warning(
                    "%s: the %s lease renewed after %.1fs without: acting again",
                    self.identity,
                    self.name,
                    sent - (self.acting.until - self.lease_s),
                )
                paused = False
            self._hold_from(revision, sent)
            pause = self.lease_s / 3

    def _pause(self, why: str) -> bool:
        self.acting.clear()
        log.warning(
            "%s: the %s lease was not renewed within %gs (%s): paused until the bus answers",
            self.identity,
            self.name,
            self.lease_s,
            why,
        )
        return True

    async def _ours(self, kv: KeyValue) -> int | None:
        """The key's revision if it still holds this identity (a renewal stored whose
        answer was lost moved it on), else None."""
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            entry = await kv.get(self.name)
            if entry.value == self.identity.encode() and entry.revision is not None:
                return entry.revision
        return None

    async def release(self) -> None:
        """Give the lease back at a clean stop, so the standby takes it at once. Not
        when it was lost (nothing to give back), nor once ``RELEASE_WAIT_S`` passed (the
        bus is failing over): a standby takes it a lease after its last renewal, and a
        process stopping because the bus does not answer is not held up waiting for it."""
        if not self._held or self._bucket is None:
            return
        kv = self._bucket
        self._held = False
        self.acting.clear()
        with contextlib.suppress(
            nats.js.errors.KeyValueError, nats.js.errors.KeyNotFoundError, *TRANSIENT, TimeoutError
        ):
            async with asyncio.timeout(RELEASE_WAIT_S):
                entry = await kv.get(self.name)
                if entry.value == self.identity.encode():
                    await kv.delete(self.name, last=entry.revision)
