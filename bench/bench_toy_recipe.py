"""Wall time of the README's toy training recipe ("### Toy run", its first ```bash block), as written.

Usage: python bench/bench_toy_recipe.py [--repeat N]

Runs the block `repeat` times (default 3), each in a fresh temporary folder with the `dspark-hub`
script beside this interpreter on PATH, and reports every run's wall time with the load average
before it, then the MEDIAN. The README says the recipe takes under two minutes on two shared cores;
this is where that number is measured (tests/test_recipe.py checks what the recipe produces, never
how long it took: a busy machine must not turn a correct recipe red).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the README promises for the toy recipe, on two shared cores.
PROMISED_SECONDS = 120


def toy_block(readme: str) -> str:
    """The first ```bash block of the README's "### Toy run" section."""
    section = re.search(r"^### Toy run[^\n]*\n(.*?)(?=^## |^### )", readme, flags=re.M | re.S)
    block = re.search(r"^```bash\n(.*?)^```", section.group(1), flags=re.M | re.S) if section else None
    if block is None:
        raise SystemExit("bench_toy_recipe: the README has no '### Toy run' section with a ```bash block")
    return block.group(1)


def run_once(block: str) -> float:
    """Wall seconds of one run of the block in a fresh folder (exits 1 when the recipe fails)."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    env.pop("OMP_NUM_THREADS", None)          # the block sets what it needs
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=folder, env=env,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench_toy_recipe: the recipe failed:\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("dspark-hub", path=str(Path(sys.executable).parent)) is None:
        raise SystemExit(f"bench_toy_recipe: no dspark-hub script beside {sys.executable}; pip install -e .")
    block = toy_block((ROOT / "README.md").read_text())
    times = []
    for i in range(args.repeat):
        load = os.getloadavg()[0]
        times.append(run_once(block))
        print(f"run {i + 1}: {times[-1]:.1f} s (load before: {load:.1f})", flush=True)
    median = statistics.median(times)
    print(f"toy recipe: median {median:.1f} s of {len(times)} runs, {os.cpu_count()} cores "
          f"(README: under {PROMISED_SECONDS} s on two shared cores)")


if __name__ == "__main__":
    main()
