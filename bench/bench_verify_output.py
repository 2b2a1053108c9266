"""Human `dspark-hub verify` against `--json` on a header naming 120,000 extra tensors: whole processes, alternating.

Usage: python bench/bench_verify_output.py [FOLDER] [--extra N] [--repeat N] [--runtime all]

The checkpoint (a tiny conforming draft plus N one-element tensors the roster does not name) is made once
under FOLDER (default `$DSPARK_BENCH_DIR/extra-tensors`). Each round runs the human view and `--json` as
child processes, the order flipped every round, and records their wall and CPU time and how many bytes and
lines each printed. Reported: the median of the per-round wall ratios human / json (target: near 1; before
issue 29 the human view took 5-8x as long and printed 26 MB), its min and max, and the output sizes. The
load average is printed with every round: other processes sharing the cores skew every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _reference import env

MIN_REPEAT = 5
DEFAULT_DIR = Path(os.environ.get("DSPARK_BENCH_DIR", "/work/bench-data")) / "extra-tensors"


def extra_tensors_checkpoint(folder: Path, extra: int) -> Path:
    """A tiny conforming checkpoint whose header also names `extra` one-element BF16 tensors (made once)."""
    stamp = folder / f".extra-{extra}"
    if stamp.exists():
        return folder
    subprocess.run([sys.executable, "-m", "dspark_hub", "init", str(folder), "--force", "-q"], check=True, env=env())
    weights = folder / "model.safetensors"
    raw = weights.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    for i in range(extra):
        header[f"extra.{i}.weight"] = {"dtype": "BF16", "shape": [1], "data_offsets": [len(data) + 2 * i,
                                                                                       len(data) + 2 * i + 2]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    weights.write_bytes(struct.pack("<Q", len(text)) + text + data + b"\x00\x00" * extra)
    stamp.touch()
    return folder


def run(argv: list[str]) -> tuple[float, float, int, int]:
    """Wall and CPU seconds of one child process, and the bytes and lines it printed."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env(), stdout=out, stderr=subprocess.DEVNULL)
        _, _, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        printed = out.read()
    return wall, usage.ru_utime + usage.ru_stime, len(printed), printed.count(b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--extra", type=int, default=120_000, help="tensors the roster does not name")
    parser.add_argument("--repeat", type=int, default=MIN_REPEAT, help=f"alternating rounds (at least {MIN_REPEAT})")
    parser.add_argument("--runtime", default=None, help="also judge through this runtime's loader (e.g. all)")
    args = parser.parse_args()
    if args.repeat < MIN_REPEAT:
        parser.error(f"--repeat: at least {MIN_REPEAT} rounds (a median of fewer says little under load)")
    folder = extra_tensors_checkpoint(args.folder, args.extra)
    base = [sys.executable, "-m", "dspark_hub", "verify", str(folder), "-q",
            *(["--runtime", args.runtime] if args.runtime else [])]
    commands = {"human": base, "json": [*base, "--json"]}
    walls: dict[str, list[float]] = {label: [] for label in commands}
    cpus: dict[str, list[float]] = {label: [] for label in commands}
    sizes: dict[str, tuple[int, int]] = {}
    print(f"checkpoint: {folder} ({args.extra:,} extra tensors), {args.repeat} alternating rounds, "
          f"{os.cpu_count()} cores")
    for round_no in range(1, args.repeat + 1):
        load = os.getloadavg()[0]
        for label in list(commands)[:: 1 if round_no % 2 else -1]:
            wall, cpu, size, lines = run(commands[label])
            walls[label].append(wall)
            cpus[label].append(cpu)
            sizes[label] = (size, lines)
        print(f"round {round_no}: load {load:.2f}  human {walls['human'][-1]:.2f} s  json {walls['json'][-1]:.2f} s"
              f"  ratio {walls['human'][-1] / walls['json'][-1]:.3f}", flush=True)
    for label in commands:
        size, lines = sizes[label]
        print(f"{label:6s} median {statistics.median(walls[label]):7.2f} s  CPU {statistics.median(cpus[label]):6.2f} s"
              f"  printed {size:,} bytes in {lines:,} lines")
    ratios = [h / j for h, j in zip(walls["human"], walls["json"], strict=True)]
    print(f"ratio human / json, median of {args.repeat} rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
