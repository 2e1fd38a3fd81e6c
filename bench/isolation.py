"""Isolation on a real GPU: what each sharing mode gives processes that share one card.

    python bench/isolation.py [--gpu 0] [--seconds 15] [--modes hami-core,mps,mps-only]
        [--shares 70/30,50/30/20] [--memory-mib 10240] [--library /usr/local/vgpu/libvgpu.so]

Needs an NVIDIA GPU, PyTorch with CUDA, and for ``hami-core`` and ``mps`` the isolation
library (``--library``; a mode whose library is missing is skipped). Not part of the test
suite; docs/isolation.md gives the figures measured with it and how to choose a mode.

Each worker process gets exactly what the node agent's ``Allocate`` would hand its
container (services/node_agent/isolation.py ``handout``, for a ``ContainerGrant`` of
``--memory-mib`` and its share of the cores on the local card as
services/node_agent/nvml.py ``NvmlSource`` reads it, the node's ``operatingMode``
set to the mode): the environment, with container paths mapped to the host paths of the
handout's mounts, and ``LD_PRELOAD`` of the libraries its ``/etc/ld.so.preload`` mount
names. ``NVIDIA_VISIBLE_DEVICES`` becomes ``CUDA_VISIBLE_DEVICES`` (no container runtime
here). For the MPS modes the card's MPS control daemon is started, and stopped at the
end, by the node's own supervisor (services/node_agent/mps/supervisor.py ``Supervisor``),
its directories under ``--workdir``; the workers run on this host, so the daemon keeps
the host's ``/dev/shm`` (``privateShm: false``), as they do.

Modes: ``hami-core`` (the isolation library's core and memory limits), ``mps`` (MPS
active-thread percentage and pinned memory limit, plus the library for memory: the
default ``nodeAgent.mps.hamiCore: true``), ``mps-only`` (``hamiCore: false``).

Per mode and share set (e.g. 70/30) the workers start together (a file barrier) and run
for ``--seconds``: a bf16 8192³ GEMM loop (compute-bound, TFLOP/s) and an elementwise add
loop (memory-bound, GB/s). Printed: each process's rate, its part of the set's sum against
the cores it asked, and the sum against one process alone on the card with nothing
handed (``plain``); one process alone at the smallest share (does the limit burst on an
idle card?); tiny-kernel launches per second under the mode against ``plain``; and the
memory limit a process sees (``torch.cuda.mem_get_info`` total) and whether an
allocation past it fails. Markdown tables on stdout; the workers' logs in ``--workdir``.
Nothing is written to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODE = "bench-node"
GEMM_N = 8192
ADD_ELEMENTS = 1 << 28  # 512 MiB per bf16 tensor, three of them
MIB = 1 << 20


# --- the workers (run in their own processes; torch is imported only here) -------------


def _barrier(directory: Path, name: str) -> None:
    """Say this worker is ready, then wait for the ``go`` file."""
    (directory / f"ready-{name}").touch()
    while not (directory / "go").exists():
        time.sleep(0.005)


def worker(kind: str, seconds: float, barrier: Path, name: str, limit_mib: int) -> dict[str, Any]:
    import torch

    device = torch.device("cuda")
    if kind == "memory":
        free, total = torch.cuda.mem_get_info()
        past = within = True
        try:
            x = torch.empty((limit_mib + 1024) * MIB, dtype=torch.uint8, device=device)
            del x
        except RuntimeError:
            past = False
        torch.cuda.empty_cache()
        try:
            x = torch.empty(limit_mib // 2 * MIB, dtype=torch.uint8, device=device)
            del x
        except RuntimeError:
            within = False
        return {"total_mib": total // MIB, "free_mib": free // MIB, "past": past, "within": within}
    if kind == "gemm":
        a = torch.randn(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
        b = torch.randn(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
        out = torch.empty_like(a)
        batch, work = 4, 2.0 * GEMM_N**3

        def step() -> None:
            torch.mm(a, b, out=out)

    elif kind == "add":
        a = torch.randn(ADD_ELEMENTS, device=device, dtype=torch.bfloat16)
        b = torch.randn(ADD_ELEMENTS, device=device, dtype=torch.bfloat16)
        out = torch.empty_like(a)
        batch, work = 8, 3.0 * ADD_ELEMENTS * 2  # bytes read and written

        def step() -> None:
            torch.add(a, b, out=out)

    elif kind == "launch":
        x = torch.zeros(1, device=device)
        batch, work = 1000, 1.0

        def step() -> None:
            x.add_(1)

    else:
        raise SystemExit(f"unknown worker kind {kind}")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    _barrier(barrier, name)
    done = 0
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            step()
        torch.cuda.synchronize()
        done += batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return {"rate": done * work / elapsed, "elapsed": elapsed}


# --- the handout, as the node agent gives it ---------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    workdir: Path
    card: Any
    """The local card's DeviceInfo (NvmlSource)."""
    devices: dict[Any, Any]
    """Every card of this machine by UUID, as the node agent reads them."""
    runs: int = 0

    def config(self, mode: str) -> Any:
        from shared.config import parse

        iso = {
            "libraryHostPath": self.args.library,
            "preloadHostPath": str(self.workdir / "ld.so.preload"),
            "cacheHostDir": str(self.workdir / "containers"),
        }
        mps = {
            "controlCommand": self.args.mps_control,
            "hostDir": str(self.workdir / "mps"),
            "privateShm": False,
            "hamiCore": mode != "mps-only",
        }
        return parse(
            {
                "nodeConfigs": [{"name": NODE, "operatingMode": mode.removesuffix("-only")}],
                "nodeAgent": {"isolation": iso, "mps": mps},
            }
        )

    def env(self, mode: str | None, cores: int, name: str) -> dict[str, str]:
        """The worker's environment: the handout's for ``cores`` percent and
        ``--memory-mib`` of the card, or nothing handed (``mode`` None)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD")
            and not k.startswith("CUDA_MPS_")
        }
        env["CUDA_VISIBLE_DEVICES"] = self.card.uuid
        if mode is None:
            return env
        from services.node_agent.isolation import handout
        from shared.core.model import ContainerGrant, DeviceGrant, NodeName, PodRef, PodUID

        cfg = self.config(mode)
        card = self.card
        self.runs += 1
        pod = PodRef(namespace="bench", name=name, uid=PodUID(f"bench-{self.runs}-{name}"))
        grant = ContainerGrant(
            container="main",
            devices=(
                DeviceGrant(
                    uuid=card.uuid,
                    index=card.index,
                    model=card.model,
                    memory_mib=self.args.memory_mib,
                    cores=cores,
                ),
            ),
        )
        out = handout(cfg, NodeName(NODE), pod, grant, self.devices)
        mounts = sorted(out.mounts, key=lambda m: len(m.container_path), reverse=True)

        def host(value: str) -> str:
            for m in mounts:
                if value == m.container_path or value.startswith(m.container_path + "/"):
                    return m.host_path + value[len(m.container_path) :]
            return value

        for m in out.mounts:
            if not m.read_only:  # the accounting, lock and pipe directories
                Path(m.host_path).mkdir(parents=True, exist_ok=True)
        for key, value in out.envs.items():
            if key == "NVIDIA_VISIBLE_DEVICES":
                env["CUDA_VISIBLE_DEVICES"] = value
            else:
                env[key] = host(value)
        preload = next((m for m in out.mounts if m.container_path == "/etc/ld.so.preload"), None)
        if preload is not None:
            libraries = Path(preload.host_path).read_text().split()
            env["LD_PRELOAD"] = ":".join(host(lib) for lib in libraries)
        return env

    async def run(
        self, kind: str, workers: Sequence[tuple[str, dict[str, str]]]
    ) -> list[dict[str, Any]]:
        """Start ``workers`` (name, environment) together; their results in order."""
        barrier = Path(tempfile.mkdtemp(dir=self.workdir, prefix=f"{kind}-"))
        procs = []
        for name, env in workers:
            log = (barrier / f"{name}.log").open("wb")
            command = [sys.executable, __file__, "--worker", kind, "--name", name]
            command += ["--seconds", str(self.args.seconds), "--barrier", str(barrier)]
            command += ["--memory-mib", str(self.args.memory_mib)]
            procs.append(
                await asyncio.create_subprocess_exec(
                    *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=log
                )
            )
            log.close()
        deadline = time.monotonic() + 180
        while kind != "memory" and not all(
            (barrier / f"ready-{name}").exists() for name, _ in workers
        ):
            if time.monotonic() > deadline or any(p.returncode is not None for p in procs):
                break
            await asyncio.sleep(0.05)
        (barrier / "go").touch()
        results = []
        for (name, _), proc in zip(workers, procs, strict=True):
            out, _ = await proc.communicate()
            lines = out.decode().strip().splitlines()
            if proc.returncode != 0 or not lines:
                print(f"worker {name} ({kind}) failed: see {barrier}/{name}.log", file=sys.stderr)
                results.append({})
                continue
            results.append(json.loads(lines[-1]))
        return results


# --- the report --------------------------------------------------------------------------


def _shares(text: str) -> list[list[int]]:
    return [[int(s) for s in group.split("/")] for group in text.split(",") if group]


def _fmt(rate: float | None, kind: str) -> str:
    if rate is None:
        return "failed"
    return f"{rate / 1e12:.1f} TFLOP/s" if kind == "gemm" else f"{rate / 1e9:.0f} GB/s"


@dataclass
class OneCard:
    """The devices the MPS supervisor sees: the bench's card alone, or none."""

    card: Any

    def read(self) -> tuple[Any, ...]:
        return () if self.card is None else (self.card,)

    def usage(self) -> dict[str, tuple[int, float]]:
        return {}

    def close(self) -> None:
        return None


def prepare(args: argparse.Namespace) -> tuple[Bench, list[str]] | None:
    """The local card (as the node agent reads it), the work directory with the preload
    file the node agent's ``prepare_host`` writes, and the modes that can run here."""
    from services.node_agent.nvml import NvmlSource
    from shared.config import Config

    source = NvmlSource(Config())
    try:
        cards = source.read()
    finally:
        source.close()
    card = next((c for c in cards if c.index == args.gpu), None)
    if card is None:
        print(f"no GPU with index {args.gpu} here", file=sys.stderr)
        return None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tessera-isolation-"))
    workdir.mkdir(parents=True, exist_ok=True)
    b = Bench(args, workdir, card, {c.uuid: c for c in cards})
    lib_in_container = b.config("hami-core").node_agent.isolation.library_container_path
    (workdir / "ld.so.preload").write_text(lib_in_container + "\n")
    modes = [m for m in args.modes.split(",") if m]
    if not Path(args.library).exists():
        skipped = [m for m in modes if m != "mps-only"]
        if skipped:
            print(f"{args.library} is missing: skipping {', '.join(skipped)}", file=sys.stderr)
        modes = [m for m in modes if m == "mps-only"]
    return b, modes


async def bench(args: argparse.Namespace, b: Bench, modes: list[str]) -> int:
    from services.node_agent.mps.reader import MpsReader
    from services.node_agent.mps.supervisor import Supervisor
    from shared.core.model import NodeName

    card, workdir = b.card, b.workdir
    sets = _shares(args.shares)
    workloads = [w for w in args.workloads.split(",") if w]
    print(f"# Isolation on {card.model} ({card.uuid}), {args.seconds:.0f} s per run\n")
    plain = b.env(None, 100, "plain")
    alone = {w: (await b.run(w, [("plain", plain)]))[0].get("rate") for w in workloads}
    launches_plain = (await b.run("launch", [("plain", plain)]))[0].get("rate")
    daemon = None
    rows: list[str] = []
    extra: list[str] = []
    try:
        for mode in modes:
            if mode.startswith("mps") and daemon is None:
                daemon = Supervisor(b.config(mode), NodeName(NODE), OneCard(card))
                await daemon.check()
                reader = MpsReader(b.config(mode).node_agent.mps, NODE, [card.uuid])
                await reader.check()
                if reader.state().states.get(card.uuid) != "running":
                    print("the MPS daemon does not run: skipping the MPS modes", file=sys.stderr)
                    modes = [m for m in modes if not m.startswith("mps")]
                    continue
            for w in workloads:
                base = alone[w]
                for shares in sets:
                    names = [f"p{i}-{s}" for i, s in enumerate(shares)]
                    envs = [(n, b.env(mode, s, n)) for n, s in zip(names, shares, strict=True)]
                    got = [r.get("rate") for r in await b.run(w, envs)]
                    total = sum(r or 0.0 for r in got)
                    whole = f"{100 * total / base:.0f} %" if base else "-"
                    for i, (asked, rate) in enumerate(zip(shares, got, strict=True)):
                        part = f"{100 * (rate or 0) / total:.1f} %" if total else "-"
                        rows.append(
                            f"| {mode} | {w} | {'/'.join(map(str, shares))} | {asked} % | "
                            f"{_fmt(rate, w)} | {part} | {whole if i == 0 else ''} |"
                        )
                smallest = min(s for group in sets for s in group)
                (one,) = await b.run(w, [("alone", b.env(mode, smallest, "alone"))])
                rate = one.get("rate")
                extra.append(
                    f"| {mode} | {w} | alone at {smallest} % | {_fmt(rate, w)} | "
                    + (f"{100 * rate / base:.0f} % of plain |" if rate and base else "- |")
                )
            (launch,) = await b.run("launch", [("p", b.env(mode, sets[0][0], "launch"))])
            rate = launch.get("rate")
            against = (
                f"{100 * rate / launches_plain:.0f} % of plain" if rate and launches_plain else "-"
            )
            measured = f"{rate / 1e3:.0f}k launches/s" if rate else "failed"
            extra.append(
                f"| {mode} | launch | one process at {sets[0][0]} % | {measured} | {against} |"
            )
            (mem,) = await b.run("memory", [("m", b.env(mode, sets[0][0], "memory"))])
            if mem:
                past = "allocated (not enforced)" if mem["past"] else "refused"
                within = "allocated" if mem["within"] else "refused"
                extra.append(
                    f"| {mode} | memory | limit {args.memory_mib} MiB | total seen "
                    f"{mem['total_mib']} MiB | past the limit: {past}; half of it: {within} |"
                )
    finally:
        if daemon is not None:  # the card leaves mps mode: its idle daemon quits
            daemon.source = OneCard(None)
            await daemon.check()
    plain_row = " ".join(f"{w}: {_fmt(alone[w], w)}." for w in workloads)
    print(f"One process alone, nothing handed (plain): {plain_row}")
    if launches_plain:
        print(f"Launches alone, plain: {launches_plain / 1e3:.0f}k/s.\n")
    print("| mode | workload | shares | asked | rate | part of the sum | sum vs plain |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| mode | what | how | measured | against |")
    print("|---|---|---|---|---|")
    print("\n".join(extra))
    print(f"\nWorkers' logs: {workdir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="the card's NVML index")
    parser.add_argument("--seconds", type=float, default=15.0, help="each run's length")
    parser.add_argument("--modes", default="hami-core,mps,mps-only")
    parser.add_argument("--shares", default="70/30,50/30/20", help="core shares per set")
    parser.add_argument("--workloads", default="gemm,add")
    parser.add_argument("--memory-mib", type=int, default=10240, help="each worker's memory")
    parser.add_argument("--library", default="/usr/local/vgpu/libvgpu.so")
    parser.add_argument("--mps-control", default="nvidia-cuda-mps-control")
    parser.add_argument("--workdir", help="pipes, accounting files and logs (default: a temp dir)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="w", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(args.worker, args.seconds, Path(args.barrier), args.name, args.memory_mib)
        print(json.dumps(result))
        return 0
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidiactl").exists():
        print("no NVIDIA driver here: this benchmark needs a GPU", file=sys.stderr)
        return 1
    prepared = prepare(args)
    if prepared is None:
        return 1
    return asyncio.run(bench(args, *prepared))


if __name__ == "__main__":
    sys.exit(main())
