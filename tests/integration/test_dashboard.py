"""The dashboard in a real headless Chromium, driven by Playwright.

`tessera dashboard` runs as a process, as the ``reader`` bus user, beside the real
pipeline (kube-apiserver, nats-server, the five services): pods asking for GPU and NPU
slices are bound, and the page must draw each one's grant in its device's bars, show an
event published after it opened, and fetch nothing from anywhere but itself. A second
test plays the views with a hostile pod name on a bus of its own: the page shows the
text as text. The screenshot (docs/img/dashboard.png with TESSERA_UPDATE_SCREENSHOT=1)
is checked to be a real picture.

The browser is the system's chromium (Debian: ``apt-get install -y chromium``), never
one Playwright downloads. Without it the tests skip, except in CI (``CI`` set), where
they fail.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import struct
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import yaml
from nats.aio.msg import Msg
from playwright.async_api import Page, async_playwright, expect

from shared import busauth
from shared import events as ev
from shared.bus import connect
from shared.config import NatsConfig
from shared.core.model import PodRef, PodUID
from shared.views import (
    VIEW_LEDGER_SUBJECT,
    VIEW_QUEUES_SUBJECT,
    DeviceView,
    GangView,
    GrantView,
    LedgerView,
    NodeView,
    QueuesView,
    QueueView,
)
from tests.helpers import eventually, readyz
from tests.integration.pipeline import REPO, Pipeline, pod, start_pipeline
from tools.localcluster import LocalCluster, free_port, service_settings

pytestmark = pytest.mark.integration

INVENTORY = {
    "nodes": [
        {
            "name": "dash-a100",
            "devices": [
                {
                    "vendor": "nvidia",
                    "model": "NVIDIA-A100-SXM4-80GB",
                    "memory": 81920,
                    "count": 2,
                }
            ],
        },
        {
            "name": "dash-910b",
            "devices": [
                {
                    "vendor": "ascend",
                    "model": "Ascend910B3",
                    "chip": "910B3",
                    "memory": 65536,
                    "count": 2,
                }
            ],
        },
    ]
}
PODS = {
    "train-llama": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000, "nvidia.com/gpucores": 40},
    "infer-bert": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 12000, "nvidia.com/gpucores": 25},
    "notebook": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 6000},
    "npu-infer": {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 12000},
}
TIMEOUT_MS = 30_000
SCREENSHOT_ENV = "TESSERA_UPDATE_SCREENSHOT"


def chromium() -> str:
    """The system's chromium; skip without it, but fail in CI (which installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: CI must install it (apt-get install -y chromium)")
    pytest.skip("no chromium here (apt-get install -y chromium); in CI this test fails instead")


@pytest.fixture(scope="module", autouse=True)
def system_chromium() -> str:
    """Looked for before the module's servers start (skipping costs nothing)."""
    return chromium()


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(
        tmp_path_factory.mktemp("dashboard"), kubeconfig, nats_admin, INVENTORY
    )
    yield p
    await p.close()


def last_lines(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


@dataclass
class Served:
    """A running `tessera dashboard`."""

    url: str
    proc: asyncio.subprocess.Process
    log: Path

    async def stop(self) -> None:
        """SIGTERM: it must end its open event streams and exit 0 within seconds."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            code = await self.proc.wait()
        assert code == 0, last_lines(self.log)


@asynccontextmanager
async def dashboard(config: Path, log: Path) -> AsyncIterator[Served]:
    """`tessera dashboard` as a process on a free port, once ready (connected to NATS);
    stopped on leaving."""
    port = free_port()
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tools.cli", "dashboard", "--config", str(config)),
            *("--host", "127.0.0.1", "--port", str(port)),
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    served = Served(f"http://127.0.0.1:{port}", proc, log)
    try:

        async def ready() -> str | None:
            if proc.returncode is not None:
                raise AssertionError(f"the dashboard exited: {last_lines(log)}")
            return await readyz(port)

        await eventually(ready, timeout_s=30, what="the dashboard ready")
        yield served
        await served.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@asynccontextmanager
async def browser(origin: str) -> AsyncIterator[Page]:
    """A headless page of the system chromium that fails the test on a script error, a
    blocked resource (the page's policy) or a request leaving ``origin``."""
    executable = chromium()
    problems: list[str] = []
    async with async_playwright() as pw:
        # Playwright passes --no-sandbox itself (chromium_sandbox defaults to False).
        engine = await pw.chromium.launch(executable_path=executable, headless=True)
        try:
            context = await engine.new_context(viewport={"width": 1440, "height": 900})
            page = await context.new_page()
            page.on("pageerror", lambda exc: problems.append(f"script error: {exc}"))
            page.on(
                "console",
                lambda msg: (
                    problems.append(f"console: {msg.text}")
                    if "Content Security Policy" in msg.text
                    else None
                ),
            )
            page.on(
                "request",
                lambda req: (
                    None
                    if req.url.startswith((origin, "data:"))
                    else problems.append(f"request outside the dashboard: {req.url}")
                ),
            )
            yield page
            assert not problems, problems
        finally:
            await engine.close()


async def check_picture(page: Page, png: bytes) -> None:
    """A real screenshot: a PNG of the page's size, many colours, no one colour filling
    it (a blank or half-drawn page fails). Decoded by the browser itself."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 1400, width
    assert height >= 600, height
    assert len(png) > 40_000, len(png)
    blank = await page.context.new_page()
    try:
        stats: dict[str, float] = await blank.evaluate(
            """async (url) => {
                const img = new Image();
                img.src = url;
                await img.decode();
                const canvas = document.createElement("canvas");
                canvas.width = img.width;
                canvas.height = img.height;
                const ctx = canvas.getContext("2d");
                ctx.drawImage(img, 0, 0);
                const px = ctx.getImageData(0, 0, img.width, img.height).data;
                const counts = new Map();
                for (let i = 0; i < px.length; i += 4) {
                    const key = (px[i] << 16) | (px[i + 1] << 8) | px[i + 2];
                    counts.set(key, (counts.get(key) || 0) + 1);
                }
                let top = 0;
                for (const n of counts.values()) top = Math.max(top, n);
                return {colours: counts.size, top: top / (px.length / 4)};
            }""",
            "data:image/png;base64," + base64.b64encode(png).decode(),
        )
    finally:
        await blank.close()
    assert stats["colours"] >= 64, stats
    assert stats["top"] < 0.9, stats


def screenshot_path(tmp_path: Path) -> Path:
    if os.environ.get(SCREENSHOT_ENV) == "1":
        return REPO / "docs/img/dashboard.png"
    return tmp_path / "dashboard.png"


async def test_the_page_draws_every_grant_and_the_live_events(
    pipeline: Pipeline, ns: str, tmp_path: Path
) -> None:
    async with dashboard(pipeline.config, pipeline.workdir / "dashboard.log") as served:
        # Placed while no page is open: the dashboard keeps their events for the next one.
        for name, limits in PODS.items():
            await pipeline.create(ns, pod(name, limits))
        too_big = pod("too-big", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 200000})
        await pipeline.create(ns, too_big)
        for name in PODS:
            await pipeline.bound(ns, name)
        async with browser(served.url) as page:
            await page.goto(served.url)
            await expect(page).to_have_title("Tessera")
            await grants_drawn(page, ns)
            await queues_drawn(page, ns)
            await events_followed(page, pipeline, ns)
            await asyncio.sleep(2.5)  # one more refresh, then the picture
            png = await page.screenshot(full_page=True)
            await check_picture(page, png)
            path = screenshot_path(tmp_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)
            await served.stop()  # with the page's event stream open
            status = page.locator("#events-status")
            await expect(status).to_have_text("reconnecting…", timeout=TIMEOUT_MS)


async def grants_drawn(page: Page, ns: str) -> None:
    """Each pod's grant, by its name, in its device's bars and list, as bound."""
    for name in PODS:
        grant = page.locator(f'.grant[data-pod="{ns}/{name}"]')
        await expect(grant).to_contain_text(f"{ns}/{name} main", timeout=TIMEOUT_MS)
        await expect(grant.locator(".state")).to_have_text("bound")
        segment = page.locator(f'.seg.bound[data-pod="{ns}/{name}"]').first
        await expect(segment).to_have_attribute("title", re.compile(rf"^{ns}/{name} main · "))
    train = page.locator(f'.node[data-node="dash-a100"] .grant[data-pod="{ns}/train-llama"]')
    await expect(train).to_contain_text("30,000 MiB (37%) · 40 cores")
    npu = page.locator(f'.node[data-node="dash-910b"] .grant[data-pod="{ns}/npu-infer"]')
    await expect(npu).to_be_visible()
    card = page.locator(".device", has=page.locator(f'.grant[data-pod="{ns}/train-llama"]'))
    memory = card.locator(".meter", has_text="memory")
    await expect(memory.locator(".meter-value")).to_contain_text("/ 81,920 MiB")


async def queues_drawn(page: Page, ns: str) -> None:
    """The default queue's bars, and the pod that can never fit waiting with why."""
    queue = page.locator('.queue[data-queue="default"]')
    await expect(queue.locator(".meter", has_text="nvidia.count")).to_be_visible(timeout=TIMEOUT_MS)
    waiting = page.locator(f'.gangs tr[data-gang="{ns}/too-big"]')
    await expect(waiting).to_contain_text("larger than any nvidia card", timeout=TIMEOUT_MS)
    await expect(waiting.locator(".badge")).to_have_text("unresolvable")


async def events_followed(page: Page, pipeline: Pipeline, ns: str) -> None:
    """The tail: the events from before the page opened, then one live."""
    await expect(page.locator("#events-status")).to_have_text("live", timeout=TIMEOUT_MS)
    for name in PODS:
        bound = page.locator('.event[data-type="allocation.bound"]', has_text=f"{ns}/{name} ")
        await expect(bound).to_have_count(1)
    refused = page.locator('.event[data-type="allocation.failed"]', has_text=f"{ns}/too-big")
    await expect(refused.first).to_be_visible()

    # Live: a pod created now shows up in the tail and in the bars without a reload.
    await pipeline.create(ns, pod("late-arrival", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}))
    late = page.locator('.event[data-type="allocation.bound"]', has_text=f"{ns}/late-arrival")
    await expect(late).to_be_visible(timeout=TIMEOUT_MS)
    await expect(late).to_contain_text("main: #")
    grant = page.locator(f'.grant[data-pod="{ns}/late-arrival"]')
    await expect(grant).to_contain_text("4,096 MiB", timeout=TIMEOUT_MS)


# --- a hostile name, on a bus of its own ----------------------------------------------------

HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"


@pytest.fixture(scope="module")
def own_bus() -> Iterator[LocalCluster]:
    """A nats-server of its own: the views are played here, and no real allocator may
    answer them too."""
    with LocalCluster(with_kube=False, with_nats=True) as bus:
        yield bus


@asynccontextmanager
async def played_views(cfg: NatsConfig) -> AsyncIterator[None]:
    ledger = LedgerView(
        nodes=(
            NodeView(
                name="gpu-0",
                devices=(
                    DeviceView(
                        uuid="GPU-0",
                        index=0,
                        vendor="nvidia",
                        model="A100",
                        mode="hami-core",
                        memory_mib=40960,
                        cores=100,
                        slots=4,
                        used_memory_mib=4096,
                        used_slots=1,
                        grants=(
                            GrantView(
                                namespace="evil",
                                pod=HOSTILE,
                                uid="u1",
                                container="<b>c</b>",
                                memory_mib=4096,
                            ),
                        ),
                    ),
                ),
            ),
        )
    )
    queues = QueuesView(
        queues=(QueueView(name="<i>q</i>", deserved={"nvidia.count": 1.0}),),
        gangs=(GangView(namespace="evil", name="g", why=f"refused: {HOSTILE}"),),
    )
    nc = await connect(cfg, busauth.ADMIN)

    async def answer(msg: Msg) -> None:
        view = ledger if msg.subject == VIEW_LEDGER_SUBJECT else queues
        await msg.respond(msgspec.json.encode(view))

    await nc.subscribe(VIEW_LEDGER_SUBJECT, cb=answer)
    await nc.subscribe(VIEW_QUEUES_SUBJECT, cb=answer)
    await nc.flush()
    try:
        yield
    finally:
        await nc.close()


async def test_hostile_names_are_drawn_as_text(own_bus: LocalCluster, tmp_path: Path) -> None:
    config = tmp_path / "tessera.yaml"
    config.write_text(yaml.safe_dump({"nats": service_settings(own_bus.nats_config())}))
    admin = own_bus.nats_config()
    async with (
        played_views(admin),
        dashboard(config, tmp_path / "dashboard.log") as served,
        browser(served.url) as page,
    ):
        await page.goto(served.url)
        name = page.locator(".grant.reserved .grant-name")
        await expect(name).to_have_text(f"evil/{HOSTILE} <b>c</b>", timeout=TIMEOUT_MS)
        await expect(page.locator(".gangs .why")).to_contain_text(HOSTILE)
        await expect(page.locator(".queue h3")).to_contain_text("<i>q</i>")
        await expect(page.locator("#events-status")).to_have_text("live", timeout=TIMEOUT_MS)
        nc = await connect(admin, busauth.ADMIN)  # an event carrying markup, as text
        try:
            failed = ev.AllocationFailed(
                pods=(PodRef(namespace="evil", name=HOSTILE, uid=PodUID("u1")),),
                message="<script>document.title='pwned'</script>",
            )
            await nc.publish(failed.subject(), ev.encode(failed))
        finally:
            await nc.close()
        event = page.locator('.event[data-type="allocation.failed"]')
        await expect(event).to_contain_text("<script>document.title='pwned'</script>")
        await expect(event).to_contain_text(f"evil/{HOSTILE}")
        for markup in ("img", "b", "i", "#events script", ".panel script"):
            assert await page.locator(markup).count() == 0, markup
        await expect(page).to_have_title("Tessera")
