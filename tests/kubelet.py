"""A kubelet's side of the device-plugin API, played by tests: its ``Registration``
service on ``kubelet.sock``, and the calls its device manager makes to a plugin."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from services.node_agent.deviceplugin import api_pb2 as pb


@dataclass
class Kubelet:
    """The kubelet's side: its Registration service, and a client of the plugin."""

    directory: Path
    registered: asyncio.Queue[pb.RegisterRequest] = field(default_factory=asyncio.Queue)
    server: grpc.aio.Server | None = None

    async def start(self) -> None:
        async def register(request: pb.RegisterRequest, _ctx: object) -> pb.Empty:
            await self.registered.put(request)
            return pb.Empty()

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "v1beta1.Registration",
                    {
                        "Register": grpc.unary_unary_rpc_method_handler(
                            register,
                            request_deserializer=pb.RegisterRequest.FromString,
                            response_serializer=pb.Empty.SerializeToString,
                        )
                    },
                ),
            )
        )
        server.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        await server.start()
        self.server = server

    async def restart(self) -> None:
        """As the kubelet does on start: wipe the directory, serve a fresh socket."""
        assert self.server is not None
        await self.server.stop(grace=0)
        wipe(self.directory)
        await self.start()

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix://{self.directory / endpoint}")


def call(channel: grpc.aio.Channel, method: str, response: Any) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        f"/v1beta1.DevicePlugin/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )


async def allocate(channel: grpc.aio.Channel, *counts: int) -> pb.AllocateResponse:
    request = pb.AllocateRequest(
        container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[f"id-{i}" for i in range(n)]) for n in counts
        ]
    )
    result: pb.AllocateResponse = await call(channel, "Allocate", pb.AllocateResponse)(request)
    return result


def wipe(directory: Path) -> None:
    for p in directory.iterdir():
        p.unlink()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """The kubelet's device-plugin directory (short: a socket path has 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="tessera-kl-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[Kubelet]:
    k = Kubelet(plugin_dir)
    await k.start()
    yield k
    assert k.server is not None
    await k.server.stop(grace=0)
