"""Start-up: `dspark-hub --help` against `hf --help`, and header-only `verify` of the full-size reference against
reading the same header with safetensors' `safe_open` (the peer of bench/bench_verify.py).

Usage: python bench/bench_startup.py [CHECKPOINT_DIR] [--rounds N]

Whole processes, as a user runs them: each round runs both commands of a pair, the order flipped every round so
neither always meets a warm cache, and prints their wall times, the ratio ours / peer and the load average; the
last lines give each pair's median ratio over the rounds (at least 5). Targets (issue 30): `--help` at most 0.25x
`hf --help`, header-only verify at most 0.1x the safe_open path. The console scripts are this virtualenv's; the
checkout is byte-compiled first, as an installed package is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _reference import DEFAULT_DIR, ROOT, env, reference_checkpoint

MIN_ROUNDS = 5
BIN = Path(sys.executable).parent
PEER = ("import sys\nfrom safetensors import safe_open\n"
        "with safe_open(sys.argv[1], framework='pt') as f:\n"
        "    names = list(f.keys()); meta = f.metadata()\n"
        "    shapes = [f.get_slice(n).get_shape() for n in names]\n"
        "print(len(names))\n")
TARGETS = {"--help": 0.25, "verify": 0.1}


def wall(argv: list[str]) -> float:
    """Seconds one whole process takes (its output thrown away)."""
    start = time.perf_counter()
    subprocess.run(argv, check=False, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def pairs(folder: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (ours, the peer)."""
    return {"--help": ([str(BIN / "dspark-hub"), "--help"], [str(BIN / "hf"), "--help"]),
            "verify": ([str(BIN / "dspark-hub"), "verify", str(folder)],
                       [sys.executable, "-c", PEER, str(folder / "model.safetensors")])}


def rounds(ours: list[str], peer: list[str], count: int) -> list[float]:
    """Per-round ratios ours / peer, the two run alternately; each round printed."""
    wall(ours), wall(peer)        # warm-up: the page cache and the interpreters' files
    ratios = []
    for number in range(count):
        order = [("ours", ours), ("peer", peer)][:: 1 if number % 2 == 0 else -1]
        seconds = {name: wall(argv) for name, argv in order}
        ratios.append(seconds["ours"] / seconds["peer"])
        print(f"  round {number + 1}: ours {seconds['ours']:.3f} s, peer {seconds['peer']:.3f} s, "
              f"ratio {ratios[-1]:.3f}, load average {os.getloadavg()[0]:.2f}", flush=True)
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_DIR,
                        help="the full-size reference checkpoint (made once if absent)")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    args = parser.parse_args(argv)
    if args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds: at least {MIN_ROUNDS}, so one disturbed round cannot decide the median")
    folder = reference_checkpoint(args.folder)
    # Byte-compiled, as an installed package is: with PYTHONDONTWRITEBYTECODE set (as on our machines) a checkout
    # would compile every module it imports on every run, which no installed dspark-hub (nor the peers) does.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "dspark_hub")], check=True, env=env())
    medians = {}
    for name, (ours, peer) in pairs(folder).items():
        print(f"{name}: {' '.join(ours[1:])} against {' '.join(Path(p).name for p in peer[:2])}", flush=True)
        ratios = rounds(ours, peer, args.rounds)
        medians[name] = statistics.median(ratios)
        print(f"{name}: median ratio {medians[name]:.3f} over {len(ratios)} rounds (min {min(ratios):.3f}, max "
              f"{max(ratios):.3f}); target <= {TARGETS[name]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
