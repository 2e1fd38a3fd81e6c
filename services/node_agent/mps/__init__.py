"""NVIDIA MPS on one node: a control daemon per card in ``mps`` mode (``nodeAgent.mps``).

An MPS control daemon serves one Linux user at a time for every GPU it controls, and a
client process reaches exactly one daemon, the one of its ``CUDA_MPS_PIPE_DIRECTORY``. So
each card in ``mps`` mode (``operatingMode``, shared/core/ledger.py ``sharing_mode``) gets
a daemon of its own, started with ``CUDA_VISIBLE_DEVICES`` naming that card, and a
directory of its own on the host, ``<hostDir>/<card UUID>/`` (:func:`card_dirs`):

- ``pipe/``: the daemon's ``CUDA_MPS_PIPE_DIRECTORY``, mounted into each of the card's MPS
  containers at ``pipeContainerDir`` (services/node_agent/isolation.py);
- ``log/``: its ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``, ``server.log``);
- ``shm/``: its ``/dev/shm`` and its clients' (an MPS server and its clients share memory
  there): the daemon runs in a mount namespace of its own with ``shm/`` on ``/dev/shm``
  (``privateShm``), and each client container gets it mounted at ``/dev/shm``.

A container that asks for two or more cards in ``mps`` mode would reach one daemon only:
the scheduler refuses it (shared/core/families.py ``MPS_MULTI_CARD``).

The parts: supervisor.py starts and supervises the daemons, in a process of its own
(``tessera node-agent mps-control``, its own DaemonSet) so that they outlive the node
agent; reader.py is the agent's side, which only asks each card's daemon for its state
and clients and publishes them; control.py is the control command both use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shared.config import Config, MpsConfig
from shared.core.ledger import sharing_mode
from shared.core.model import DeviceInfo, DeviceUUID

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class CardDirs:
    """One card's MPS directories on the host (see the module's text)."""

    root: Path
    pipe: Path
    log: Path
    shm: Path


def card_dirs(cfg: MpsConfig, card: DeviceUUID) -> CardDirs:
    """Where ``card``'s daemon keeps its pipes, logs and shared memory on the host; a
    ValueError for a UUID that is not a plain file name (it gets no directory)."""
    if not _PLAIN_NAME.fullmatch(card):
        raise ValueError(f"card UUID {card!r} is not a plain file name")
    root = Path(cfg.host_dir) / card
    return CardDirs(root, root / "pipe", root / "log", root / "shm")


def mps_cards(cfg: Config, node: str, devices: Iterable[DeviceInfo]) -> tuple[DeviceUUID, ...]:
    """The node's NVIDIA cards whose effective sharing mode is ``mps``: the cards that get
    a daemon. A card whose UUID is not a plain file name is left out (no directory, no
    daemon, so it is offered to no MPS pod)."""
    override = cfg.node_override(node)
    return tuple(
        d.uuid
        for d in devices
        if d.vendor == "nvidia"
        and sharing_mode(d, override) == "mps"
        and _PLAIN_NAME.fullmatch(d.uuid)
    )
