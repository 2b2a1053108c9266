"""Shared bench helpers: the full-size reference checkpoint (made once) and process timing."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = Path(os.environ.get("DSPARK_BENCH_DIR", "/work/bench-data")) / "kimi-k3"


def env() -> dict[str, str]:
    """The environment for child processes: this checkout importable, no colour."""
    e = dict(os.environ, NO_COLOR="1")
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), e.get("PYTHONPATH", "")]))
    return e


def reference_checkpoint(folder: Path = DEFAULT_DIR) -> Path:
    """The full-size (7.12 GB) reference-shaped checkpoint, created with `dspark-hub init` if absent."""
    if not (folder / "model.safetensors").exists():
        print(f"creating the full-size reference checkpoint in {folder} (once, a few minutes) ...", flush=True)
        subprocess.run([sys.executable, "-m", "dspark_hub", "init", str(folder), "--profile", "kimi-k3", "-q"],
                       check=True, env=env())
    return folder


def time_process(argv: list[str], *, repeat: int = 5) -> tuple[float, int]:
    """Best wall time (s) over `repeat` runs and the peak RSS (bytes) of the child processes."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=False, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return best, peak


def warm(path: Path) -> None:
    """Read a file once so timings compare warm page cache with warm page cache."""
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
