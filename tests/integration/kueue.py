"""Kueue's own manager against the local API server, for tests/integration/test_kueue.py.

Opt-in (``TESSERA_KUEUE=1``): ``sigs.k8s.io/kueue/cmd/kueue`` at ``VERSION`` is built
once from the Go module proxy into ``.cache/kueue-<VERSION>/`` (about 5 minutes on 2
cores), and its CRDs are read from the same module. It runs with only its ``pod``
integration, for namespaces labelled ``LABEL``, and its webhooks (pods, and its own
kinds) are reached by URL on loopback with a certificate of ours, as
tests/integration/test_webhook.py reaches Tessera's: a webhook configuration left behind
never touches another test's pods, and both are deleted when it stops.

Kueue's manager reads its metrics certificate from a fixed ``/etc/kueue/metrics/certs``
when its own certificate management is off (and with it on, it issues a certificate for
its Service's DNS name, which nothing resolves here): it runs in a mount namespace of
its own, with an overlay over ``/etc`` holding our certificate there. That needs root
and ``unshare``; ``unavailable()`` says why it cannot run.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from shared import pki
from tests.integration.pipeline import REPO
from tools import localcluster

VERSION = "v0.17.0"
MODULE = "sigs.k8s.io/kueue"
OPT_IN = "TESSERA_KUEUE"
LABEL = {"tessera.io/kueue-test": "on"}
"""The namespaces Kueue manages here (its pod webhook and ``managedJobsNamespaceSelector``)."""
WEBHOOKS = "tessera-test-kueue"
"""The name of the webhook configurations made here (one mutating, one validating)."""
READY_S = 60.0


def unavailable() -> str | None:
    """Why Kueue's manager cannot run here, or None."""
    if os.environ.get(OPT_IN) != "1":
        return (
            f"Kueue's own manager is opt-in: {OPT_IN}=1 builds {MODULE}/cmd/kueue@{VERSION} "
            "from the Go module proxy (about 5 minutes, once) and runs it"
        )
    if shutil.which("go") is None:
        return "Kueue is built from the Go module proxy: Go is not on PATH"
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return (
            "Kueue's manager reads its metrics certificate from /etc/kueue/metrics/certs: "
            "it runs in a mount namespace of its own, which needs root and unshare"
        )
    return None


def _go(*args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["go", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",  # outside any module: the proxy's release, not a replace of ours
        env={**os.environ, **(env or {})},
        timeout=1200,
    )
    if proc.returncode != 0:
        raise localcluster.ClusterError(f"go {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return proc.stdout


def ensure_built() -> tuple[Path, Path]:
    """Kueue's manager binary (built once) and the module's folder (its CRDs)."""
    binary = REPO / ".cache" / f"kueue-{VERSION}" / "kueue"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        _go("install", f"{MODULE}/cmd/kueue@{VERSION}", env={"GOBIN": str(binary.parent)})
    source = Path(json.loads(_go("mod", "download", "-json", f"{MODULE}@{VERSION}"))["Dir"])
    return binary, source


def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> None:
    proc = subprocess.run(
        [localcluster.kubectl(), "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise localcluster.ClusterError(f"kubectl {' '.join(args[:2])}: {proc.stderr[-2000:]}")


def _install_crds(kubeconfig: Path, source: Path) -> None:
    bases = source / "config" / "components" / "crd" / "bases"
    _kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(bases))
    # kueue.x-k8s.io_workloads.yaml defines workloads.kueue.x-k8s.io
    names = [f"crd/{'.'.join(reversed(f.stem.split('_', 1)))}" for f in bases.glob("*.yaml")]
    deadline = time.monotonic() + READY_S
    while True:  # a CRD just made has no conditions yet: kubectl wait refuses it
        try:
            _kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", *names)
            return
        except localcluster.ClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _webhooks(source: Path, port: int, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for pods and its own kinds, by URL on loopback;
    the pod webhooks only for namespaces labelled ``LABEL``."""
    manifests = source / "config" / "components" / "webhook" / "manifests.yaml"
    docs = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    for doc in docs:
        doc["metadata"] = {"name": WEBHOOKS}
        kept = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            pods = path.endswith("--v1-pod")
            if not pods and "-kueue-x-k8s-io-" not in path:
                continue  # Jobs, Deployments, Ray...: integrations not run here
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
            if pods:
                hook["namespaceSelector"] = {"matchLabels": LABEL}
            kept.append(hook)
        doc["webhooks"] = kept
    return docs


def _ready(port: int) -> bool:
    with (
        contextlib.suppress(OSError),  # urllib's errors too: not listening yet
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer,
    ):
        return bool(answer.status == 200)
    return False


@contextlib.contextmanager
def running(kubeconfig: Path, workdir: Path) -> Iterator[Path]:
    """Kueue's manager with its CRDs and webhooks until the block ends; yields its log."""
    binary, source = ensure_built()
    _install_crds(kubeconfig, source)
    ca = pki.new_ca("kueue-test-ca", days=1)
    serving = pki.issue(ca, "kueue-webhook", hosts=["127.0.0.1"], days=1)
    certs = workdir / "certs"
    certs.mkdir(parents=True)
    (certs / "tls.crt").write_bytes(serving.cert)
    (certs / "tls.key").write_bytes(serving.key)
    port, health = localcluster.free_port(), localcluster.free_port()
    config = workdir / "kueue.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
                "metrics": {"bindAddress": "0"},
                "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "managedJobsNamespaceSelector": {"matchLabels": LABEL},
                "integrations": {"frameworks": ["pod"]},
            }
        )
    )
    etc = workdir / "etc"
    (etc / "upper").mkdir(parents=True)
    (etc / "work").mkdir()
    script = (
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={etc}/upper,workdir={etc}/work"
        f" /etc && mkdir -p /etc/kueue/metrics/certs && cp {certs}/tls.crt {certs}/tls.key"
        f" /etc/kueue/metrics/certs/ && exec {binary} --config {config}"
        f" --kubeconfig {kubeconfig} --feature-gates=VisibilityOnDemand=false"
    )
    log = workdir / "kueue.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + READY_S
        while not _ready(health):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise localcluster.ClusterError(f"Kueue's manager did not start:\n{tail}")
            time.sleep(0.2)
        _kubectl(
            kubeconfig,
            "apply",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(_webhooks(source, port, ca.cert)),
        )
        yield log
    finally:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            with contextlib.suppress(localcluster.ClusterError):
                _kubectl(kubeconfig, "delete", kind, WEBHOOKS, "--ignore-not-found")
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
