"""``tessera``: one command for every service and the developer tools.

tessera <service> [--config FILE]     run watcher | gang-coordinator | device-allocator
                                      | binder | job-controller | node-agent | webhook
                                      | dashboard
tessera node-agent mps-control        a node's MPS daemons, one per card in mps mode
tessera schema [--out F] [--check]    write (or check) the events' JSON Schema
tessera config [--file F] [--hash]    validate a config and print the effective one
tessera secrets [--namespace NS]      fresh Secrets for a cluster (grant key, bus users, TLS)
tessera nats-conf [--out F] [--check] write (or check) the manifests' nats.conf
tessera dev build|up|down|status      the local control plane + NATS on loopback
          [--nats-cluster 3]          (a 3-server JetStream cluster, as deployed)
tessera ping [--nats URL] [--user U]  list the services alive on the bus
tessera get nodes|devices|queues      the allocator's ledger, the coordinator's queues
          [-o wide|json|yaml]         (live views over NATS; docs/cli.md)
tessera get jobs [-n NS | -A]         Volcano Jobs and PodGroups with their status
tessera explain pod NS/NAME           why a pod waits: every node's reasons and fixes
tessera top [--interval S] [--once]   devices, queues and totals, redrawn live
tessera demo [--keep]                 start everything locally and show it alive
tessera inventory [--source nvml]     print the devices this node's agent would report

Installed as ``kubectl-tessera`` too: ``kubectl tessera get devices`` runs the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import runpy
import secrets
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import yaml

if TYPE_CHECKING:
    from shared.config import NatsConfig

SERVICES = {
    "watcher": "services.watcher",
    "gang-coordinator": "services.gang_coordinator",
    "device-allocator": "services.device_allocator",
    "binder": "services.binder",
    "job-controller": "services.job_controller",
    "node-agent": "services.node_agent",
}
WEBHOOK = "services.webhook"
"""The admission webhook: not on the bus, so not among SERVICES (nothing pings it)."""
DASHBOARD = "services.dashboard"
"""The web dashboard: reads views and allocation events as ``reader`` (not pinged)."""
DEFAULT_SCHEMA = Path("docs/events.schema.json")
DEFAULT_NATS_CONF = Path("deploy/kustomize/base/nats.conf")
DEV_DIR = Path(".tessera-dev")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _schema_text() -> str:
    from shared.events import json_schema

    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def write_or_check(out: Path, text: str, command: str, check: bool) -> int:
    """Write a generated file, or (``check``) say whether it is current: exit 1 when
    stale, naming the ``tessera`` command that makes it."""
    if check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run `tessera {command} --out {out}`", file=sys.stderr)
            return 1
        print(f"{out} is up to date")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    return write_or_check(Path(args.out), _schema_text(), "schema", args.check)


def cmd_config(args: argparse.Namespace) -> int:
    from shared import config

    try:
        cfg = config.load(args.file)
    except config.ConfigError as exc:
        print(f"tessera config: {exc}", file=sys.stderr)
        return 2
    if args.hash:
        print(config.config_hash(cfg))
    else:
        print(config.dump(cfg), end="")
    return 0


def cmd_inventory(args: argparse.Namespace) -> int:
    """Read this node's devices once, as the node agent does, and print them as JSON."""
    from services.node_agent.service import open_source
    from shared import config
    from shared.core.model import NodeName

    cfg = config.load(args.config)
    source = open_source(cfg, args.source, NodeName(args.node))
    try:
        devices = source.read()
    finally:
        source.close()
    print(msgspec.json.format(msgspec.json.encode(devices), indent=2).decode())
    return 0


def dev_config(path: Path, nats: dict[str, Any], kubeconfig: str, **sections: Any) -> Path:
    """A tessera.yaml pointing every service at the local cluster (``nats``: its
    ``LocalCluster.nats_settings()``), with a fresh grant-signing key beside it (as a
    cluster's Secret holds one); ``sections`` are more top-level keys (``scheduler=...``)."""
    key = path.with_name("grant.key")
    if not key.exists():
        key.write_text(secrets.token_hex(32))
    config: dict[str, Any] = {
        "nats": nats,
        "kubernetes": {"kubeconfig": kubeconfig},
        "security": {"grantKeyFile": str(key)},
    }
    for name, section in sections.items():
        config[name] = {**config.get(name, {}), **section}
    path.write_text(yaml.safe_dump(config))
    return path


def cmd_dev(args: argparse.Namespace) -> int:
    from tools import localcluster, realnode

    workdir = Path(args.dir).resolve()
    if args.action == "build":
        print(localcluster.ensure_binaries())
        if realnode.unavailable() is None:  # containerd for a real node, where one can run
            print(realnode.ensure_runtime())
        return 0
    if args.action == "down":
        stopped = localcluster.stop_detached(workdir)
        print("stopped" if stopped else f"nothing running under {workdir}")
        return 0
    if args.action == "status":
        state_file = workdir / "state.json"
        if not state_file.exists():
            print(f"nothing running under {workdir}")
            return 1
        print(state_file.read_text(), end="")
        return 0
    # up
    if (workdir / "state.json").exists():
        print(
            f"already up (see {workdir / 'state.json'}); `tessera dev down` first", file=sys.stderr
        )
        return 1
    cluster = localcluster.LocalCluster(
        workdir=workdir,
        detach=True,
        with_scheduler=args.scheduler,
        nats_servers=args.nats_cluster,
        real_node=args.real_node,
    )
    cluster.start()
    state = json.loads((workdir / "state.json").read_text())
    cfg = dev_config(workdir / "tessera.yaml", state["nats"], state["kubeconfig"])
    print(f"kube-apiserver {cluster.server}  (kubeconfig {cluster.kubeconfig})")
    print(f"nats-server    {cluster.nats_url}")
    print(f"config         {cfg}")
    if args.real_node:
        print(
            f"real node     {cluster.node_name} (kubelet, containerd, runc; pods use image "
            f"{realnode.BUSYBOX_IMAGE}; its device plugins in {realnode.DEVICE_PLUGIN_DIR})"
        )
    print(f"try: kubectl --kubeconfig {cluster.kubeconfig} get ns")
    return 0


def spawn_services(
    workdir: Path,
    cfg: Path,
    inventory: Path,
    *,
    new_session: bool = False,
    only: Collection[str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start the services (``only`` these, else all) as processes, the node agent
    simulating ``inventory``, each logging to ``workdir/<service>.log``."""
    procs = []
    for service, module in SERVICES.items():
        if only is not None and service not in only:
            continue
        # Several services on one host: none takes telemetry.metricsPort (their health
        # is not probed here).
        extra = ["--http-port=0"]
        extra += ["--simulate", str(inventory)] if service == "node-agent" else []
        log = (workdir / f"{service}.log").open("ab")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", module, "--config", str(cfg), *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=new_session,
            )
        )
    return procs


async def _ping(cfg: NatsConfig, wait_s: float) -> list[dict[str, object]]:
    """Every service's hello, asking as ``cfg``'s user (``admin`` unless set)."""
    import nats

    from shared.events import CONTROL_PING_SUBJECT
    from tools.ops import bus

    found: list[dict[str, object]] = []
    async with bus(cfg) as nc:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(CONTROL_PING_SUBJECT, b"", reply=inbox)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            if msg.data:  # an empty message is the server's "no responders" notice
                found.append(msgspec.json.decode(msg.data))
    return found


def cmd_secrets(args: argparse.Namespace) -> int:
    from tools.deploy import secrets_yaml

    print(secrets_yaml(args.namespace), end="")
    return 0


def cmd_nats_conf(args: argparse.Namespace) -> int:
    from tools.deploy import nats_conf

    return write_or_check(Path(args.out), nats_conf(), "nats-conf", args.check)


def cmd_ping(args: argparse.Namespace) -> int:
    from tools import ops

    async def ping() -> int:
        hellos = await _ping(ops.nats_config(args), args.wait)
        for h in sorted(hellos, key=lambda h: str(h["service"])):
            print(f"{h['service']:<18} {h['instance']:<28} config {h['config_hash']}")
        return 0 if hellos else 1

    return ops.run(f"{args.prog} ping", ping())


def cmd_get(args: argparse.Namespace) -> int:
    from tools import ops

    return ops.cmd_get(args)


def cmd_explain(args: argparse.Namespace) -> int:
    from tools import ops

    return ops.cmd_explain(args)


def cmd_top(args: argparse.Namespace) -> int:
    from tools import ops

    return ops.cmd_top(args)


def _bus_options(p: argparse.ArgumentParser) -> None:
    """Where the bus is: a tessera.yaml's ``nats`` section, its URL and user overridden."""
    p.add_argument(
        "--config",
        default=None,
        help="tessera.yaml for its nats section (default: $TESSERA_CONFIG, else built-in)",
    )
    p.add_argument("--nats", default=None, help="the bus's URL (default: the config's)")
    p.add_argument(
        "--user", default=None, help="NATS user (default: nats.user, else admin; or reader)"
    )


def _kube_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="the API server's kubeconfig (default: $KUBECONFIG, then ~/.kube/config)",
    )
    p.add_argument("-n", "--namespace", default=None, help="default: the context's namespace")


def _grant_text(pod: dict[str, object]) -> str:
    from shared.core import annotations as ann

    meta = pod["metadata"]
    assert isinstance(meta, dict)
    grants = ann.read_grants(meta.get("annotations") or {}) or ()
    parts = []
    for c in grants:
        for d in c.devices:
            what = (
                d.mig_profile
                or d.vnpu_template
                or ("whole" if d.exclusive else f"{d.memory_mib} MiB {d.cores}%")
            )
            parts.append(f"{d.model}[{d.index}] {what}")
    return ", ".join(parts)


async def _demo_workloads(
    kubeconfig: Path, docs: list[dict[str, Any]]
) -> list[tuple[str, str, str]]:
    """Create the example pods, wait for each to be bound or told why not; the table rows."""
    from shared import kube
    from shared.config import KubernetesConfig

    api = await kube.connect(KubernetesConfig(kubeconfig=str(kubeconfig)))
    async with api:
        for doc in docs:
            await kube.request(api, "POST", "/api/v1/namespaces/default/pods", doc)
        rows: dict[str, tuple[str, str, str]] = {}
        deadline = time.monotonic() + 30
        while len(rows) < len(docs) and time.monotonic() < deadline:
            for doc in docs:
                name = doc["metadata"]["name"]
                if name in rows:
                    continue
                pod = await kube.request(api, "GET", f"/api/v1/namespaces/default/pods/{name}")
                node = pod["spec"].get("nodeName")
                if node:
                    rows[name] = (name, node, _grant_text(pod))
                    continue
                events = await kube.request(
                    api,
                    "GET",
                    "/api/v1/namespaces/default/events",
                    query={"fieldSelector": f"involvedObject.name={name}"},
                )
                told = [e["message"] for e in events["items"] if e["reason"] == "FailedScheduling"]
                if told:
                    rows[name] = (name, "(pending)", told[-1])
            await asyncio.sleep(0.3)
        return [
            rows.get(d["metadata"]["name"], (d["metadata"]["name"], "?", "no answer")) for d in docs
        ]


def _kubectl() -> str:
    from tools import localcluster

    return localcluster.kubectl()


REAL_NODE_POD = "real-node-vgpu"
REAL_NODE_SHOWS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")


def _demo_real_node(workdir: Path, cluster: Any, state: dict[str, Any]) -> subprocess.Popen[bytes]:
    """The real node's agent (two A100s read from a file: no GPU here), and one pod on
    the node whose container prints the limits it was handed; returns the agent."""
    from tools import realnode

    node = cluster.node_name
    vgpu = workdir / "vgpu"
    vgpu.mkdir(exist_ok=True)
    (vgpu / "libvgpu.so").touch()  # the DaemonSet's init container copies the real one
    isolation = {
        "libraryHostPath": str(vgpu / "libvgpu.so"),
        "preloadHostPath": str(vgpu / "ld.so.preload"),
        "cacheHostDir": str(vgpu / "containers"),
        "lockDir": str(vgpu / "lock"),
    }
    cfg = dev_config(
        workdir / "tessera-real-node.yaml",
        state["nats"],
        state["kubeconfig"],
        nodeAgent={"isolation": isolation},
    )
    devices = [{"model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}]
    source = workdir / f"{node}.yaml"
    source.write_text(yaml.safe_dump({"nodes": [{"name": node, "devices": devices}]}))
    # Only the demo's own pod goes there: the other examples name images this
    # machine does not have.
    taint = f"{realnode.NODE_LABEL}=true:NoSchedule"
    kubectl = [_kubectl(), "--kubeconfig", str(cluster.kubeconfig)]
    subprocess.run([*kubectl, "taint", "node", node, taint, "--overwrite"], check=True)
    log = (workdir / f"node-agent-{node}.log").open("ab")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            SERVICES["node-agent"],
            "--config",
            str(cfg),
            "--node",
            node,
            "--source",
            f"file:{source}",
            "--http-port=0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    show = " ".join(f"${name}" for name in REAL_NODE_SHOWS)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": REAL_NODE_POD, "namespace": "default"},
        "spec": {
            "schedulerName": "tessera",
            "restartPolicy": "Never",
            "nodeSelector": {realnode.NODE_LABEL: "true"},
            "tolerations": [{"key": realnode.NODE_LABEL, "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": realnode.BUSYBOX_IMAGE,
                    "command": ["sh", "-c", f"for v in {show}; do echo $v; done; sleep 3600"],
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "20000",
                            "nvidia.com/gpucores": "30",
                        }
                    },
                }
            ],
        },
    }
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(pod).encode(), check=True)
    deadline = time.monotonic() + 60
    printed = ""
    while time.monotonic() < deadline and len(printed.splitlines()) < len(REAL_NODE_SHOWS):
        time.sleep(0.5)
        printed = realnode.pod_logs("default", REAL_NODE_POD, "main")
    print(f"\nreal node {node} (kubelet, containerd, runc): pod {REAL_NODE_POD} printed:")
    for name, value in zip(REAL_NODE_SHOWS, printed.splitlines(), strict=False):
        print(f"  {name}={value}")
    if not printed:
        print(f"  nothing yet (see {workdir}/node-agent-{node}.log and {workdir}/kubelet.log)")
    return agent


def cmd_demo(args: argparse.Namespace) -> int:
    """The local control plane, NATS, the five services, a simulated cluster, example
    workloads from HAMi's and Volcano's vocabulary, and what became of each pod."""
    from tools import localcluster

    workdir = Path(args.dir).resolve()
    localcluster.stop_detached(workdir)
    started = time.monotonic()
    cluster = localcluster.LocalCluster(workdir=workdir, detach=True, real_node=args.real_node)
    cluster.start()
    state = json.loads((workdir / "state.json").read_text())
    cfg = dev_config(
        workdir / "tessera.yaml",
        state["nats"],
        state["kubeconfig"],
        scheduler={"names": ["tessera", "volcano", "hami-scheduler"]},
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs = spawn_services(workdir, cfg, Path(args.inventory).resolve(), new_session=True)
        hellos: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hellos = asyncio.run(_ping(cluster.nats_config(), 1.0))
            if {h["service"] for h in hellos} >= set(SERVICES):
                break
        alive = {str(h["service"]): h for h in hellos}
        print(
            f"\nTessera local cluster up in {time.monotonic() - started:.1f}s: "
            f"kube-apiserver {cluster.server}, nats {cluster.nats_url}"
        )
        print(
            "services: "
            + ", ".join(f"{s} {'alive' if s in alive else 'NOT ANSWERING'}" for s in SERVICES)
        )
        if set(alive) < set(SERVICES):
            return 1
        time.sleep(1.0)  # the simulated nodes register and report
        docs = [d for d in yaml.safe_load_all(Path(args.workloads).read_text()) if d]
        rows = asyncio.run(_demo_workloads(cluster.kubeconfig, docs))
        width = max(len(r[0]) for r in rows)
        print(f"\n{'POD':<{width}}  {'NODE':<14}  GRANT (or why it waits)")
        for name, node, text in rows:
            print(f"{name:<{width}}  {node:<14}  {text}")
        if args.real_node:
            procs.append(_demo_real_node(workdir, cluster, state))
        kubectl = localcluster.kubectl()
        print(f"\nkubectl: {kubectl} --kubeconfig {cluster.kubeconfig} get pods -o wide")
        if args.keep:
            (workdir / "services.pids").write_text("\n".join(str(p.pid) for p in procs))
            print(f"left running; stop with: tessera dev down --dir {workdir}")
            procs.clear()
        bound = sum(1 for r in rows if r[1] not in ("(pending)", "?"))
        return 0 if bound >= len(rows) - 2 else 1
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not args.keep:
            localcluster.stop_detached(workdir)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    runnable = {**SERVICES, "webhook": WEBHOOK, "dashboard": DASHBOARD}
    if argv and argv[0] in runnable:
        # The same entry as ``python -m services.<name>``: its __main__ module.
        sys.argv = [f"tessera {argv[0]}", *argv[1:]]
        runpy.run_module(runnable[argv[0]], run_name="__main__", alter_sys=True)
        return
    from tools import ops

    # Installed as kubectl-tessera, kubectl runs it for `kubectl tessera ...`.
    prog = "kubectl tessera" if Path(sys.argv[0]).name.startswith("kubectl-") else "tessera"
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.set_defaults(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    for service in SERVICES:
        sub.add_parser(service, help=f"run the {service} service")
    sub.add_parser("webhook", help="run the admission webhook")
    sub.add_parser("dashboard", help="serve the web dashboard")
    p = sub.add_parser("schema", help="write the events' JSON Schema")
    p.add_argument("--out", default=str(DEFAULT_SCHEMA))
    p.add_argument("--check", action="store_true", help="fail if the file is stale")
    p.set_defaults(func=cmd_schema)
    p = sub.add_parser("config", help="validate a config and print the effective one")
    p.add_argument("--file", default=None)
    p.add_argument("--hash", action="store_true")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("secrets", help="print fresh Secrets for a cluster (kubectl apply -f -)")
    p.add_argument("--namespace", default="tessera")
    p.set_defaults(func=cmd_secrets)
    p = sub.add_parser("nats-conf", help="write the manifests' nats.conf (shared/busauth.py)")
    p.add_argument("--out", default=str(DEFAULT_NATS_CONF))
    p.add_argument("--check", action="store_true", help="fail if the file is stale")
    p.set_defaults(func=cmd_nats_conf)
    p = sub.add_parser("dev", help="local control plane + NATS")
    p.add_argument("action", choices=["build", "up", "down", "status"])
    p.add_argument("--dir", default=os.environ.get("TESSERA_DEV_DIR", str(DEV_DIR)))
    p.add_argument("--scheduler", action="store_true", help="also run kube-scheduler")
    p.add_argument(
        "--real-node",
        action="store_true",
        help="also run kube-controller-manager and a real node (root: kubelet, containerd, runc)",
    )
    p.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="N nats-servers in a JetStream cluster (3: the stream kept 3 times)",
    )
    p.set_defaults(func=cmd_dev)
    p = sub.add_parser("ping", help="list services alive on the bus")
    _bus_options(p)
    p.add_argument("--wait", type=float, default=1.0)
    p.set_defaults(func=cmd_ping)
    p = sub.add_parser("get", help="nodes, devices, queues (live views) or Volcano jobs")
    p.add_argument("kind", choices=sorted(ops.KINDS), metavar="nodes|devices|queues|jobs")
    p.add_argument("-o", "--output", choices=["wide", "json", "yaml"], default=None)
    p.add_argument("--node", action="append", help="only this node (repeat for more)")
    p.add_argument("--gangs", action="store_true", help="queues: only the waiting gangs")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="jobs: every namespace")
    _bus_options(p)
    _kube_options(p)
    p.set_defaults(func=cmd_get)
    p = sub.add_parser("explain", help="why a pod waits: every node's reasons, what would fit")
    p.add_argument("kind", choices=["pod", "po", "pods"])
    p.add_argument("target", metavar="NS/NAME", help="the pod (NAME alone: -n or the context's)")
    p.add_argument("-o", "--output", choices=["json", "yaml"], default=None)
    p.add_argument("--all", action="store_true", help=f"every node (else {ops.EXPLAIN_NODES})")
    p.add_argument("--timeout", type=float, default=ops.VIEW_TIMEOUT_S, metavar="S")
    _bus_options(p)
    _kube_options(p)
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser("top", help="devices, queues and totals, redrawn live")
    p.add_argument("--interval", type=float, default=2.0, metavar="S")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("-o", "--output", choices=["wide"], default=None)
    _bus_options(p)
    p.set_defaults(func=cmd_top)
    p = sub.add_parser("demo", help="schedule example workloads on a local simulated cluster")
    p.add_argument("--keep", action="store_true", help="leave it running")
    p.add_argument("--inventory", default=str(EXAMPLES / "inventory/demo.yaml"))
    p.add_argument("--workloads", default=str(EXAMPLES / "workloads/demo.yaml"))
    p.add_argument("--dir", default=os.environ.get("TESSERA_DEV_DIR", str(DEV_DIR)))
    p.add_argument(
        "--real-node",
        action="store_true",
        help="also a real node (root: kubelet, containerd, runc) and a pod that prints its limits",
    )
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("inventory", help="print the devices this node's agent would report")
    p.add_argument("--source", default="nvml", help="nvml, ascend or file:INVENTORY[#NODE]")
    p.add_argument("--node", default=os.environ.get("NODE_NAME", "local"))
    p.add_argument("--config", default=None)
    p.set_defaults(func=cmd_inventory)
    args = parser.parse_args(argv)
    raise SystemExit(args.func(args))


if __name__ == "__main__":
    main()
