"""What a probe costs: `dspark-hub probe DRAFT --target T --threads 1` on the default prompt set, timed.

Usage:
    python bench/real_probe_time.py DRAFT [DRAFT ...] [--target T] [--runs N]

Each run is its own process (the CLI a user runs, imports and model loads included). The script prints, per
draft, the median over the runs of the wall time and of the CPU time the process used (user + system), the
load average beside them, and the probe's own split (the target's greedy paths, then the readings). On a
shared machine the wall time is the CPU time stretched by the other processes; the CPU time of a one-thread
run is what the wall time is on an idle core. The target defaults to .ci/real-target.sh's float32 folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORLD = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub")) / "smollm2-135m-instruct"


def one_run(draft: Path, target: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dspark_hub", "probe", str(draft), "--target", str(target),
                           "--threads", "1", "--json", "--quiet"], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        sys.exit(f"real_probe_time: {draft}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    doc = json.loads(done.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "probe_seconds": doc["seconds"], "anchors": doc["anchors"],
            "paths": doc["paths"], "verdicts": {c["key"]: c["verdict"] for c in doc["conventions"]},
            "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", type=Path, nargs="+")
    parser.add_argument("--target", type=Path, default=WORLD / "f32")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for draft in args.drafts:
        runs = [one_run(draft, args.target) for _ in range(args.runs)]
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        loads = ", ".join(f"{r['load']:.1f}" for r in runs)
        print(f"{draft}: wall {wall:.1f} s, CPU {cpu:.1f} s (median of {len(runs)}), {runs[0]['paths']} paths, "
              f"{runs[0]['anchors']} anchors, load average {loads}; verdicts {runs[0]['verdicts']}", flush=True)


if __name__ == "__main__":
    main()
