"""A real Kubernetes node on this machine: containerd + runc + the pinned kubelet.

:class:`tools.localcluster.LocalCluster` starts one with ``real_node=True``, beside the
pinned kube-controller-manager. Everything a node needs comes from the project's own
sources, no registry and no download of a prebuilt binary:

- the kubelet and kube-controller-manager are built from ``tools/go.mod`` with the
  control plane (``localcluster.ensure_binaries``);
- containerd, its runc shim and ``ctr`` are ``go install``ed at :data:`CONTAINERD_VERSION`
  into ``.cache/containerd-<version>/bin``; ``runc`` is Debian's (``make realnode``
  installs it with ``busybox-static`` and the CNI plugins);
- two images are written here as OCI archives from ``/usr/bin/busybox`` and imported
  into containerd: :data:`BUSYBOX_IMAGE` for pods, and the sandbox image
  :data:`PAUSE_IMAGE` (busybox ``sleep``: containerd stops a sandbox with SIGKILL);
- pod networking is :data:`CNI_PLUGIN`: a network namespace per pod with ``lo`` and an
  ``eth0`` that is a bridge with no port, holding an address of 198.51.100.0/24 (RFC 5737,
  documentation only), so the node is Ready while no packet can leave a pod.

What this machine kind needs (docs/deploy.md "A real node" says why): the kubelet's
``failCgroupV1: false`` (a cgroup v1 host), containerd's ``restrict_oom_score_adj``
(negative OOM scores are refused even to root here), and the kubelet's fixed
directories: the device-plugin and plugin-registry folders are under
``/var/lib/kubelet`` whatever ``--root-dir`` says, so one real node runs per machine
at a time (:data:`LOCK_FILE`), and its root is :data:`KUBELET_ROOT`.

The kubelet signs in as ``system:node:<name>`` (a client certificate of the cluster's
CA, group ``system:nodes``) under the API server's Node authorizer and NodeRestriction;
the controller-manager as ``system:kube-controller-manager`` with one ServiceAccount per
controller (``--use-service-account-credentials``), as kubeadm sets them up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from shared import pki

if TYPE_CHECKING:
    from tools.localcluster import LocalCluster

CONTAINERD_VERSION = "v2.2.9"
"""containerd, its shim and ctr, built from the Go module proxy at this tag."""
_CONTAINERD_PACKAGES = {
    name: f"github.com/containerd/containerd/v2/cmd/{name}"
    for name in ("containerd", "containerd-shim-runc-v2", "ctr")
}
BUSYBOX_IMAGE = "tessera.local/busybox:1"
"""The image pods on the real node run: busybox and its applets, entrypoint ``sh``."""
PAUSE_IMAGE = "tessera.local/pause:1"
KUBELET_ROOT = Path("/var/lib/kubelet")
DEVICE_PLUGIN_DIR = KUBELET_ROOT / "device-plugins"
"""Fixed in the kubelet (not below ``--root-dir``): the node agent's sockets go here."""
PLUGIN_REGISTRY_DIR = KUBELET_ROOT / "plugins_registry"
POD_LOG_DIR = Path("/var/log/pods")
LOCK_FILE = Path("/run/tessera-real-node.lock")
NODE_LABEL = "tessera.io/real-node"
"""Every real node carries it (``true``): pipelines that reset the simulated nodes keep it."""
CNI_PLUGIN = "tessera-isolated"
NEEDED = {
    "runc": "runc",
    "busybox": "busybox-static",
    "ip": "iproute2",
    "nsenter": "util-linux",
}
"""Commands a real node needs on the PATH, and the Debian package of each."""


class NodeError(RuntimeError):
    """The real node cannot be built or started; the message says what to do."""


def unavailable() -> str | None:
    """Why a real node cannot run on this machine (None when it can)."""
    if os.name != "posix" or not Path("/proc/self/mountinfo").exists():
        return "a real node needs Linux"
    if os.geteuid() != 0:
        return "a real node needs root (runc, mounts, cgroups)"
    missing = [pkg for cmd, pkg in NEEDED.items() if shutil.which(cmd) is None]
    if missing:
        return f"missing Debian packages: {' '.join(sorted(set(missing)))} (make realnode)"
    if not Path("/usr/lib/cni/loopback").exists():
        return "missing Debian package containernetworking-plugins (make realnode)"
    return None


def runtime_bin_dir() -> Path:
    from tools.localcluster import REPO_ROOT

    return REPO_ROOT / ".cache" / f"containerd-{CONTAINERD_VERSION}" / "bin"


def ensure_runtime(*, quiet: bool = False) -> Path:
    """``go install`` containerd, its shim and ctr once; return their folder."""
    from tools.localcluster import ClusterError, _wait_showing

    target = runtime_bin_dir()
    missing = [n for n in _CONTAINERD_PACKAGES if not (target / n).is_file()]
    if not missing:
        return target
    go = shutil.which("go")
    if go is None:
        raise ClusterError(f"building containerd {CONTAINERD_VERSION} needs Go on PATH")
    target.mkdir(parents=True, exist_ok=True)
    argv = [go, "install", "-trimpath", "-tags", "no_btrfs,no_devmapper,no_zfs"]
    argv += [f"{_CONTAINERD_PACKAGES[n]}@{CONTAINERD_VERSION}" for n in missing]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GOBIN": str(target), "CGO_ENABLED": "0"},
    )
    stderr = _wait_showing(proc, f"building containerd {CONTAINERD_VERSION}", quiet=quiet)
    if proc.returncode != 0:
        raise ClusterError(f"go install of containerd failed:\n{stderr[-4000:]}")
    return target


# --- images -------------------------------------------------------------------------


def _blob(folder: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (folder / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _rootfs(busybox: Path) -> bytes:
    """One uncompressed layer: busybox with a link per applet in /bin, and /tmp."""
    applets = subprocess.run(
        [str(busybox), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in (("bin", 0o755), ("tmp", 0o1777), ("etc", 0o755)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in sorted(set(applets) - {"busybox"}):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        passwd = b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode = len(passwd), 0o644
        tar.addfile(info, io.BytesIO(passwd))
    return out.getvalue()


def write_image(path: Path, ref: str, layer: bytes, entrypoint: list[str]) -> None:
    """An OCI image archive of one layer, named ``ref`` for ``ctr images import``."""
    folder = path.with_suffix(".d")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "blobs" / "sha256").mkdir(parents=True)
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(folder, layer)}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(folder, json.dumps(config).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(folder, json.dumps(manifest).encode()),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                },
            }
        ],
    }
    (folder / "index.json").write_text(json.dumps(index))
    (folder / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    with tarfile.open(path, "w") as tar:
        for item in sorted(folder.rglob("*")):
            tar.add(item, arcname=str(item.relative_to(folder)), recursive=False)
    shutil.rmtree(folder)


def make_images(folder: Path) -> list[Path]:
    """The two image archives, made from this machine's ``busybox``."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise NodeError("no busybox on the PATH (apt-get install busybox-static)")
    folder.mkdir(parents=True, exist_ok=True)
    layer = _rootfs(Path(busybox).resolve())
    images = {
        "busybox.tar": (BUSYBOX_IMAGE, ["sh"]),
        "pause.tar": (PAUSE_IMAGE, ["sleep", "2147483647"]),
    }
    out = []
    for name, (ref, entrypoint) in images.items():
        write_image(folder / name, ref, layer, entrypoint)
        out.append(folder / name)
    return out


# --- configuration ------------------------------------------------------------------

_CNI_SCRIPT = r"""#!/bin/sh
# A pod network for Tessera's local real node (tools/realnode.py): lo up, and eth0, a
# bridge with no port (this kernel has no dummy links) holding one address of
# 198.51.100.0/24 (RFC 5737, documentation only): the runtime gets the interface and
# address it reports, and no packet can leave the pod.
set -eu
conf=$(cat)
version=$(printf '%s' "$conf" | sed -n 's/.*"cniVersion"[^"]*"\([^"]*\)".*/\1/p')
case "${CNI_COMMAND:-}" in
VERSION)
    echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}'
    exit 0 ;;
ADD) ;;
*) exit 0 ;;
esac
state=/run/tessera-cni
mkdir -p "$state"
exec 9>"$state/lock"
flock 9
n=$(cat "$state/next" 2>/dev/null || echo 2)
echo $(( n >= 254 ? 2 : n + 1 )) > "$state/next"
flock -u 9
ip=198.51.100.$n
nsenter --net="$CNI_NETNS" ip link set lo up
nsenter --net="$CNI_NETNS" ip link add "$CNI_IFNAME" type bridge
nsenter --net="$CNI_NETNS" ip addr add "$ip/24" dev "$CNI_IFNAME"
nsenter --net="$CNI_NETNS" ip link set "$CNI_IFNAME" up
printf '{"cniVersion":"%s","interfaces":[{"name":"%s","sandbox":"%s"}],' \
    "$version" "$CNI_IFNAME" "$CNI_NETNS"
printf '"ips":[{"address":"%s/24","interface":0}]}\n' "$ip"
"""


def containerd_config(workdir: Path, runtime_bins: Path) -> Path:
    """containerd's config (version 3) with everything under ``workdir``."""
    d = workdir / "containerd"
    cni_bin, cni_conf = d / "cni-bin", d / "cni-conf"
    cni_bin.mkdir(parents=True, exist_ok=True)
    cni_conf.mkdir(exist_ok=True)
    script = cni_bin / CNI_PLUGIN
    script.write_text(_CNI_SCRIPT)
    script.chmod(0o755)
    (cni_conf / "10-tessera.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "tessera", "plugins": [{"type": CNI_PLUGIN}]})
    )
    runc = shutil.which("runc") or "runc"
    text = f"""version = 3
root = "{d / "root"}"
state = "{d / "state"}"

[grpc]
  address = "{d / "containerd.sock"}"

[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{d / "cdi"}", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}", "/usr/lib/cni"]
    conf_dir = "{cni_conf}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
    path = d / "config.toml"
    path.write_text(text)
    return path


def kubelet_config(workdir: Path, ca: Path, runtime_socket: Path, ports: tuple[int, int]) -> Path:
    """The kubelet's KubeletConfiguration for this machine (module text says why)."""
    port, healthz = ports
    doc = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "registerNode": True,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "resolvConf": "",
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
    }
    path = workdir / "kubelet" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def signed_in(cluster: LocalCluster, user: str, group: str, folder: Path) -> Path:
    """A kubeconfig of ``cluster`` (in ``folder``) signing in as ``user`` in ``group``
    with a client certificate of the cluster's CA."""
    assert cluster.workdir is not None
    pki_dir = cluster.workdir / "pki"
    ca = pki.KeyPair((pki_dir / "ca.crt").read_bytes(), (pki_dir / "ca.key").read_bytes())
    pair = pki.issue(ca, user, hosts=[], days=30, client=True, organization=group)
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "client.crt", folder / "client.key"
    for path, data in ((cert, pair.cert), (key, pair.key)):
        path.write_bytes(data)
        path.chmod(0o600)
    kubeconfig = folder / "kubeconfig"
    cluster._kubeconfig(kubeconfig, user, {"client-certificate": str(cert), "client-key": str(key)})
    return kubeconfig


# --- the machine's one real node ----------------------------------------------------


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Every other process of the machine and its argv (those gone meanwhile left out)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        if words:
            yield int(entry.name), words


def running_kubelet() -> int | None:
    """The PID of a kubelet already running on this machine (None when there is none):
    its directories are fixed paths, so a second one would take its sockets."""
    from tools.localcluster import _alive

    return next(
        (pid for pid, argv in _processes() if Path(argv[0]).name == "kubelet" and _alive(pid)),
        None,
    )


@contextlib.contextmanager
def machine_lock(timeout_s: float = 600.0) -> Iterator[None]:
    """Start the machine's one real node: held while a node starts, and waits (up to
    ``timeout_s``) for a kubelet another cluster runs to go."""
    with LOCK_FILE.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            deadline = time.monotonic() + timeout_s
            while (pid := running_kubelet()) is not None:
                if time.monotonic() > deadline:
                    raise NodeError(
                        f"a kubelet already runs on this machine (PID {pid}): one real node "
                        "at a time (its device-plugin directory is a fixed path)"
                    )
                time.sleep(1.0)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mounts_below(root: Path) -> list[str]:
    """Mount points at or below ``root``, deepest first (from /proc/self/mountinfo)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_below(root: Path) -> None:
    """Unmount everything the kubelet or the runtime left at or below ``root``."""
    for point in mounts_below(root):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def kill_processes(match: Callable[[list[str]], bool]) -> None:
    """SIGKILL every process whose argv ``match`` accepts."""
    for pid, argv in _processes():
        if match(argv):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class Runtime:
    """``ctr`` against one containerd."""

    ctr: Path
    socket: Path

    def run(self, *args: str, check: bool = True) -> str:
        argv = [str(self.ctr), "--address", str(self.socket), "-n", "k8s.io", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise NodeError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout

    def import_image(self, archive: Path) -> None:
        self.run("images", "import", "--snapshotter", "overlayfs", str(archive))

    def kill_all(self) -> None:
        """Stop every container of the node (its pods outlive the kubelet otherwise)."""
        for line in self.run("tasks", "list", "-q", check=False).split():
            self.run("tasks", "kill", "-s", "SIGKILL", line, check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = self.run("tasks", "list", "-q", check=False).split()
            for task in left:
                self.run("tasks", "delete", "-f", task, check=False)
            if not left:
                break
            time.sleep(0.2)


def pod_logs(namespace: str, name: str, container: str) -> str:
    """What ``container`` of pod ``namespace/name`` printed, from the kubelet's log files
    (the API server cannot reach a kubelet that listens on loopback only)."""
    text = []
    for folder in sorted(POD_LOG_DIR.glob(f"{namespace}_{name}_*/{container}")):
        for log in sorted(folder.glob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                # CRI log format: <time> <stream> <P|F> <text>
                parts = line.split(" ", 3)
                text.append(parts[3] if len(parts) == 4 else "")
    return "\n".join(text)


def kill_pods_cgroups() -> None:
    """SIGKILL every process left in the kubelet's pod cgroups (``kubepods``), e.g. by
    a node whose runtime was killed; only one real node runs per machine."""
    for procs in Path("/sys/fs/cgroup").glob("*/kubepods/**/cgroup.procs"):
        with contextlib.suppress(OSError):
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _is_stale_runtime(argv: list[str]) -> bool:
    """A containerd shim or containerd of a local real node (never a system one)."""
    name = Path(argv[0]).name
    ours = any("tessera-" in w and "containerd" in w for w in argv)
    return name in ("containerd-shim-runc-v2", "containerd") and ours


NETNS_DIR = Path("/run/netns")


def clean_machine(workdir: Path | None = None) -> None:
    """What a real node may have left on the machine: its pods' processes, runtimes and
    shims, the pods' network namespaces, and the mounts below the kubelet's root (and
    below ``workdir``, the runtime's)."""
    kill_processes(_is_stale_runtime)
    kill_pods_cgroups()
    unmount_below(KUBELET_ROOT)
    for netns in NETNS_DIR.glob("cni-*"):
        subprocess.run(["umount", "-l", str(netns)], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            netns.unlink()
    if workdir is not None:
        unmount_below(workdir)


def start(cluster: LocalCluster, bins: Path) -> None:
    """containerd, the images and the kubelet of node ``cluster.node_name``; returns once
    the Node is Ready. The cluster's API server and controller-manager run already."""
    from tools.localcluster import ClusterError, _wait, free_port, kubectl

    why = unavailable()
    if why is not None:
        raise ClusterError(f"no real node here: {why}")
    assert cluster.workdir is not None
    workdir = cluster.workdir
    runtime_bins = ensure_runtime()
    with machine_lock():
        clean_machine()
        config = containerd_config(workdir, runtime_bins)
        socket = config.parent / "containerd.sock"
        path = f"{runtime_bins}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        proc = cluster._spawn(
            "containerd",
            [str(runtime_bins / "containerd"), "--config", str(config)],
            env={"PATH": path},
        )
        runtime = Runtime(runtime_bins / "ctr", socket)
        _wait(lambda: socket.exists() and _answers(runtime), proc, "containerd", timeout_s=60)
        for archive in make_images(workdir / "images"):
            runtime.import_image(archive)
        user = f"system:node:{cluster.node_name}"
        kubeconfig = signed_in(cluster, user, "system:nodes", workdir / "kubelet")
        ca = workdir / "pki" / "ca.crt"
        kconfig = kubelet_config(workdir, ca, socket, (free_port(), free_port()))
        proc = cluster._spawn(
            "kubelet",
            [
                str(bins / "kubelet"),
                f"--config={kconfig}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={KUBELET_ROOT}",
                f"--hostname-override={cluster.node_name}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=2",
            ],
            env={"PATH": path},
        )
        _wait(lambda: cluster.node_ready(cluster.node_name), proc, "kubelet", timeout_s=120)
        # The kubelet registers its Node with the not-ready taint; the node lifecycle
        # controller, off here (start_controller_manager says why), would lift it now.
        subprocess.run(
            [
                kubectl(),
                "--kubeconfig",
                str(cluster.kubeconfig),
                "taint",
                "node",
                cluster.node_name,
                "node.kubernetes.io/not-ready:NoSchedule-",
            ],
            check=True,
            capture_output=True,
        )


def _answers(runtime: Runtime) -> bool:
    try:
        runtime.run("version")
    except (NodeError, subprocess.TimeoutExpired):
        return False
    return True


def stop_pods(workdir: Path) -> None:
    """Stop every container of the node through its containerd (while it runs)."""
    socket = workdir / "containerd" / "containerd.sock"
    if socket.exists():
        runtime = Runtime(runtime_bin_dir() / "ctr", socket)
        with contextlib.suppress(NodeError, subprocess.TimeoutExpired, OSError):
            runtime.kill_all()


def start_controller_manager(cluster: LocalCluster, bins: Path) -> None:
    """The pinned kube-controller-manager, signed in as ``system:kube-controller-manager``
    with one ServiceAccount per controller. The node lifecycle controller is off: the
    local cluster's simulated nodes have no kubelet posting their status, and it would
    taint them unreachable."""
    from tools.localcluster import _http_ok, _wait, free_port

    assert cluster.workdir is not None
    pki_dir = cluster.workdir / "pki"
    user = "system:kube-controller-manager"
    kubeconfig = signed_in(cluster, user, "", cluster.workdir / "controller-manager")
    port = free_port()
    proc = cluster._spawn(
        "kube-controller-manager",
        [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki_dir / 'sa.key'}",
            f"--root-ca-file={pki_dir / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki_dir / 'ca.crt'}",
            f"--cluster-signing-key-file={pki_dir / 'ca.key'}",
            "--controllers=*,-node-lifecycle-controller",
        ],
    )
    _wait(
        lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", insecure=True),
        proc,
        "kube-controller-manager",
        timeout_s=60,
    )
