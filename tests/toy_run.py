"""docs/training.md's toy run, run as written once a session (the `toy_run` fixture of tests/conftest.py).

tests/test_recipe.py checks what the block writes and prints, tests/test_docs_numbers.py checks the `eval` table
it prints against the one the docs show: two checks of one run (about 35 s on the 2-core machine), not two runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs_text import fenced_blocks, read, section


def toy_block() -> str:
    """The first ```bash block of docs/training.md's "Toy run" section."""
    ((_, block), *_) = fenced_blocks(section(read("docs/training.md"), "Toy run"), "bash")
    return block


@dataclass(frozen=True)
class ToyRun:
    """The folder the block ran in (it writes `toy/` there) and what it printed."""

    folder: Path
    stdout: str
    stderr: str


def run_toy_block(folder: Path) -> ToyRun:
    """The block in `folder` with `bash -e -o pipefail`, the installed `dspark-hub` first on PATH."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("dspark-hub", path=str(bin_dir)) is None:
        pytest.skip(f"no dspark-hub script beside {sys.executable} (install the package: pip install -e .)")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1",
           "COLUMNS": "120"}
    env.pop("OMP_NUM_THREADS", None)          # the block sets what it needs
    env.pop("DSPARK_DEBUG", None)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", toy_block()], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return ToyRun(folder, done.stdout, done.stderr)
