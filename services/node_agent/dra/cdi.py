"""A prepared claim as a CDI spec: the container edits the runtime applies for it.

One spec file per claim, ``<cdiDir>/<driver>-claim_<claim uid>.json``, holding one CDI
device named after the claim's UID, of kind ``<driver>/claim``: its edits are exactly
what the device plugin's ``Allocate`` hands a container for the same grant
(services/node_agent/isolation.py ``handout``: environment, mounts, device nodes), so a
container gets the same limits through either API. The file is written whole under
another name and renamed, so the runtime never reads half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from services.node_agent.isolation import DeviceNode, Handout, Mount

CDI_VERSION = "0.6.0"
CLASS = "claim"


def kind(driver: str) -> str:
    """The CDI kind of the driver's devices (``vendor/class``)."""
    return f"{driver}/{CLASS}"


def device_id(driver: str, claim_uid: str) -> str:
    """The fully qualified CDI device ID of a prepared claim, as the kubelet passes it on."""
    return f"{kind(driver)}={claim_uid}"


def spec_path(cdi_dir: Path, driver: str, claim_uid: str) -> Path:
    """Where a claim's spec is written."""
    return cdi_dir / f"{driver}-{CLASS}_{claim_uid}.json"


def container_edits(given: Handout) -> dict[str, Any]:
    """A hand-out as CDI ``containerEdits``: bind mounts read-only or read-write as the
    device plugin's are."""
    edits: dict[str, Any] = {}
    if given.envs:
        edits["env"] = [f"{k}={v}" for k, v in given.envs.items()]
    if given.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "type": "bind",
                "options": ["rbind", "rprivate", "ro" if m.read_only else "rw"],
            }
            for m in given.mounts
        ]
    if given.devices:
        edits["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in given.devices
        ]
    return edits


def claim_spec(driver: str, claim_uid: str, given: Handout) -> dict[str, Any]:
    """The CDI spec of one prepared claim."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind(driver),
        "devices": [{"name": claim_uid, "containerEdits": container_edits(given)}],
    }


def handout_of(spec: dict[str, Any]) -> Handout:
    """The hand-out a spec of :func:`claim_spec` carries (read back: tests, diagnostics)."""
    (device,) = spec["devices"]
    edits = device["containerEdits"]
    return Handout(
        envs=dict(e.split("=", 1) for e in edits.get("env", [])),
        mounts=[
            Mount(m["containerPath"], m["hostPath"], read_only="ro" in m["options"])
            for m in edits.get("mounts", [])
        ],
        devices=[
            DeviceNode(d["path"], d["hostPath"], d["permissions"])
            for d in edits.get("deviceNodes", [])
        ],
    )


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    """Write ``spec`` at ``path`` whole (a temporary name, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(spec, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def read_spec(path: Path) -> dict[str, Any] | None:
    """The spec at ``path``, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
