"""Whole-process `dspark-hub verify --deep` vs `hashlib.sha256` streaming the same file alone (vs `sha256sum`).

Usage: python bench/bench_deep.py [CHECKPOINT_DIR] [--repeat N] [--no-sha256sum]

The full-size reference checkpoint (7.12 GB) is made with `dspark-hub init --profile kimi-k3`
if absent. The page cache is warmed first, then the commands run alternating (deep, hashlib,
sha256sum, deep, ...) `repeat` times (at least 5). Reported: the MEDIAN of each command's wall
and CPU times, and the median of the per-round ratios deep / hashlib (each round's two runs
are neighbours in time, so they saw about the same load), with the min and max. Targets: median
ratio <= 1.1, peak RSS of deep < 300 MB. The load average is printed with every round, because
other processes sharing the cores skew every number.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _reference import DEFAULT_DIR, env, reference_checkpoint, warm

HASHLIB_ALONE = ("import hashlib, sys\n"
                 "h = hashlib.sha256(); buf = bytearray(16 << 20); view = memoryview(buf)\n"
                 "with open(sys.argv[1], 'rb', buffering=0) as f:\n"
                 "    while n := f.readinto(buf):\n"
                 "        h.update(view[:n])\n"
                 "print(h.hexdigest())\n")
MIN_REPEAT = 5
DEEP, ALONE, SUM = "dspark-hub verify --deep", "hashlib.sha256 alone", "sha256sum"


def run(argv: list[str]) -> tuple[float, int, float, str]:
    """Wall seconds, peak RSS (bytes), CPU seconds (user + system) and stdout of one child process.

    RSS comes from `/usr/bin/time -f %M` when present: `wait4`'s ru_maxrss would include the
    parent's pages the child inherited before exec.
    """
    with tempfile.NamedTemporaryFile("w+") as rss, tempfile.TemporaryFile() as out:
        timed = ["/usr/bin/time", "-f", "%M %U %S", "-o", rss.name, *argv] if shutil.which("/usr/bin/time") else argv
        start = time.perf_counter()
        proc = subprocess.Popen(timed, env=env(), stdout=out, stderr=subprocess.DEVNULL)
        _, _, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        fields = Path(rss.name).read_text().split()[-3:] if timed is not argv else []
        peak = int(fields[0]) * 1024 if fields else usage.ru_maxrss * 1024
        cpu = float(fields[1]) + float(fields[2]) if fields else usage.ru_utime + usage.ru_stime
        return wall, peak, cpu, out.read().decode()


def round_ratios(deep: list[float], alone: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-round wall ratios deep / alone (rounds alternate, so pairs share the load)."""
    ratios = [d / a for d, a in zip(deep, alone, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--repeat", type=int, default=MIN_REPEAT, help=f"alternating rounds (at least {MIN_REPEAT})")
    parser.add_argument("--no-sha256sum", dest="sha256sum", action="store_false", help="leave sha256sum out")
    args = parser.parse_args()
    if args.repeat < MIN_REPEAT:
        parser.error(f"--repeat: at least {MIN_REPEAT} rounds (a median of fewer says little under load)")
    folder = reference_checkpoint(args.folder)
    weights = folder / "model.safetensors"
    warm(weights)
    commands = {DEEP: [sys.executable, "-m", "dspark_hub", "verify", str(folder), "--deep", "--json"],
                ALONE: [sys.executable, "-c", HASHLIB_ALONE, str(weights)]}
    if args.sha256sum:
        commands[SUM] = ["sha256sum", str(weights)]
    walls: dict[str, list[float]] = {label: [] for label in commands}
    cpus: dict[str, list[float]] = {label: [] for label in commands}
    rss: dict[str, int] = {}
    digests: dict[str, str] = {}
    loads: list[float] = []
    size = weights.stat().st_size
    print(f"checkpoint: {weights} ({size:,} bytes), {args.repeat} alternating rounds, warm page cache, "
          f"{os.cpu_count()} cores")
    for round_no in range(1, args.repeat + 1):
        load = os.getloadavg()[0]
        loads.append(load)
        for label, argv in commands.items():
            wall, peak, seconds, out = run(argv)
            walls[label].append(wall)
            cpus[label].append(seconds)
            rss[label] = max(rss.get(label, 0), peak)
            digests[label] = json.loads(out)["sections"]["deep"]["files"][0]["sha256"] if label == DEEP \
                else out.split()[0]
        print(f"round {round_no}: load {load:.2f}  " + "  ".join(
            f"{label.split()[0]} {walls[label][-1]:.2f} s" for label in commands)
            + f"  ratio {walls[DEEP][-1] / walls[ALONE][-1]:.3f}", flush=True)
    loads.append(os.getloadavg()[0])
    for label in commands:
        wall = statistics.median(walls[label])
        print(f"{label:28s} median {wall:7.2f} s  {size / wall / 1e9:5.2f} GB/s  "
              f"CPU {statistics.median(cpus[label]):6.2f} s  peak RSS {rss[label] / 2**20:6.0f} MiB")
    median, low, high = round_ratios(walls[DEEP], walls[ALONE])
    print(f"ratio deep / hashlib alone, median of {args.repeat} rounds: {median:.3f}  "
          f"(min {low:.3f}, max {high:.3f}; ratio of the medians "
          f"{statistics.median(walls[DEEP]) / statistics.median(walls[ALONE]):.3f}; target <= 1.1)")
    print(f"CPU ratio deep / hashlib alone: {statistics.median(cpus[DEEP]) / statistics.median(cpus[ALONE]):.3f}"
          "  (what the wall ratio tends to when other processes take every core)")
    if SUM in commands:
        print(f"ratio sha256sum / deep:     {statistics.median(walls[SUM]) / statistics.median(walls[DEEP]):.2f}")
    print(f"peak RSS of deep: {rss[DEEP] / 2**20:.0f} MiB  (target < 300 MB)")
    print(f"digests agree: {len(set(digests.values())) == 1} ({next(iter(digests.values()))})")
    print(f"load average (1 min) per round {', '.join(f'{x:.2f}' for x in loads[:-1])}; after {loads[-1]:.2f} "
          f"({'LOADED: other processes shared the cores' if max(loads) > 0.5 else 'idle'}; "
          f"{os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
