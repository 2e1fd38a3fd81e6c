"""How every service process runs: config, logging, tracing, the bus, named tasks, shutdown.

A service is one coroutine ``main(rt)`` that starts its work with :meth:`Runtime.spawn`
and returns. The runtime then supervises: every task is named; a task that ends
unexpectedly (returns or raises) is logged and brings the service down, so a broken
service restarts (its pod restarts) instead of half-running. SIGTERM or SIGINT stops
the tasks, gives them a grace period, cancels the rest, drains the bus, then exits; a
failure is re-raised after the clean-up.

Every service answers ``tessera.ctl.ping`` with its name, instance and config hash
(``tessera ping`` lists them; the demo uses it to show the services are alive).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from importlib import metadata
from typing import Any

import msgspec
from nats.aio.msg import Msg

from shared import config as config_module
from shared import events
from shared.bus import Bus
from shared.config import Config, config_hash
from shared.telemetry import setup_logging, setup_tracing

log = logging.getLogger(__name__)


def version() -> str:
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
        self._failed = asyncio.Event()
        self._failure: BaseException | None = None

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a named root task; its unexpected end stops the service."""
        task = asyncio.create_task(coro, name=f"{self.service}:{name}")
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
        if task.cancelled():
            return
        exc = task.exception()
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
        if self._failure is not None:
            raise self._failure

    async def _shutdown(self, grace_s: float) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.remove_done_callback(self._on_done)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


ServiceMain = Callable[[Runtime], Awaitable[None]]


async def run_service(
    service: str,
    cfg: Config,
    main: ServiceMain,
    *,
    args: argparse.Namespace | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run one service until SIGTERM/SIGINT (or ``stop``) or a failure of one of its tasks.

    Given ``stop``, the service runs inside the caller's process and loop: no signal
    handlers, no logging or tracing set-up (tests run several services this way).
    """
    if stop is None:
        setup_logging(service, cfg.telemetry.log_level)
        setup_tracing(service, cfg.telemetry)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
    async with Bus(cfg.nats, name=service) as bus:
        rt = Runtime(service, cfg, bus, args)
        log.info(
            "%s %s starting (config %s, nats %s)", service, version(), rt.config_hash, cfg.nats.url
        )
        await main(rt)
        await rt.serve(stop)
        log.info("%s stopped", service)


def main_entry(
    service: str,
    main: ServiceMain,
    argv: list[str] | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """``python -m services.<name> [--config FILE] [service options]``: load and run."""
    parser = argparse.ArgumentParser(prog=f"tessera {service}")
    parser.add_argument("--config", help="tessera.yaml (default: $TESSERA_CONFIG, else built-in)")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        cfg = config_module.load(args.config)
    except config_module.ConfigError as exc:
        raise SystemExit(f"tessera {service}: {exc}") from None
    asyncio.run(run_service(service, cfg, main, args=args))
