"""The architecture's rules hold: import-linter contracts from pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is a dev dependency: pip install -e '.[dev]'"
    proc = subprocess.run([lint], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_the_architecture_page_lists_what_each_service_consumes() -> None:
    """docs/architecture.md's table names exactly the events each service handles."""
    from services.binder.service import Binder
    from services.device_allocator.service import Allocator
    from services.gang_coordinator.service import Coordinator
    from services.job_controller.service import JobController
    from services.node_agent.service import NodeAgent
    from services.watcher.service import Watcher

    rows = {}
    for line in (REPO / "docs/architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("service", "---"):
            rows[cells[0]] = cells[2]
    for service in (Watcher, Coordinator, Allocator, Binder, JobController, NodeAgent):
        documented = rows[service.NAME].split(" (")[0]
        listed = {t.strip() for t in documented.split(",")} - {"(none)", ""}
        handled = {t.__struct_config__.tag for t in service.handled()}
        assert listed == handled, service.NAME
