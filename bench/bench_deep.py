"""Whole-process `dspark-hub verify --deep` vs `hashlib.sha256` streaming the same file alone vs `sha256sum`.

Usage: python bench/bench_deep.py [CHECKPOINT_DIR] [--repeat N]

The full-size reference checkpoint (7.12 GB) is made with `dspark-hub init --profile kimi-k3`
if absent. The page cache is warmed first, then the three commands run interleaved `repeat`
times; the best wall time of each is reported. Targets: deep <= 1.1x hashlib alone (the
statistics pass hides behind the hash), peak RSS of deep < 300 MB. The load average is printed
because other processes sharing the cores skew every number.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = reference_checkpoint(args.folder)
    weights = folder / "model.safetensors"
    warm(weights)
    commands = {
        "dspark-hub verify --deep": [sys.executable, "-m", "dspark_hub", "verify", str(folder), "--deep", "--json"],
        "hashlib.sha256 alone": [sys.executable, "-c", HASHLIB_ALONE, str(weights)],
        "sha256sum": ["sha256sum", str(weights)],
    }
    load_before = os.getloadavg()
    best: dict[str, float] = {}
    rss: dict[str, int] = {}
    cpu: dict[str, float] = {}
    digests: dict[str, str] = {}
    for _ in range(args.repeat):
        for label, argv in commands.items():
            wall, peak, seconds, out = run(argv)
            best[label] = min(best.get(label, float("inf")), wall)
            cpu[label] = min(cpu.get(label, float("inf")), seconds)
            rss[label] = max(rss.get(label, 0), peak)
            digests[label] = (json.loads(out)["sections"]["deep"]["files"][0]["sha256"]
                              if label.startswith("dspark") else out.split()[0])
    load_after = os.getloadavg()
    size = weights.stat().st_size
    print(f"checkpoint: {weights} ({size:,} bytes), best of {args.repeat}, warm page cache, {os.cpu_count()} cores")
    for label in commands:
        print(f"{label:28s} {best[label]:7.2f} s  {size / best[label] / 1e9:5.2f} GB/s  "
              f"CPU {cpu[label]:6.2f} s  peak RSS {rss[label] / 2**20:6.0f} MiB")
    deep, alone = best["dspark-hub verify --deep"], best["hashlib.sha256 alone"]
    print(f"ratio deep / hashlib alone: {deep / alone:.3f}  (target <= 1.1)")
    print(f"CPU ratio deep / hashlib alone: {cpu['dspark-hub verify --deep'] / cpu['hashlib.sha256 alone']:.3f}"
          "  (what the wall ratio tends to when other processes take every core)")
    print(f"ratio sha256sum / deep:     {best['sha256sum'] / deep:.2f}")
    print(f"peak RSS of deep: {rss['dspark-hub verify --deep'] / 2**20:.0f} MiB  (target < 300 MB)")
    print(f"digests agree: {len(set(digests.values())) == 1} ({next(iter(digests.values()))})")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({'LOADED: other processes shared the cores' if max(load_before[0], load_after[0]) > 0.5 else 'idle'})")


if __name__ == "__main__":
    main()
