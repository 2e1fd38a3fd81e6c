"""The gang-coordinator service's imperative shell (see the package docstring for its role)."""

from __future__ import annotations

import logging

from shared.runtime import Runtime

log = logging.getLogger(__name__)


async def main(rt: Runtime) -> None:
    """Start the service's tasks on ``rt``; the runtime supervises them.

    Until the pipeline is wired, the service connects to the bus and answers pings only.
    """
    log.info("gang-coordinator ready (no handlers wired yet)")
