"""How every service process runs: config, logging, tracing, the bus, named tasks, shutdown.

A service is a :class:`Service` subclass: its handlers per event type, what it reads at
start and its loops; :func:`serve` starts every service the same way. The runtime then
supervises: every task is named; a task that ends unexpectedly (returns or raises) is
logged and brings the service down, so a broken service restarts (its pod restarts)
instead of half-running. SIGTERM or SIGINT cancels the tasks, gives them a grace period
to unwind, runs the ``on_stop`` steps (close clients, give up a lease), drains the bus,
then exits; a failure is re-raised after the clean-up.

Every service answers ``tessera.ctl.ping`` with its name, instance and config hash
(``tessera ping`` lists them; the demo uses it to show the services are alive), and
``/healthz`` and ``/readyz`` on ``telemetry.metricsPort`` (shared/health.py; the checks
are added here: NATS connected, role known, and once active: API server reachable, the
durable consumer caught up).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from importlib import metadata
from typing import Any, ClassVar, TypeVar

import msgspec
import uvloop
from nats.aio.msg import Msg

from shared import config as config_module
from shared import events, kube
from shared.aio import raise_if_cancelling, stop_on_signals
from shared.bus import VIEW_ERROR_HEADER, Bus, Delivery, Lease, LeaseLostError, through_failover
from shared.config import Config, config_hash
from shared.health import API_CHECK_TTL_S, Cached, Health, Latch
from shared.metrics import Metrics
from shared.telemetry import setup_logging, setup_tracing

log = logging.getLogger(__name__)


def version() -> str:
    """Tessera's installed package version, or ``dev`` when run from a checkout."""
    try:
        return metadata.version("tessera")
    except metadata.PackageNotFoundError:
        return "dev"


class Runtime:
    """What a service's ``main`` gets: its config, the bus, and a supervised task group."""

    def __init__(
        self, service: str, cfg: Config, bus: Bus, args: argparse.Namespace | None = None
    ) -> None:
        self.service = service
        self.cfg = cfg
        self.bus = bus
        self.args = args or argparse.Namespace()
        """The service's own command-line options (see ``add_arguments``)."""
        self.config_hash = config_hash(cfg)
        self.instance = f"{socket.gethostname()}-{os.getpid()}"
        self.started_at = time.time()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._finite: set[asyncio.Task[Any]] = set()
        self._failed = asyncio.Event()
        self._failure: BaseException | None = None
        self._on_stop: list[Callable[[], Awaitable[Any]]] = []
        self.role = "starting"
        """``electing``, ``standby`` (another replica holds the lease), ``starting``
        (reading its state), ``active``, or ``lost`` (its lease: it stops, and does
        nothing more as the active replica): readiness says it, and that an active one
        is paused (:attr:`acting`)."""
        self.health = Health(alive=self._alive)
        self.health.add("nats", self._bus_check)
        self.health.add("role", self._role_check)
        self.metrics = Metrics(f"tessera.{service}")
        """Its ``/metrics`` (shared/metrics.py), served with the health checks."""
        self.health.routes.append(self.metrics.route())
        self.lag: tuple[tuple[str, int], ...] = ()
        """Its durable consumer's events not yet handled (``tessera_bus_pending_messages``)."""
        self.metrics.gauge(
            "tessera_bus_pending_messages",
            "Events published for this service's consumer and not yet acked by it.",
            lambda: [(n, {"service": service, "consumer": c}) for c, n in self.lag],
        )
        sent = self.metrics.counter(
            "tessera_events_published", "Events this service stored on the bus, by type."
        )
        self.handled = self.metrics.counter(
            "tessera_events_handled", "Events this service handled, by type."
        )
        bus.published = lambda event: sent.add(1, {"type": str(event.__struct_config__.tag)})
        self.metrics.gauge(
            "tessera_active",
            "1 while this replica is the active one (holds the lease), else 0.",
            lambda: [(int(self.role == "active" and self.acting), {"service": service})],
        )

    @property
    def acting(self) -> bool:
        """False once its lease is lost, and while a leader is paused because its lease
        went unrenewed (shared/bus.py ``Lease``): its writes wait meanwhile."""
        return self.role != "lost" and (self.bus.fence is None or self.bus.fence.is_set())

    def _alive(self) -> str | None:
        if self._failed.is_set():
            return f"a task failed ({self._failure!r}); the service is stopping"
        return None

    async def _bus_check(self) -> str | None:
        return self.bus.connected()

    async def _role_check(self) -> str | None:
        if self.role == "active" and not self.acting:
            return "paused: its lease went unrenewed (the bus does not answer) until renewed"
        if self.role in ("standby", "active"):
            return None
        return {
            "electing": "not yet known whether it leads or stands by",
            "starting": "taking over: reading its state before the first event",
            "lost": "it lost its lease: stopping",
        }.get(self.role, self.role)

    def on_stop(self, callback: Callable[[], Awaitable[Any]]) -> None:
        """Run ``callback`` at shutdown, after the tasks have stopped (close clients)."""
        self._on_stop.append(callback)

    def spawn(
        self, coro: Coroutine[Any, Any, Any], name: str, *, finite: bool = False
    ) -> asyncio.Task[Any]:
        """Run ``coro`` as a named root task. Its failure stops the service; so does its
        return, unless ``finite`` (a one-off job that is meant to end)."""
        task = asyncio.create_task(coro, name=f"{self.service}:{name}")
        if finite:
            self._finite.add(task)
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def adopt(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        """Supervise a task created elsewhere (e.g. a bus consumer)."""
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        finite = task in self._finite
        self._finite.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and finite:
            return
        if exc is not None:
            log.error("task %s failed", task.get_name(), exc_info=exc)
            self._failure = self._failure or exc
        else:
            log.error("task %s ended unexpectedly", task.get_name())
            self._failure = self._failure or RuntimeError(f"task {task.get_name()} ended")
        self._failed.set()

    async def _answer_ping(self, msg: Msg) -> None:
        hello = events.ServiceHello(
            service=self.service,
            instance=self.instance,
            config_hash=self.config_hash,
            started_at=self.started_at,
            version=version(),
        )
        await msg.respond(msgspec.json.encode(hello))

    async def answer(self, subject: str, make: ViewHandler) -> None:
        """Answer requests on ``subject`` with ``make``'s view until the service stops. A
        view that fails is answered with the reason in a header (shared/bus.py ``ask``),
        logged, and the service goes on."""

        async def respond(msg: Msg) -> None:
            if not msg.reply:
                return
            try:
                view = await make(msg.data)
            except Exception as exc:
                log.exception("view %s failed", subject)
                why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                await self.bus.nc.publish(msg.reply, b"", headers={VIEW_ERROR_HEADER: why})
                return
            await self.bus.nc.publish(msg.reply, msgspec.json.encode(view))

        sub = await self.bus.nc.subscribe(subject, cb=respond)
        self.on_stop(sub.unsubscribe)

    async def serve(self, stop: asyncio.Event, grace_s: float = 10.0) -> None:
        """Wait for a stop request or a task failure, then shut the tasks down."""
        sub = await self.bus.nc.subscribe(events.CONTROL_PING_SUBJECT, cb=self._answer_ping)
        stopper = asyncio.create_task(stop.wait(), name=f"{self.service}:stop")
        failer = asyncio.create_task(self._failed.wait(), name=f"{self.service}:failed")
        try:
            await asyncio.wait({stopper, failer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            failer.cancel()
            await sub.unsubscribe()
            await self._shutdown(grace_s)
            for callback in reversed(self._on_stop):
                try:
                    await callback()
                except Exception:
                    log.exception("shutdown step failed")
        if self._failure is not None:
            raise self._failure

    async def _shutdown(self, grace_s: float) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.remove_done_callback(self._on_done)
        if not tasks:
            return
        # Every task is a loop that would never end by itself: cancel them all, then give
        # them the grace period to unwind. Work cut short is not acked, so it is redelivered.
        # A library may swallow a cancellation that races its own timers, so the request
        # is repeated until the task ends or the grace period is over.
        stuck = set(tasks)
        deadline = asyncio.get_running_loop().time() + grace_s
        while stuck and (left := deadline - asyncio.get_running_loop().time()) > 0:
            for task in stuck:
                task.cancel()
            _, stuck = await asyncio.wait(stuck, timeout=min(left, 0.5))

        for task in stuck:
            where = "".join(
                f"\n  {f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
                for f in task.get_stack()
            )
            log.error(
                "task %s did not stop within %.0fs; it waits at:%s", task.get_name(), grace_s, where
            )


ViewHandler = Callable[[bytes], Awaitable[msgspec.Struct]]
"""Makes one view from the request's payload (a query, or empty)."""

E = TypeVar("E", bound=events.Event)
R = TypeVar("R")
EventHandler = Callable[[Any, E], Awaitable[None]]


def handles(*types: type[events.Event]) -> Callable[[EventHandler[E]], EventHandler[E]]:
    """Mark a :class:`Service` method as the handler of these event types; the service's
    consumer then filters on their subjects (see ``Service.subjects``)."""

    def mark(method: EventHandler[E]) -> EventHandler[E]:
        method.__dict__[_HANDLES] = types
        return method

    return mark


_HANDLES = "__tessera_handles__"


class Service:
    """One service's shell: the events it handles, what it reads at start, its loops.

    A subclass names itself (``NAME``), marks its handlers with :func:`handles` (one
    method per event type; the consumer's subjects follow from them), and may override
    :meth:`start` (read state once the consumer exists, before the first event: nothing
    published meanwhile is missed) and :meth:`tasks` (named loops). :func:`serve` does
    the rest for every service alike: connects to the API server (``USES_API``), waits
    for the lease (``LEADER``: one active replica), creates the durable consumer,
    starts, consumes and supervises the loops.
    """

    NAME: ClassVar[str]
    USES_API: ClassVar[bool] = True
    LEADER: ClassVar[bool] = True
    """Only the replica holding the ``NAME`` lease acts; the others wait as standbys
    (every central service; a node agent is alone on its node and says False)."""
    ACK_WAIT_S: ClassVar[float | None] = None
    _table: ClassVar[dict[type[events.Event], str]]

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        self.rt = rt
        self._api = api

    @property
    def api(self) -> kube.Client:
        """The API server (services with ``USES_API``)."""
        if self._api is None:
            raise RuntimeError(f"{self.NAME} runs without the API server")
        return self._api

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type[events.Event], str] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                for event_type in getattr(member, _HANDLES, ()):
                    table[event_type] = name
        cls._table = table

    @classmethod
    def handled(cls) -> tuple[type[events.Event], ...]:
        """The event types this service handles."""
        return tuple(cls._table)

    @classmethod
    def check_args(cls, cfg: Config, args: argparse.Namespace | None) -> None:
        """Refuse, with a ``ConfigError``, options that do not fit the config."""

    @classmethod
    def lease_key(cls, rt: Runtime) -> str:
        """The lease its replicas compete for (one per service; an allocator's per shard)."""
        return cls.NAME

    def durable(self) -> str:
        """The durable consumer's name (one per service; a node agent's is per node, an
        allocator's per shard)."""
        return self.NAME

    def subjects(self) -> list[str]:
        """The consumer's filter subjects: one per handled event type."""
        return sorted({t.filter_subject() for t in self._table})

    def concurrency(self) -> int:
        """Handlers that may run at once (1: one at a time, in stream order)."""
        return 1

    async def start(self) -> None:
        """Read what the service needs before its first event (the consumer exists)."""

    def tasks(self) -> dict[str, Coroutine[Any, Any, Any]]:
        """The service's named loops, supervised by the runtime."""
        return {}

    def views(self) -> dict[str, ViewHandler]:
        """The views it answers (shared/views.py), by subject: only while active."""
        return {}

    async def handle(self, event: events.AnyEvent, _delivery: Delivery) -> None:
        """Call the handler of the event's type; other events are not this service's."""
        name = self._table.get(type(event))
        if name is not None:
            await getattr(self, name)(event)
            self.rt.handled.add(1, {"type": str(event.__struct_config__.tag)})


async def serve(rt: Runtime, service: type[Service]) -> None:
    """Start ``service`` in ``rt`` (see :class:`Service`); a leader waits for its lease in
    a supervised task, so a standby is alive and answering pings meanwhile."""
    if service.LEADER:
        lease = Lease(rt.bus, service.lease_key(rt), rt.instance, rt.cfg.scheduler.leader_lease_s)
        rt.spawn(_lead(rt, service, lease), "lead")
    else:
        await _start(rt, service)


async def _lead(rt: Runtime, service: type[Service], lease: Lease) -> None:
    rt.role = "electing"

    def standby() -> None:
        rt.role = "standby"

    await lease.acquire(standby)
    rt.role = "starting"
    rt.bus.fence = lease.acting
    rt.on_stop(lease.release)
    # Renewed from now on: rebuilding a large cluster's state may take longer than the
    # lease (12,500 nodes: 10-20 s on 2 cores). While it goes unrenewed (the bus fails
    # over) the service's writes wait on ``lease.acting``; ``hold`` raises when the lease
    # is lost: the service stops (starting or not) and restarts.
    holding = asyncio.ensure_future(lease.hold())
    starting = asyncio.ensure_future(_start(rt, service))
    try:
        await asyncio.wait({holding, starting}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            holding.result()  # it can only have ended by raising
        starting.result()
        await holding
    except LeaseLostError:
        rt.role = "lost"  # another replica may act now: nothing more is done as this one
        raise
    finally:
        for task in (starting, holding):
            task.cancel()
        await asyncio.gather(starting, holding, return_exceptions=True)


async def _start(rt: Runtime, service: type[Service]) -> None:
    api = None
    if service.USES_API:
        api = await kube.connect(rt.cfg.kubernetes, service.NAME)
        api.fence = rt.bus.fence
        rt.on_stop(api.close)
        client = api

        async def reachable() -> str | None:
            return await kube.unreachable(client)

        rt.health.add("kube-apiserver", Cached(reachable, API_CHECK_TTL_S))
    svc = service(rt, api)
    durable, subjects = svc.durable(), svc.subjects()
    if subjects:
        # The consumer first, so nothing published while ``start`` reads is missed. (Both
        # calls may be repeated: a replica started while the bus fails over waits for it.)
        await through_failover(
            "consumer",
            lambda: rt.bus.ensure_consumer(
                durable, subjects, deliver="new", ack_wait_s=svc.ACK_WAIT_S
            ),
        )
        # One process at a time owns a consumer (the lease holder, or a node's agent):
        # what the previous owner took and never acked comes again now, not after
        # ``ack_wait``.
        await through_failover("consumer", lambda: rt.bus.reset_consumer(durable))
        # Ready once it has been handed what was published before it took over.
        backlog = await through_failover("stream info", rt.bus.last_seq)

        async def caught_up() -> str | None:
            return await rt.bus.behind(durable, backlog)

        rt.health.add("consumer", Latch(caught_up))
        rt.spawn(_measure_lag(rt, durable), "bus-lag")
    await svc.start()
    if subjects:
        rt.adopt(
            rt.bus.consume(
                durable,
                subjects,
                svc.handle,
                deliver="new",
                ack_wait_s=svc.ACK_WAIT_S,
                concurrency=svc.concurrency(),
            )
        )
    for name, coro in svc.tasks().items():
        rt.spawn(coro, name)
    for subject, make in svc.views().items():
        await rt.answer(subject, make)
    rt.role = "active"


LAG_INTERVAL_S = 5.0


async def _measure_lag(rt: Runtime, durable: str) -> None:
    """How far behind its consumer is, every ``LAG_INTERVAL_S`` (a failed read keeps the
    last figure: the bus may be failing over)."""
    while True:
        try:
            info = await rt.bus.js.consumer_info(rt.cfg.nats.stream, durable)
            rt.lag = ((durable, info.num_pending + info.num_ack_pending),)
        except Exception as exc:
            raise_if_cancelling()
            log.debug("consumer info of %s: %r", durable, exc)
        await asyncio.sleep(LAG_INTERVAL_S)


async def report_catch_up(rt: Runtime, durable: str, poll_s: float = 0.1) -> None:
    """Log how long the consumer took, once started, to handle every event published
    before (the backlog of a restart): one line, ``startup phase catch-up``."""
    started = time.monotonic()
    mark = 0
    while True:
        try:  # a bus that does not answer now is asked again: this only logs
            mark = mark or await rt.bus.last_seq()
            info = await rt.bus.js.consumer_info(rt.cfg.nats.stream, durable)
        except Exception as exc:
            raise_if_cancelling()
            log.debug("catch-up of %s not known yet (%r)", durable, exc)
            await asyncio.sleep(poll_s)
            continue
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        if (floor or 0) >= mark or not (info.num_pending or info.num_ack_pending):
            break
        await asyncio.sleep(poll_s)
    log.info(
        "startup phase catch-up: %.2f s (its consumer's events to stream seq %d)",
        time.monotonic() - started,
        mark,
    )


async def run_service(
    service: type[Service],
    cfg: Config,
    *,
    args: argparse.Namespace | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run one service until SIGTERM/SIGINT (or ``stop``) or a failure of one of its tasks.

    Given ``stop``, the service runs inside the caller's process and loop: no signal
    handlers, no logging or tracing set-up, no HTTP port unless ``args.http_port`` names
    one (tests run several services this way).
    """
    name = service.NAME
    port = getattr(args, "http_port", None)
    if port is None:  # in the caller's process (tests): no port unless asked for one
        port = cfg.telemetry.metrics_port if stop is None else 0
    if stop is None:
        setup_logging(name, cfg.telemetry.log_level)
        setup_tracing(name, cfg.telemetry)
        stop = stop_on_signals()
    async with Bus(cfg.nats, name=name) as bus:
        rt = Runtime(name, cfg, bus, args)
        log.info(
            "%s %s starting (config %s, nats %s)", name, version(), rt.config_hash, cfg.nats.url
        )
        await serve(rt, service)
        if port:
            runner = await rt.health.serve(port)
            rt.on_stop(runner.cleanup)
        await rt.serve(stop)
        log.info("%s stopped", name)


def load_or_exit(prog: str, path: str | None) -> Config:
    """The config at ``path`` (else ``$TESSERA_CONFIG``, else built-in), or exit with the
    error in one line naming ``prog``."""
    try:
        return config_module.load(path)
    except config_module.ConfigError as exc:
        raise SystemExit(f"{prog}: {exc}") from None


def process_main(
    name: str,
    run: Callable[[Config, asyncio.Event, argparse.Namespace], Awaitable[None]],
    argv: list[str] | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """``tessera <name> [--config FILE] [options]`` for a process off the bus (the webhook,
    the dashboard): load the config, set up logging, ``run`` until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog=f"tessera {name}")
    parser.add_argument("--config", help="tessera.yaml (default: $TESSERA_CONFIG, else built-in)")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = load_or_exit(f"tessera {name}", args.config)
    setup_logging(name, cfg.telemetry.log_level)

    async def serve() -> None:
        await run(cfg, stop_on_signals(), args)
        log.info("%s stopped", name)

    run_process(serve())


def run_process(main: Coroutine[Any, Any, R]) -> R:
    """Run a process's ``main`` to its end on uvloop's event loop (libuv's, in C). Every
    service spends most of its CPU in the loop's sockets and TLS (the bus, the API
    server); bench/RESULTS.md has what it saves."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def main_entry(
    service: type[Service],
    argv: list[str] | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """``python -m services.<name> [--config FILE] [service options]``: load, check (the
    service's options; its grant key, shared/config.py ``check_grant_key``) and run; a
    config that fails a check exits at once, naming the key."""
    parser = argparse.ArgumentParser(prog=f"tessera {service.NAME}")
    parser.add_argument("--config", help="tessera.yaml (default: $TESSERA_CONFIG, else built-in)")
    parser.add_argument(
        "--http-port",
        type=int,
        metavar="PORT",
        help="serve /healthz, /readyz (and /metrics) here instead of telemetry.metricsPort "
        "(0: not at all; several services on one host each need their own)",
    )
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = load_or_exit(f"tessera {service.NAME}", args.config)
    try:
        service.check_args(cfg, args)
        config_module.check_grant_key(cfg, service.NAME)
    except config_module.ConfigError as exc:
        raise SystemExit(f"tessera {service.NAME}: {exc}") from None
    run_process(run_service(service, cfg, args=args))
