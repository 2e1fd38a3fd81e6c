"""The MPS control daemon of one node's cards in ``mps`` mode (``nodeAgent.mps``).

One ``nvidia-cuda-mps-control`` daemon serves every card of the node in ``mps`` mode
(``operatingMode``, shared/core/ledger.py ``sharing_mode``): started with ``-d``, with
``CUDA_VISIBLE_DEVICES`` naming those cards and its pipe and log directories below
``/run/tessera/mps`` (a host path every MPS container mounts, services/node_agent/isolation.py).
The agent talks to it as its clients do, one command per invocation on stdin:

- ``get_server_list``: the PIDs of its MPS servers (one per Linux user now served); a
  failure ("Cannot find MPS control daemon process") means no daemon answers;
- ``get_device_client_list``: the client PIDs per card (older daemons without it are
  counted per server with ``get_client_list <server PID>``);
- ``quit``: stop it.

:class:`MpsDaemon` starts it, or adopts one that already answers (a restarted agent
never kills the clients of running pods), asks it every ``checkIntervalS`` and starts it
again when it died, counts its clients per card, and quits it once the node has no card
in ``mps`` mode and no client is left. Its :meth:`MpsDaemon.state` goes into the
inventory (``DeviceInfo.mps`` and ``mps_clients``, see :func:`with_state`): a card whose
daemon is ``unavailable`` (no binary, or it will not start) is offered to no MPS pod.

Every command runs through asyncio with a time limit; an ordinary failure is logged
(once while it lasts) and reported as a state, never raised out of the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from shared.config import Config, MpsConfig
from shared.core.ledger import sharing_mode
from shared.core.model import DeviceInfo, DeviceUUID, MpsState

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 10.0
"""The longest one control command (or the daemon's start) may take."""
STARTUP_S = 5.0
"""How long a daemon just started has to answer ``get_server_list``."""
NO_DAEMON = "Cannot find MPS control daemon process"
CARDS_FILE = "tessera-cards"
"""In the pipe directory: the cards (UUIDs) the daemon was started for, so a restarted
agent knows whether the daemon it adopts serves the cards now in ``mps`` mode."""
PID_FILE = "nvidia-cuda-mps-control.pid"
"""In the pipe directory, written by the daemon itself."""

_UUID = re.compile(r"\b(?:GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{6,}")
_DEVICE = re.compile(r"(?i)(?:device\s*)?(\d+)\s*:?")


@dataclass(frozen=True)
class MpsReport:
    """What the inventory carries of the daemon: its state and the clients per card."""

    state: MpsState = ""
    clients: Mapping[DeviceUUID, int] = field(default_factory=dict)
    """Every card the daemon is for (zero when it has none); empty with state ``""``."""
    waiting: frozenset[DeviceUUID] = frozenset()
    """Cards set to mps since the running daemon started, which it does not serve: it
    is started again for them once its clients are gone; ``unavailable`` until then."""

    def of(self, card: DeviceUUID) -> MpsState:
        """The state one card publishes."""
        return "unavailable" if card in self.waiting else self.state


@dataclass(frozen=True)
class _Counted:
    per_card: dict[str, int]
    total: int


@dataclass(frozen=True)
class _Answer:
    code: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.code == 0 and NO_DAEMON not in self.out + self.err


def mps_cards(cfg: Config, node: str, devices: Iterable[DeviceInfo]) -> tuple[DeviceUUID, ...]:
    """The node's NVIDIA cards whose effective sharing mode is ``mps``."""
    override = cfg.node_override(node)
    return tuple(
        d.uuid for d in devices if d.vendor == "nvidia" and sharing_mode(d, override) == "mps"
    )


def with_state(devices: Iterable[DeviceInfo], report: MpsReport) -> tuple[DeviceInfo, ...]:
    """The devices as the agent publishes them: the cards the daemon is for carry its
    state and their client count; the others are left as read."""
    return tuple(
        msgspec.structs.replace(d, mps=report.of(d.uuid), mps_clients=report.clients[d.uuid])
        if d.uuid in report.clients
        else d
        for d in devices
    )


def _pids(text: str) -> set[int] | None:
    """The integers of ``text`` (blanks, commas or colons between them), or None when
    anything else is there."""
    words = re.split(r"[\s,:]+", text.strip())
    if not all(w.isdigit() for w in words if w):
        return None
    return {int(w) for w in words if w}


def parse_device_clients(text: str, order: Sequence[str] = ()) -> dict[str, set[int]] | None:
    """``get_device_client_list``'s answer: client PIDs per device UUID, or None when the
    text is not understood. A line naming a device (its UUID, or ``Device <i>`` / ``<i>:``
    for the ``i``-th of ``order``) starts a device; PIDs follow on that line or the next
    ones. Anything else makes the whole answer unreadable rather than misread."""
    out: dict[str, set[int]] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        found = _UUID.search(line)
        rest: str | None = None
        if found is not None:
            current, rest = found.group(0), line[found.end() :]
        elif (index := _DEVICE.fullmatch(line)) is not None and not line.isdigit():
            i = int(index.group(1))
            if i >= len(order):
                return None
            current, rest = order[i], ""
        if current is None:
            return None
        pids = _pids(line if rest is None else rest)
        if pids is None:
            return None
        out.setdefault(current, set()).update(pids)
    return out


class MpsDaemon:
    """The supervisor of one node's MPS control daemon (see the module's text)."""

    def __init__(self, cfg: MpsConfig, node: str, cards: Iterable[DeviceUUID] = ()) -> None:
        self.cfg = cfg
        self.node = node
        self.cards: tuple[DeviceUUID, ...] = tuple(cards)
        self._state: MpsState = ""
        self._clients: dict[DeviceUUID, int] = {}
        self._up: bool | None = None
        """Whether a daemon answered at the last look (None: not looked yet)."""
        self._served: tuple[str, ...] | None = None
        """The cards the running daemon was started for (None: not known)."""
        self._warned: set[str] = set()
        self._launch_failed = False

    # --- what the agent reads ---------------------------------------------------------

    def state(self) -> MpsReport:
        if not self.cards or not self._state:
            return MpsReport()
        clients = {c: self._clients.get(c, 0) for c in self.cards}
        waiting = frozenset(
            c
            for c in self.cards
            if self._state == "running" and self._served is not None and c not in self._served
        )
        return MpsReport(self._state, clients, waiting)

    @property
    def up(self) -> bool:
        """A daemon answered at the last look."""
        return bool(self._up)

    def set_cards(self, cards: Iterable[DeviceUUID]) -> None:
        """The cards now in ``mps`` mode (after a new reading of the devices); the next
        round starts the daemon for them, or stops it when none is left and it is idle."""
        self.cards = tuple(cards)

    # --- the loop -----------------------------------------------------------------------

    async def start(self) -> None:
        """The first look: adopt a daemon that answers, else start one (or report the
        cards ``unavailable``); with no card in ``mps`` mode, stop a daemon a previous run
        left when it has no client."""
        await self.check()

    async def supervise(self, changed: Callable[[], Awaitable[None]] | None = None) -> None:
        """Look again every ``checkIntervalS``; ``changed`` is awaited after a look that
        changed :meth:`state`."""
        while True:
            await asyncio.sleep(self.cfg.check_interval_s)
            if await self.check() and changed is not None:
                await changed()

    async def check(self) -> bool:
        """One look; True when :meth:`state` changed."""
        before = self.state()
        try:
            await self._round()
        except Exception:  # a bug here must not take the agent's other work down
            if "round" not in self._warned:
                self._warned.add("round")
                log.exception("node %s: supervising the MPS control daemon failed", self.node)
        return self.state() != before

    async def _round(self) -> None:
        if not self.cards:
            if self._up is not False:  # not looked yet, or a daemon ran
                await self.stop_if_idle()
            return
        binary = shutil.which(self.cfg.control_command)
        if binary is None:
            self._once(
                "binary",
                "node %s: %d card(s) set to mps but no %s on the PATH: they are offered to "
                "no MPS pod",
                self.node,
                len(self.cards),
                self.cfg.control_command,
            )
            self._up = False
            self._set("unavailable", {})
            return
        if "binary" in self._warned:
            self._warned.discard("binary")
            log.info("node %s: %s is on the PATH now", self.node, binary)
        first = self._up is None
        servers = await self._servers(binary)
        if servers is None:
            if self._up:
                log.warning(
                    "node %s: the MPS control daemon does not answer any more: starting it "
                    "again (its clients, if any, have lost their server)",
                    self.node,
                )
            self._reap()
            if not await self._launch(binary):
                self._up = False
                self._set("unavailable", {})
                return
            servers = []
        elif first:
            self._served = await asyncio.to_thread(self._read_cards)
            log.info(
                "node %s: adopted the running MPS control daemon (%d server(s)) in %s",
                self.node,
                len(servers),
                self.cfg.pipe_host_dir,
            )
        self._up = True
        counted = await self._count(binary, servers)
        if self._served is not None and set(self._served) != set(self.cards):
            if counted is not None and counted.total == 0:
                log.info(
                    "node %s: the MPS control daemon serves %s, the cards in mps mode are "
                    "%s now: starting it again for them",
                    self.node,
                    ",".join(self._served) or "none",
                    ",".join(self.cards),
                )
                if not await self._quit(binary) or not await self._launch(binary):
                    self._up = False
                    self._set("unavailable", {})
                    return
                counted = _Counted({}, 0)
            else:
                self._once(
                    "served",
                    "node %s: the MPS control daemon serves %s, not the cards in mps mode now "
                    "(%s): it is started again for them once its clients are gone",
                    self.node,
                    ",".join(self._served) or "none",
                    ",".join(self.cards),
                )
        self._set("running", counted.per_card if counted is not None else {})

    async def stop_if_idle(self) -> bool:
        """Quit the daemon when no card of the node is in ``mps`` mode and no client is
        left; True when no daemon runs any more. Clients that cannot be counted keep it."""
        if self.cards:
            return False
        binary = shutil.which(self.cfg.control_command)
        servers = await self._servers(binary) if binary is not None else None
        if binary is None or servers is None:
            self._up = False
            self._set("", {})
            return True
        if servers:
            counted = await self._count(binary, servers)
            if counted is None or counted.total:
                self._once(
                    "idle",
                    "node %s: no card is in mps mode any more: the MPS control daemon stops "
                    "once its clients are gone",
                    self.node,
                )
                self._up = True
                return False
        if not await self._quit(binary):
            self._up = True
            return False
        log.info(
            "node %s: no card in mps mode and no MPS client: the MPS control daemon stopped",
            self.node,
        )
        self._set("", {})
        return True

    def _set(self, state: MpsState, clients: Mapping[str, int]) -> None:
        self._state = state
        self._clients = {c: clients.get(c, 0) for c in self.cards}

    def _once(self, key: str, message: str, *args: object) -> None:
        """A warning logged once while its condition lasts."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    # --- the daemon ---------------------------------------------------------------------

    def _env(self, cards: Sequence[str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = self.cfg.pipe_host_dir
        env["CUDA_MPS_LOG_DIRECTORY"] = self.cfg.log_host_dir
        if cards is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(cards)
        return env

    def _make_dirs(self) -> None:
        """The pipe directory is open to every user (each pod's clients run as its own
        UID and must reach the daemon's pipes); the log directory is the daemon's."""
        pipe, logs = Path(self.cfg.pipe_host_dir), Path(self.cfg.log_host_dir)
        pipe.mkdir(parents=True, exist_ok=True)
        pipe.chmod(0o777)
        logs.mkdir(parents=True, exist_ok=True)

    def _read_cards(self) -> tuple[str, ...] | None:
        try:
            text = (Path(self.cfg.pipe_host_dir) / CARDS_FILE).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        return tuple(c for c in text.split() if c)

    def _write_cards(self, cards: Sequence[str]) -> None:
        path = Path(self.cfg.pipe_host_dir) / CARDS_FILE
        try:
            path.write_text("\n".join(cards) + "\n", encoding="utf-8")
        except OSError as exc:
            log.warning("node %s: cannot write %s: %s", self.node, path, exc)

    def _reap(self) -> None:
        """A daemon that died is a zombie of the agent when the agent is its container's
        first process (the daemon's parent exits at ``-d``, so it is re-parented here):
        collect it. Only that PID, and only then."""
        if os.getpid() != 1:
            return
        try:
            text = (Path(self.cfg.pipe_host_dir) / PID_FILE).read_text(encoding="utf-8")
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(text.strip()), os.WNOHANG)
        except (OSError, ValueError):
            return

    async def _launch(self, binary: str) -> bool:
        """Start the daemon for the cards now in ``mps`` mode and wait until it answers."""
        cards = self.cards
        try:
            await asyncio.to_thread(self._make_dirs)
        except OSError as exc:
            return self._launch_error(f"cannot create its directories: {exc}")
        with tempfile.TemporaryFile() as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    binary,
                    "-d",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=err,  # a file, not a pipe: the daemon may keep it open
                    env=self._env(cards),
                )
            except OSError as exc:
                return self._launch_error(f"{binary} -d: {exc}")
            try:
                code = await asyncio.wait_for(proc.wait(), COMMAND_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                return self._launch_error(f"{binary} -d took over {COMMAND_TIMEOUT_S:.0f} s")
            except asyncio.CancelledError:  # the agent stops: leave no caller behind
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                raise
            err.seek(0)
            said = err.read().decode(errors="replace").strip()
        if code != 0:
            return self._launch_error(f"{binary} -d exited with {code}: {said or 'no message'}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_S
        while await self._servers(binary) is None:
            if loop.time() > deadline:
                return self._launch_error(
                    f"it was started but does not answer (see {self.cfg.log_host_dir}/control.log)"
                )
            await asyncio.sleep(0.1)
        await asyncio.to_thread(self._write_cards, cards)
        self._served = cards
        self._launch_failed = False
        log.info(
            "node %s: started the MPS control daemon for %s (pipes in %s)",
            self.node,
            ",".join(cards),
            self.cfg.pipe_host_dir,
        )
        return True

    def _launch_error(self, why: str) -> bool:
        if not self._launch_failed:
            self._launch_failed = True
            log.warning(
                "node %s: cannot start the MPS control daemon (%s): %d card(s) set to mps "
                "are offered to no MPS pod; trying again every %.0f s",
                self.node,
                why,
                len(self.cards),
                self.cfg.check_interval_s,
            )
        return False

    async def _quit(self, binary: str) -> bool:
        answer = await self._control(binary, "quit")
        if answer is None or not answer.ok:
            why = "no answer" if answer is None else (answer.err or answer.out).strip()
            log.warning("node %s: the MPS control daemon did not quit: %s", self.node, why)
            return False
        self._up = False
        self._served = None
        with contextlib.suppress(OSError):
            await asyncio.to_thread((Path(self.cfg.pipe_host_dir) / CARDS_FILE).unlink)
        return True

    # --- commands -----------------------------------------------------------------------

    async def _control(self, binary: str, *command: str) -> _Answer | None:
        """One command to the daemon; None when it could not be run in time."""
        try:
            proc = await asyncio.create_subprocess_exec(
                binary,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(),
            )
        except OSError as exc:
            self._once("exec", "node %s: cannot run %s: %s", self.node, binary, exc)
            return None
        self._warned.discard("exec")
        try:
            out, err = await asyncio.wait_for(
                proc.communicate((" ".join(command) + "\n").encode()), COMMAND_TIMEOUT_S
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            log.warning(
                "node %s: `%s` to the MPS control daemon took over %.0f s",
                self.node,
                " ".join(command),
                COMMAND_TIMEOUT_S,
            )
            return None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        code = proc.returncode if proc.returncode is not None else -1
        return _Answer(code, out.decode(errors="replace"), err.decode(errors="replace"))

    async def _servers(self, binary: str) -> list[int] | None:
        """The daemon's server PIDs; None when no daemon answers."""
        answer = await self._control(binary, "get_server_list")
        if answer is None or not answer.ok:
            return None
        pids = _pids(answer.out)
        if pids is None:
            self._once(
                "servers",
                "node %s: cannot read the MPS server list %r: counted as none",
                self.node,
                answer.out[:200],
            )
            return []
        return sorted(pids)

    async def _count(self, binary: str, servers: Sequence[int]) -> _Counted | None:
        """The clients per card and in all; None when they cannot be read (logged once:
        the cards report none)."""
        if not servers:
            return _Counted({}, 0)
        answer = await self._control(binary, "get_device_client_list")
        if answer is not None and answer.ok:
            per_device = parse_device_clients(answer.out, self._served or self.cards)
            if per_device is not None:
                every: set[int] = set().union(*per_device.values())
                return _Counted({k: len(v) for k, v in per_device.items()}, len(every))
            self._once(
                "device-list",
                "node %s: cannot read get_device_client_list %r: counting clients per server",
                self.node,
                answer.out[:200],
            )
        clients: set[int] = set()
        for server in servers:
            answer = await self._control(binary, "get_client_list", str(server))
            pids = _pids(answer.out) if answer is not None and answer.ok else None
            if pids is None:
                self._once(
                    "client-list",
                    "node %s: cannot read the clients of MPS server %d (%r): its cards report 0",
                    self.node,
                    server,
                    (answer.err or answer.out)[:200] if answer is not None else "no answer",
                )
                return None
            clients |= pids
        # A server serves every card of the daemon; which card each client uses is not
        # said here, so each card reports all of them (exact with one card).
        return _Counted(dict.fromkeys(self.cards, len(clients)), len(clients))
