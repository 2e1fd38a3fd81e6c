"""``/healthz`` and ``/readyz`` of every service (and a service's own routes, such as the
node agent's ``/metrics``) on ``telemetry.metricsPort``.

The answers follow kube-apiserver's: one line per check, ``[+]name ok`` or
``[-]name failed: why``, then ``healthz check passed`` / ``readyz check failed``; 200 when
every check passed, 503 otherwise. ``?verbose`` is accepted (the lines are always there).

- ``/healthz`` (liveness): the event loop answers and no supervised task has failed. A
  service whose task failed is already on its way down (shared/runtime.py), so this fails
  only in the moments before it exits, or when its loop is stuck.
- ``/readyz``: each readiness check of :class:`Health` (shared/runtime.py adds them:
  connected to NATS, role known: leader or standby, and for the active one, the API
  server answering and the durable consumer caught up with what was published before
  it took over).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

log = logging.getLogger(__name__)

Check = Callable[[], Awaitable[str | None]]
"""A readiness check: None when it passes, else why not (one line)."""

CHECK_TIMEOUT_S = 2.0
"""A check that has not answered in this long fails, so one slow check cannot hold the
answer past the probes' ``timeoutSeconds`` (3 s in deploy/kustomize)."""

API_CHECK_TTL_S = 5.0
"""How long a readiness answer about the API server is reused."""


@dataclass
class Health:
    """What a service says of itself over HTTP."""

    alive: Callable[[], str | None]
    """Liveness: None while alive, else why not."""
    checks: dict[str, Check] = field(default_factory=dict)
    routes: list[web.RouteDef] = field(default_factory=list)
    """More routes on the same port (the node agent's ``/metrics``)."""

    def add(self, name: str, check: Check) -> None:
        """A readiness check, answered under ``name`` (added again: replaced)."""
        self.checks[name] = check

    async def ready(self) -> tuple[bool, list[str]]:
        """Every check at once, each bounded by :data:`CHECK_TIMEOUT_S`."""
        names = list(self.checks)
        results = await asyncio.gather(
            *(_bounded(self.checks[n]) for n in names), return_exceptions=True
        )
        lines, ok = [], True
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                result = f"{type(result).__name__}: {result}"
            ok &= result is None
            lines.append(f"[+]{name} ok" if result is None else f"[-]{name} failed: {result}")
        return ok, lines

    def install(self, app: web.Application) -> None:
        """Answer ``/healthz``, ``/livez``, ``/readyz`` and :attr:`routes` in ``app``."""
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/livez", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_routes(self.routes)

    async def serve(self, port: int, host: str = "0.0.0.0") -> web.AppRunner:
        """Listen on ``port``; the caller cleans the runner up at shutdown."""
        app = web.Application()
        self.install(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        log.info("health on :%d (/healthz, /readyz%s)", port, _more(self.routes))
        return runner

    async def _healthz(self, _request: web.Request) -> web.Response:
        why = self.alive()
        line = "[+]alive ok" if why is None else f"[-]alive failed: {why}"
        return _answer("healthz", why is None, [line])

    async def _readyz(self, _request: web.Request) -> web.Response:
        ok, lines = await self.ready()
        return _answer("readyz", ok, lines)


async def _bounded(check: Check) -> str | None:
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
    except TimeoutError:
        return f"no answer in {CHECK_TIMEOUT_S:.0f}s"


def _answer(what: str, ok: bool, lines: list[str]) -> web.Response:
    text = "\n".join([*lines, f"{what} check {'passed' if ok else 'failed'}", ""])
    return web.Response(text=text, status=200 if ok else 503)


def _more(routes: list[web.RouteDef]) -> str:
    return "".join(f", {r.path}" for r in routes)


class Cached:
    """A check's last answer kept ``ttl_s`` (probes of many replicas then cost the API
    server one request per ``ttl_s`` each, whatever the probe period)."""

    def __init__(self, check: Check, ttl_s: float) -> None:
        self.check = check
        self.ttl_s = ttl_s
        self._at = -float("inf")
        self._last: str | None = None

    async def __call__(self) -> str | None:
        """The check's last answer, asked again (within ``CHECK_TIMEOUT_S``) once it is ``ttl_s``
        old."""
        now = time.monotonic()
        if now - self._at >= self.ttl_s:
            self._last = await _bounded(self.check)
            self._at = now
        return self._last


class Latch:
    """A check that, once passed, stays passed (``caught up`` with a backlog)."""

    def __init__(self, check: Check) -> None:
        self.check = check
        self.passed = False

    async def __call__(self) -> str | None:
        """None for good once the check has passed; until then, the check's answer."""
        if self.passed:
            return None
        why = await self.check()
        self.passed = why is None
        return why
