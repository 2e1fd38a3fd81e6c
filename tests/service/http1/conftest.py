"""shared/http1.py's tests run on asyncio's loop and on uvloop, the services' loop
(shared/runtime.py run_process): the two differ in how a closed transport fails. A
folder of its own, so the other tests keep the one default loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
