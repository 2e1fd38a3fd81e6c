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
